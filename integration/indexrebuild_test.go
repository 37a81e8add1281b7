package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCopyRebuildsIndexes: a new tree's copy into its shards, and a
// split's and a move's copy into their targets, fill the tables without
// their indexes and build them after (pgshard/deferindex.go). Every shard
// must end with the tree's template's indexes: the same names and
// definitions (a unique constraint, a partial index, an index with a
// fillfactor of its own), constraints and replica identity (the default),
// and the same CLUSTER mark on every shard; the rows must all be there.
func TestCopyRebuildsIndexes(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p,
		"CREATE TABLE gear (k bigint PRIMARY KEY, u int NOT NULL, v text NOT NULL, w int, CONSTRAINT gear_ku UNIQUE (k, u))",
		"CREATE INDEX gear_v ON gear (v) WITH (fillfactor = 70)",
		"INSERT INTO gear SELECT g, g % 7, md5(g::text), g % 20 FROM generate_series(1, 20000) g",
		"SELECT lattice_create_tree('gear', 'k', shard_count => 2)",
		"CREATE INDEX gear_w ON gear (w) WHERE w > 10")
	var rows string
	if err := pool.QueryRow(ctx, "SELECT count(*) || ' rows, ' || sum(hashtext(k || ':' || u || v || coalesce(w, -1))::bigint) FROM gear").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	// The creation's copy truncated each shard first: COPY FREEZE left
	// their pages all-frozen.
	for idx, at := range shardNodes(t, ctx, pool, "gear") {
		node, _, _ := strings.Cut(at, "/")
		c := connect(t, testNodeDSN(t, int(node[1]-'1')))
		mustExec(t, c, "CREATE EXTENSION IF NOT EXISTS pg_visibility")
		var frozen, pages int
		if err := c.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE all_visible AND all_frozen), count(*) FROM pg_visibility_map('lattice_s%04d.gear')`, idx)).Scan(&frozen, &pages); err != nil {
			t.Fatal(err)
		}
		if pages == 0 || frozen != pages {
			t.Errorf("shard %d, filled by the tree's creation: %d of its %d pages all-frozen, want all", idx, frozen, pages)
		}
	}
	// CLUSTER rewrites every shard, after the look.
	if _, err := pool.Exec(ctx, "CLUSTER gear USING gear_v"); err != nil {
		t.Fatal(err)
	}
	splitAndMove(t, ctx, pool, "gear")
	if !strings.Contains(p.Log(), "indexes built after the copy") {
		t.Error("no copy built its target's indexes after the copy")
	}

	after := shardNodes(t, ctx, pool, "gear")
	indexes := func(node int, table string) string {
		var s string
		if err := connect(t, testNodeDSN(t, node)).QueryRow(ctx, `
SELECT string_agg(format('%s %s constraint=%s', ic.relname,
         regexp_replace(pg_get_indexdef(i.indexrelid), '(lattice_s[0-9]+|public)\.', ''), coalesce(k.conname || '/' || k.contype::text, '-')),
       E'\n' ORDER BY ic.relname) || E'\nreplica identity ' || max(t.relreplident::text) || ' ' || coalesce(max(ic.relname) FILTER (WHERE i.indisreplident), '-')
       || E'\nclustered on ' || coalesce(max(ic.relname) FILTER (WHERE i.indisclustered), '-')
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = t.oid
WHERE i.indrelid = $1::regclass`, table).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The template keeps the indexes the table had; CLUSTER marks the
	// shards' alone.
	want := strings.Replace(indexes(0, "public.gear"), "clustered on -", "clustered on gear_v", 1)
	t.Logf("the template's indexes:\n%s", want)
	// Shard 1 is as the tree's creation filled it, 2 and 3 are the splits'
	// targets, 0 the move's.
	for idx := range 4 {
		node, _, _ := strings.Cut(after[idx], "/")
		if got := indexes(int(node[1]-'1'), fmt.Sprintf("lattice_s%04d.gear", idx)); got != want {
			t.Errorf("shard %d's indexes:\n%s\nwant:\n%s", idx, got, want)
		}
	}
	var got string
	if err := pool.QueryRow(ctx, "SELECT count(*) || ' rows, ' || sum(hashtext(k || ':' || u || v || coalesce(w, -1))::bigint) FROM gear").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != rows {
		t.Errorf("gear after the copies: %s, want %s", got, rows)
	}
}
