package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// activeSleeps counts, on every harness node in use, the queries still
// running pg_sleep other than the caller's.
func activeSleeps(t *testing.T, nodes int) int {
	t.Helper()
	n := 0
	for i := 0; i < nodes; i++ {
		c := connect(t, testNodeDSN(t, i))
		var k int
		if err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		c.Close(context.Background())
		n += k
	}
	return n
}

// waitNoSleeps waits until no node runs a pg_sleep query any more.
func waitNoSleeps(t *testing.T, nodes int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for activeSleeps(t, nodes) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a node still runs the cancelled statement")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMaxClients: past --max-clients a client gets 53300 and the clients
// already connected keep working; a freed place is taken again.
func TestMaxClients(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--max-clients", "2")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	b := connect(t, p.DSN("lattice"))
	_, err := pgx.Connect(ctx, p.DSN("lattice"))
	if code := pgCode(err); code != "53300" {
		t.Fatalf("third client over --max-clients 2: %v, want 53300", err)
	}
	for _, c := range []*pgx.Conn{a, b} {
		var n int
		if err := c.QueryRow(ctx, `SELECT 1`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("a client under the limit: %v", err)
		}
	}
	a.Close(ctx)
	// The proxy notices the closed socket asynchronously.
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := pgx.Connect(ctx, p.DSN("lattice"))
		if err == nil {
			c.Close(ctx)
			break
		}
		if pgCode(err) != "53300" || time.Now().After(deadline) {
			t.Fatalf("connect after a client left: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStartupTimeout: a TCP connection that sends nothing (or stops in the
// middle of its startup) is closed after --startup-timeout, counts against
// --max-clients only until then, and other sessions keep working meanwhile.
func TestStartupTimeout(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--startup-timeout", "1s", "--max-clients", "2")
	tests := []struct {
		name string
		send []byte
	}{
		{"nothing", nil},
		{"half a startup packet", []byte{0, 0, 0, 40, 0, 3, 0, 0}},
		{"SSLRequest then nothing", []byte{0, 0, 0, 8, 4, 210, 22, 47}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			silent, err := net.Dial("tcp", p.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer silent.Close()
			if _, err := silent.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			// A real client connects and queries while the silent one waits.
			c := connect(t, p.DSN("lattice"))
			var n int
			if err := c.QueryRow(context.Background(), `SELECT 1`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("client beside a silent connection: %v", err)
			}
			c.Close(context.Background())
			// The generous deadline only stops a hung test: the proxy must
			// close the connection (EOF), not leave it to this deadline.
			silent.SetReadDeadline(time.Now().Add(30 * time.Second))
			got, err := io.ReadAll(silent)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the proxy did not close a silent connection")
			}
			if tt.name == "SSLRequest then nothing" {
				got = []byte(strings.TrimPrefix(string(got), "N"))
			}
			if len(got) != 0 {
				t.Errorf("the proxy sent a silent client %q", got)
			}
		})
	}
}

// TestStatementTimeout: the proxy's --statement-timeout and a client's own
// SET statement_timeout end single-shard and fan-out statements with 57014,
// every node's query is cancelled, and the session goes on.
func TestStatementTimeout(t *testing.T) {
	resetNodes(t)
	withDefault := startProxy(t, 3, "--statement-timeout", "500ms")
	plain := startProxy(t, 3)
	setup := connect(t, plain.DSN("lattice"))
	setupCatalogue(t, setup, 60)

	const (
		single = `SELECT pg_sleep(30) FROM catalogue WHERE sku = 'sku1'`
		fanout = `SELECT sku, pg_sleep(30) FROM catalogue ORDER BY qty`
		agg    = `SELECT count(*) FROM catalogue WHERE pg_sleep(30) IS NOT NULL`
	)
	tests := []struct {
		name   string
		proxy  *proxyProc
		set    string // run first in the session
		sql    string
		simple bool
	}{
		{"default, single shard", withDefault, "", single, false},
		{"default, fan-out merge", withDefault, "", fanout, false},
		{"default, fan-out merge, simple protocol", withDefault, "", fanout, true},
		{"default, fan-out aggregate", withDefault, "", agg, false},
		{"client SET, single shard", plain, "SET statement_timeout = '300ms'", single, false},
		{"client SET, fan-out merge", plain, "SET statement_timeout TO 300", fanout, false},
		{"client SET, fan-out aggregate, simple protocol", plain, "SET statement_timeout = '0.3s'", agg, true},
		{"client SET over the default", withDefault, "SET statement_timeout = '200ms'", fanout, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c := connect(t, tt.proxy.DSN("lattice"))
			if tt.set != "" {
				mustExec(t, c, tt.set)
			}
			mode := pgx.QueryExecModeCacheStatement
			if tt.simple {
				mode = pgx.QueryExecModeSimpleProtocol
			}
			_, err := c.Exec(ctx, tt.sql, mode)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "57014" || !strings.Contains(pe.Message, "statement timeout") {
				t.Fatalf("%s: %v, want 57014 canceling statement due to statement timeout", tt.sql, err)
			}
			waitNoSleeps(t, 3)
			// The session goes on. Its timeout is lifted first: under make
			// test's load a fan-out count took over the 300 ms one.
			if _, err := c.Exec(ctx, `SET statement_timeout = 0`); err != nil {
				t.Fatalf("session after the timeout: %v", err)
			}
			var n int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM catalogue`).Scan(&n); err != nil || n != 60 {
				t.Fatalf("session after the timeout: %d, %v", n, err)
			}
		})
	}

	// SET statement_timeout = 0 lifts the proxy's default for the session,
	// and RESET brings it back.
	c := connect(t, withDefault.DSN("lattice"))
	mustExec(t, c, `SET statement_timeout = 0`)
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM catalogue WHERE pg_sleep(0.02) IS NOT NULL`).Scan(&n); err != nil || n != 60 {
		t.Fatalf("with statement_timeout 0: %d, %v", n, err)
	}
	mustExec(t, c, `RESET statement_timeout`)
	var got string
	if err := c.QueryRow(context.Background(), `SHOW statement_timeout`).Scan(&got); err != nil || got != "500ms" {
		t.Fatalf("statement_timeout after RESET: %q, %v", got, err)
	}
}

// TestMergeMemory: a k-way merge whose held rows exceed --max-merge-memory
// fails with 53200 and a hint, and so do rows gathered for windows,
// aggregates or set operations in the final step (54000), while results that stream (no ORDER BY) or
// aggregate (partials spill to a node) are unaffected by the bound.
func TestMergeMemory(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--max-merge-memory", "64kB")
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE wide (id bigint PRIMARY KEY, pad text NOT NULL)`)
	// 30 rows of 40 kB: two of them already pass the bound.
	mustExec(t, c, `INSERT INTO wide SELECT i, repeat(md5(i::text), 1280) FROM generate_series(1, 30) i`)
	mustExec(t, c, `SELECT lattice_create_tree('wide', 'id', shard_count => 6)`)
	mustExec(t, c, `CREATE TABLE many (id bigint PRIMARY KEY, g bigint NOT NULL)`)
	mustExec(t, c, `INSERT INTO many SELECT i, i FROM generate_series(1, 20000) i`)
	mustExec(t, c, `SELECT lattice_create_tree('many', 'id', shard_count => 6)`)

	tests := []struct {
		name string
		sql  string
		code string // "" for success
		rows int
	}{
		{"ordered merge of wide rows", `SELECT id, pad FROM wide ORDER BY id`, "53200", 0},
		{"ordered merge of narrow rows", `SELECT id, length(pad) FROM wide ORDER BY id`, "", 30},
		{"unordered wide rows stream", `SELECT id, pad FROM wide`, "", 30},
		{"group by with partials beyond the bound", `SELECT g, count(*) FROM many GROUP BY g`, "", 20000},
		{"window over gathered wide rows", `SELECT id, length(pad), rank() OVER (ORDER BY pad) FROM wide`, "54000", 0},
		{"window over gathered narrow rows", `SELECT id, rank() OVER (ORDER BY length(pad), id) FROM wide`, "", 30},
		{"aggregate over gathered wide rows", `SELECT length(string_agg(pad, ',')) FROM wide`, "54000", 0},
		{"aggregate over gathered narrow rows", `SELECT g % 10, count(*) FILTER (WHERE g > 100) FROM many GROUP BY 1`, "", 10},
		{"set operation over gathered wide rows", `SELECT pad FROM wide UNION SELECT pad FROM wide WHERE id < 3`, "54000", 0},
		{"set operation over gathered narrow rows", `SELECT length(pad) FROM wide EXCEPT ALL SELECT id FROM wide WHERE id > 100`, "", 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			rows, err := c.Query(ctx, tt.sql)
			n := 0
			if err == nil {
				for rows.Next() {
					n++
				}
				rows.Close()
				err = rows.Err()
			}
			if tt.code != "" {
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != tt.code || !strings.Contains(pe.Hint, "--max-merge-memory") {
					t.Fatalf("%v, want %s with a hint naming --max-merge-memory", err, tt.code)
				}
			} else if err != nil || n != tt.rows {
				t.Fatalf("%d rows, %v; want %d", n, err, tt.rows)
			}
			var k int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM wide`).Scan(&k); err != nil || k != 30 {
				t.Fatalf("session afterwards: %d, %v", k, err)
			}
		})
	}
}
