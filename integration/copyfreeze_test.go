package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestShadowCopyFreezes checks that the targets of splits and of a move
// are written frozen (COPY FREEZE into the target emptied in the copy's
// transaction): every page of each is all-visible and all-frozen in the
// visibility map, so neither the move's comparison nor the clients' first
// reads set hint bits page by page, and vacuum finds nothing to do there.
func TestShadowCopyFreezes(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		"CREATE TABLE items (k bigint PRIMARY KEY, v text NOT NULL)",
		"INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 20000) g",
		"SELECT lattice_create_tree('items', 'k', shard_count => 2)",
		"SELECT lattice_reshard('items', 4)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	waitFor(t, ctx, pool, "SELECT lattice_reshard_complete('items')", nil, func() error { return nil })
	before := shardNodes(t, ctx, pool, "items")
	to := "n2"
	if before[0] == "n2/active" {
		to = "n1"
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("SELECT lattice_move_shard('items', 0, '%s')", to)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('items')", nil, func() error { return nil })

	after := shardNodes(t, ctx, pool, "items")
	// Shards 2 and 3 are the splits' targets, shard 0 the move's.
	for _, idx := range []int{0, 2, 3} {
		node, _, _ := strings.Cut(after[idx], "/")
		c := connect(t, testNodeDSN(t, int(node[1]-'1')))
		mustExec(t, c, "CREATE EXTENSION IF NOT EXISTS pg_visibility")
		var frozen, pages int
		if err := c.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE all_visible AND all_frozen), count(*)
			FROM pg_visibility_map('lattice_s%04d.items')`, idx)).Scan(&frozen, &pages); err != nil {
			t.Fatal(err)
		}
		if pages == 0 || frozen != pages {
			t.Errorf("shard %d on %s: %d of its %d pages all-frozen, want all", idx, node, frozen, pages)
		}
	}
}
