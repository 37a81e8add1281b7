package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestVacuumTree: VACUUM, ANALYZE, REINDEX TABLE and CLUSTER of a tree through the
// proxy run on every shard table, on every node, and answer with
// PostgreSQL's tags; VACUUM inside a transaction block gets 25001 as in
// PostgreSQL, and a list that also names another table is refused with a
// hint, as is REINDEX INDEX of a tree's index. VERBOSE's INFO lines of
// every shard table reach the client, and CLUSTER ... USING marks the
// shards a later reshard makes too.
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
		"CREATE TABLE vplain (p int PRIMARY KEY)",
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
	// The shards' notices reach the client, in either protocol.
	for _, q := range []struct {
		sql  string
		args []any
		word string
	}{
		{"VACUUM (VERBOSE) vt", nil, "vacuuming"},
		{"ANALYZE VERBOSE vt", []any{pgx.QueryExecModeExec}, "analyzing"},
	} {
		cfg, err := pgx.ParseConfig(p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		var infos []string
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if n.Severity == "INFO" {
				infos = append(infos, n.Message)
			}
		}
		vc, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := vc.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
		vc.Close(ctx)
		for shard := range 4 {
			name := fmt.Sprintf(`lattice_s%04d.vt"`, shard)
			if !slices.ContainsFunc(infos, func(m string) bool { return strings.HasPrefix(m, q.word) && strings.Contains(m, name) }) {
				t.Errorf("%s: no INFO %q of shard %d among the %d the client got: %q", q.sql, q.word, shard, len(infos), infos)
			}
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

	// The shard tables' index files: a REINDEX writes each anew.
	indexFiles := func() map[string]string {
		out := map[string]string{}
		for n := range 2 {
			node := connect(t, testNodeDSN(t, n))
			rows, err := node.Query(ctx, `SELECT format('n%s %s', $1::int, indexrelid::regclass), pg_relation_filenode(indexrelid)::text
				FROM pg_index WHERE indrelid IN (SELECT oid FROM pg_class WHERE relname = 'vt' AND relnamespace::regnamespace::text LIKE 'lattice_s%')`, n+1)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var ix, file string
				if err := rows.Scan(&ix, &file); err != nil {
					t.Fatal(err)
				}
				out[ix] = file
			}
			node.Close(ctx)
		}
		return out
	}
	for _, q := range []string{"REINDEX TABLE vt", "REINDEX (VERBOSE) TABLE CONCURRENTLY public.vt"} {
		before := indexFiles()
		tag, err := c.Exec(ctx, q)
		if err != nil || tag.String() != "REINDEX" {
			t.Fatalf("%s: tag %q, %v; want REINDEX", q, tag, err)
		}
		after := indexFiles()
		if len(before) != 4 || len(after) != 4 {
			t.Fatalf("%s: the shard tables have %d and %d indexes, want 4", q, len(before), len(after))
		}
		for ix, file := range before {
			if after[ix] == file {
				t.Errorf("%s: index %s keeps its file %s", q, ix, file)
			}
		}
	}
	// CLUSTER rewrites every shard table in its index's order and marks
	// the index as the one to cluster on.
	// clustered fails t unless want shard tables, over both nodes, are
	// all marked clustered on their key.
	clustered := func(when string, want int) {
		t.Helper()
		var shards, marked int
		for n := range 2 {
			node := connect(t, testNodeDSN(t, n))
			var a, b int
			if err := node.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE indisclustered) FROM pg_index
				WHERE indrelid IN (SELECT oid FROM pg_class WHERE relname = 'vt' AND relnamespace::regnamespace::text LIKE 'lattice_s%')`).Scan(&a, &b); err != nil {
				t.Fatal(err)
			}
			node.Close(ctx)
			shards, marked = shards+a, marked+b
		}
		if shards != want || marked != shards {
			t.Errorf("%s: %d of %d shard tables clustered on their key, want all of %d", when, marked, shards, want)
		}
	}
	tag, err := c.Exec(ctx, "CLUSTER vt USING vt_pkey")
	if err != nil || tag.String() != "CLUSTER" {
		t.Fatalf("CLUSTER: tag %q, %v; want CLUSTER", tag, err)
	}
	clustered("after CLUSTER USING", 4)
	// Shards made by a reshard get the mark, so CLUSTER alone runs on them.
	mustExec(t, c, "SELECT lattice_reshard('vt', 8)")
	for done := false; !done; time.Sleep(50 * time.Millisecond) {
		if err := c.QueryRow(ctx, "SELECT lattice_reshard_complete('vt')").Scan(&done); err != nil {
			t.Fatal(err)
		}
	}
	clustered("after the reshard to 8", 8)
	if _, err := c.Exec(ctx, "CLUSTER vt"); err != nil {
		t.Fatalf("CLUSTER without USING after the reshard: %v", err)
	}
	if _, err := c.Exec(ctx, "REINDEX INDEX vt_pkey"); pgCode(err) != "0A000" || !strings.Contains(pgHint(err), "REINDEX TABLE vt") {
		t.Fatalf("REINDEX INDEX of a tree's index: %v (hint %q), want 0A000 naming REINDEX TABLE", err, pgHint(err))
	}
	mustExec(t, c, "REINDEX INDEX vplain_pkey")

	mustExec(t, c, "BEGIN")
	if _, err := c.Exec(ctx, "VACUUM vt"); pgCode(err) != "25001" {
		t.Fatalf("VACUUM inside a transaction block: %v, want 25001", err)
	}
	mustExec(t, c, "ROLLBACK")
	if _, err := c.Exec(ctx, "VACUUM vt, vplain"); pgCode(err) != "0A000" {
		t.Fatalf("VACUUM of a tree and another table: %v, want 0A000", err)
	}
}
