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
