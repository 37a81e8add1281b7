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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, nodes := reshardDDLTree(t, ctx, "reshddl")

	// A transaction with an xid on every node holds the reshard in its
	// copy phase: creating a migration's logical slot waits for it.
	var blockers []pgx.Tx
	for _, c := range nodes {
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
	var first, firstTable string
	for _, d := range shardDefs(t, ctx, nodes, "reshddl", 4) {
		if !strings.Contains(d.def, "extra integer") || !strings.Contains(d.def, "reshddl_v ") || !strings.Contains(d.def, "reshddl_extra ") {
			t.Fatalf("%s lacks the DDL run after the reshard:\n%s", d.table, d.def)
		}
		if first == "" {
			first, firstTable = d.def, d.table
		} else if d.def != first {
			t.Fatalf("definitions differ:\n%s:\n%s\n%s:\n%s", firstTable, first, d.table, d.def)
		}
	}
}

// reshardDDLTree starts a proxy on 3 nodes with a tree name of 2,000 rows
// in 2 shards, and connects to each node.
func reshardDDLTree(t *testing.T, ctx context.Context, name string) (*pgxpool.Pool, []*pgx.Conn) {
	t.Helper()
	resetNodes(t)
	p := startProxy(t, 3)
	pool := proxyPool(t, ctx, p,
		"CREATE TABLE "+name+" (k text PRIMARY KEY, v int)",
		"INSERT INTO "+name+" SELECT 'k' || g, g FROM generate_series(1, 2000) g",
		"SELECT lattice_create_tree('"+name+"', 'k', shard_count => 2)")
	var nodes []*pgx.Conn
	for i := range 3 {
		nodes = append(nodes, connect(t, testNodeDSN(t, i)))
	}
	return pool, nodes
}

// shardDef is the definition of one table of a tree (ddlDefOf), at
// "node/schema".
type shardDef struct{ table, def string }

// shardDefs reads the definition of the template and of every shard table
// of tree name, and fails unless there are shards of them.
func shardDefs(t *testing.T, ctx context.Context, nodes []*pgx.Conn, name string, shards int) []shardDef {
	t.Helper()
	tables := ddlTables(t, nodes, name)
	if len(tables) != shards+1 {
		t.Fatalf("tables of %s: %v, want the template and %d shards", name, tables, shards)
	}
	var out []shardDef
	for _, tb := range tables {
		node, schema, _ := strings.Cut(tb, "/")
		var i int
		if _, err := fmt.Sscanf(node, "n%d", &i); err != nil {
			t.Fatal(err)
		}
		d := shardDef{table: tb}
		if err := nodes[i-1].QueryRow(ctx, ddlDefOf, schema, name).Scan(&d.def); err != nil {
			t.Fatalf("%s: %v", tb, err)
		}
		out = append(out, d)
	}
	return out
}

// TestDDLRunningWhenReshardStarts: a CREATE INDEX CONCURRENTLY that passed
// its reshard check and still runs when a reshard starts reaches the new
// shards. The statement holds its tree's DDL lock until it has logged
// itself, and a split's prepare waits for that lock before it builds its
// target from the DDL log. Before, the targets were built from the log
// without the index, while the statement created it only on the shards of
// the map it had read: after the reshard half the rows had no index.
func TestDDLRunningWhenReshardStarts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, nodes := reshardDDLTree(t, ctx, "ddlrun")

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
		tx, err := connect(t, testNodeDSN(t, i-1)).Begin(ctx)
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

	for _, d := range shardDefs(t, ctx, nodes, "ddlrun", 4) {
		if !strings.Contains(d.def, "ddlrun_v ") || !strings.Contains(d.def, "invalid: 0") {
			t.Errorf("%s lacks the index CREATE INDEX CONCURRENTLY made while the reshard started:\n%s", d.table, d.def)
		}
	}
}
