package integration

import (
	"context"
	"testing"
	"time"
)

// TestVacuumTree: VACUUM and ANALYZE of a tree through the proxy run on
// every shard table, on every node, and answer with PostgreSQL's tags;
// VACUUM inside a transaction block gets 25001 as in PostgreSQL, and a
// list that also names another table is refused with a hint.
func TestVacuumTree(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	for _, q := range []string{
		"CREATE TABLE vt (k int PRIMARY KEY, v text)",
		"INSERT INTO vt SELECT g, 'v' || g FROM generate_series(1, 2000) g",
		"SELECT lattice_create_tree('vt', 'k', shard_count => 4)",
		"CREATE TABLE vplain (p int)",
		"DELETE FROM vt WHERE k % 2 = 0",
	} {
		mustExec(t, c, q)
	}
	// stats is, over both nodes, the shard tables of vt, those vacuumed
	// and those analysed by hand, and their dead rows.
	stats := func() (tables, vacuumed, analysed, dead int) {
		for n := range 2 {
			node := connect(t, testNodeDSN(t, n))
			var a, b, c, d int
			if err := node.QueryRow(ctx, `SELECT count(*), count(last_vacuum), count(last_analyze), coalesce(sum(n_dead_tup), 0)
				FROM pg_stat_user_tables WHERE relname = 'vt' AND schemaname LIKE 'lattice_s%'`).Scan(&a, &b, &c, &d); err != nil {
				t.Fatal(err)
			}
			node.Close(ctx)
			tables, vacuumed, analysed, dead = tables+a, vacuumed+b, analysed+c, dead+d
		}
		return
	}
	if tables, vacuumed, analysed, _ := stats(); tables != 4 || vacuumed != 0 || analysed != 0 {
		t.Fatalf("before: %d shard tables, %d vacuumed, %d analysed; want 4, 0, 0", tables, vacuumed, analysed)
	}

	for _, q := range []struct{ sql, tag string }{
		{"ANALYZE vt (v)", "ANALYZE"},
		{"VACUUM (VERBOSE) public.vt", "VACUUM"},
	} {
		tag, err := c.Exec(ctx, q.sql)
		if err != nil || tag.String() != q.tag {
			t.Fatalf("%s: tag %q, %v; want %s", q.sql, tag, err, q.tag)
		}
	}
	if tables, vacuumed, analysed, dead := stats(); vacuumed != tables || analysed != tables || dead != 0 {
		t.Fatalf("after: of %d shard tables %d vacuumed and %d analysed, %d dead rows left; want all, and none", tables, vacuumed, analysed, dead)
	}
	mustExec(t, c, "VACUUM (FULL, ANALYZE) vt")
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM vt").Scan(&n); err != nil || n != 1000 {
		t.Fatalf("rows after VACUUM FULL: %d, %v; want 1000", n, err)
	}

	mustExec(t, c, "BEGIN")
	if _, err := c.Exec(ctx, "VACUUM vt"); pgCode(err) != "25001" {
		t.Fatalf("VACUUM inside a transaction block: %v, want 25001", err)
	}
	mustExec(t, c, "ROLLBACK")
	if _, err := c.Exec(ctx, "VACUUM vt, vplain"); pgCode(err) != "0A000" {
		t.Fatalf("VACUUM of a tree and another table: %v, want 0A000", err)
	}
}
