package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestDDLDuringReshard checks that DDL and TRUNCATE on a tree are refused
// with 55000 while a reshard of it runs (a shadow copy's target would end
// up differing from its source), and run once the reshard is complete, with
// the template and every shard table, the new ones included, alike.
func TestDDLDuringReshard(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := startProxy(t, 3)
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		"CREATE TABLE reshddl (k text PRIMARY KEY, v int)",
		"INSERT INTO reshddl SELECT 'k' || g, g FROM generate_series(1, 2000) g",
		"SELECT lattice_create_tree('reshddl', 'k', shard_count => 2)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	// A transaction with an xid on every node holds the reshard in its
	// copy phase: creating a migration's logical slot waits for it.
	var nodes []*pgx.Conn
	var blockers []pgx.Tx
	for i := range 3 {
		c, err := pgx.Connect(ctx, testNodeDSN(t, i))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		nodes = append(nodes, c)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT txid_current()"); err != nil {
			t.Fatal(err)
		}
		blockers = append(blockers, tx)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('reshddl', 4)"); err != nil {
		t.Fatal(err)
	}

	stmts := []struct{ name, sql string }{
		{"alter table add column", "ALTER TABLE reshddl ADD COLUMN extra int"},
		{"create index", "CREATE INDEX reshddl_v ON reshddl (v)"},
		{"create index concurrently", "CREATE INDEX CONCURRENTLY reshddl_extra ON reshddl (extra)"},
		{"cluster using", "CLUSTER reshddl USING reshddl_pkey"},
		{"truncate", "TRUNCATE reshddl"},
	}
	for _, s := range stmts {
		t.Run("during/"+s.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, s.sql)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "55000" {
				t.Fatalf("got %v, want SQLSTATE 55000", err)
			}
			if !strings.Contains(pgErr.Hint, "lattice_reshard_complete") {
				t.Errorf("hint %q does not say to wait for lattice_reshard_complete", pgErr.Hint)
			}
		})
	}
	var complete bool
	if err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete('reshddl')").Scan(&complete); err != nil {
		t.Fatal(err)
	}
	if complete {
		t.Fatal("the reshard completed while the blockers were open: the refusals above prove nothing")
	}

	for _, tx := range blockers {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for !complete {
		select {
		case <-ctx.Done():
			t.Fatal("the reshard did not complete")
		case <-time.After(100 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete('reshddl')").Scan(&complete); err != nil {
			t.Fatal(err)
		}
	}

	for _, s := range stmts {
		t.Run("after/"+s.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, s.sql); err != nil {
				t.Fatalf("%s: %v", s.sql, err)
			}
		})
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM reshddl").Scan(&n); err != nil || n != 0 {
		t.Fatalf("after TRUNCATE: %d rows (err %v), want 0", n, err)
	}
	tables := ddlTables(t, nodes, "reshddl")
	if len(tables) != 5 {
		t.Fatalf("tables of reshddl: %v, want the template and 4 shards", tables)
	}
	var first string
	for _, tb := range tables {
		node, schema, _ := strings.Cut(tb, "/")
		var i int
		if _, err := fmt.Sscanf(node, "n%d", &i); err != nil {
			t.Fatal(err)
		}
		var def string
		if err := nodes[i-1].QueryRow(ctx, ddlDefOf, schema, "reshddl").Scan(&def); err != nil {
			t.Fatalf("%s: %v", tb, err)
		}
		if !strings.Contains(def, "extra integer") || !strings.Contains(def, "reshddl_v ") || !strings.Contains(def, "reshddl_extra ") {
			t.Fatalf("%s lacks the DDL run after the reshard:\n%s", tb, def)
		}
		if first == "" {
			first = def
		} else if def != first {
			t.Fatalf("definitions differ:\n%s:\n%s\n%s:\n%s", tables[0], first, tb, def)
		}
	}
}

// TestDDLRunningWhenReshardStarts: a CREATE INDEX CONCURRENTLY that passed
// its reshard check and still runs when a reshard starts reaches the new
// shards. The statement holds its tree's DDL lock until it has logged
// itself, and a split's prepare waits for that lock before it builds its
// target from the DDL log. Before, the targets were built from the log
// without the index, while the statement created it only on the shards of
// the map it had read: after the reshard half the rows had no index.
func TestDDLRunningWhenReshardStarts(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := startProxy(t, 3)
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		"CREATE TABLE ddlrun (k text PRIMARY KEY, v int)",
		"INSERT INTO ddlrun SELECT 'k' || g, g FROM generate_series(1, 2000) g",
		"SELECT lattice_create_tree('ddlrun', 'k', shard_count => 2)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var nodes []*pgx.Conn
	for i := range 3 {
		c, err := pgx.Connect(ctx, testNodeDSN(t, i))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		nodes = append(nodes, c)
	}

	// A transaction that holds a writer's lock on each shard table holds
	// CREATE INDEX CONCURRENTLY at its first shard, after the template.
	var holders []pgx.Tx
	for _, tb := range ddlTables(t, nodes, "ddlrun") {
		node, schema, _ := strings.Cut(tb, "/")
		if schema == "public" {
			continue
		}
		var i int
		if _, err := fmt.Sscanf(node, "n%d", &i); err != nil {
			t.Fatal(err)
		}
		c, err := pgx.Connect(ctx, testNodeDSN(t, i-1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "ddlrun"}.Sanitize()+" IN ROW EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, tx)
	}
	created := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, "CREATE INDEX CONCURRENTLY ddlrun_v ON ddlrun (v)")
		created <- err
	}()
	for waiting := false; !waiting; {
		for _, c := range nodes {
			var n int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			waiting = waiting || n > 0
		}
		select {
		case err := <-created:
			t.Fatalf("CREATE INDEX CONCURRENTLY ended before the holders let it: %v", err)
		case <-ctx.Done():
			t.Fatal("CREATE INDEX CONCURRENTLY never waited for the holders")
		case <-time.After(20 * time.Millisecond):
		}
	}

	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('ddlrun', 4)"); err != nil {
		t.Fatal(err)
	}
	// Without the wait the splits build their targets at once; give them
	// the time to, and see that none does while the statement runs.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if tables := ddlTables(t, nodes, "ddlrun"); len(tables) > 3 {
			t.Logf("a split built its target while CREATE INDEX CONCURRENTLY ran: %v", tables)
			break
		}
	}
	for _, tx := range holders {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-created; err != nil {
		t.Fatalf("CREATE INDEX CONCURRENTLY: %v", err)
	}
	waitReshardComplete(t, ctx, pool, "ddlrun", 2*time.Minute)

	tables := ddlTables(t, nodes, "ddlrun")
	if len(tables) != 5 {
		t.Fatalf("tables of ddlrun: %v, want the template and 4 shards", tables)
	}
	for _, tb := range tables {
		node, schema, _ := strings.Cut(tb, "/")
		var i int
		if _, err := fmt.Sscanf(node, "n%d", &i); err != nil {
			t.Fatal(err)
		}
		var def string
		if err := nodes[i-1].QueryRow(ctx, ddlDefOf, schema, "ddlrun").Scan(&def); err != nil {
			t.Fatalf("%s: %v", tb, err)
		}
		if !strings.Contains(def, "ddlrun_v ") || !strings.Contains(def, "invalid: 0") {
			t.Errorf("%s lacks the index CREATE INDEX CONCURRENTLY made while the reshard started:\n%s", tb, def)
		}
	}
}
