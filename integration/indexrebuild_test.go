package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCopyRebuildsIndexes: a split's and a move's copy fill their target
// without its indexes and build them after (migrator/deferindex.go). Every
// target must end with the indexes of a shard no copy touched: the same
// names and definitions (a unique constraint, a partial index, an index
// with a fillfactor of its own), constraints, CLUSTER mark and replica
// identity (the default), and the rows must all be there.
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
		"CREATE INDEX gear_w ON gear (w) WHERE w > 10",
		"CLUSTER gear USING gear_v")
	var want string
	if err := pool.QueryRow(ctx, "SELECT count(*) || ' rows, ' || sum(hashtext(k || ':' || u || v || coalesce(w, -1))::bigint) FROM gear").Scan(&want); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('gear', 4)"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_reshard_complete('gear')", nil, func() error { return nil })
	before := shardNodes(t, ctx, pool, "gear")
	to := "n2"
	if before[0] == "n2/active" {
		to = "n1"
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("SELECT lattice_move_shard('gear', 0, '%s')", to)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('gear')", nil, func() error { return nil })
	if !strings.Contains(p.Log(), "indexes built after the copy") {
		t.Error("no copy built its target's indexes after the copy")
	}

	after := shardNodes(t, ctx, pool, "gear")
	indexes := func(idx int) string {
		node, _, _ := strings.Cut(after[idx], "/")
		c := connect(t, testNodeDSN(t, int(node[1]-'1')))
		var s string
		if err := c.QueryRow(ctx, `
SELECT string_agg(format('%s %s constraint=%s clustered=%s', ic.relname,
         regexp_replace(pg_get_indexdef(i.indexrelid), 'lattice_s[0-9]+\.', ''), coalesce(k.conname || '/' || k.contype::text, '-'), i.indisclustered),
       E'\n' ORDER BY ic.relname) || E'\nreplica identity ' || max(t.relreplident::text) || ' ' || coalesce(max(ic.relname) FILTER (WHERE i.indisreplident), '-')
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = t.oid
WHERE i.indrelid = $1::regclass`, fmt.Sprintf("lattice_s%04d.gear", idx)).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Shard 1 is the split source that kept its table; 2 and 3 are the
	// splits' targets, 0 the move's.
	untouched := indexes(1)
	t.Logf("shard 1's indexes:\n%s", untouched)
	for _, idx := range []int{0, 2, 3} {
		if got := indexes(idx); got != untouched {
			t.Errorf("shard %d's indexes after its copy:\n%s\nwant shard 1's:\n%s", idx, got, untouched)
		}
	}
	var got string
	if err := pool.QueryRow(ctx, "SELECT count(*) || ' rows, ' || sum(hashtext(k || ':' || u || v || coalesce(w, -1))::bigint) FROM gear").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("gear after the copies: %s, want %s", got, want)
	}
}
