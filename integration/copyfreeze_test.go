package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
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
	pool := itemsTree(t, ctx, startProxy(t, 2, "--reshard-tick", "200ms"))
	splitAndMove(t, ctx, pool, "items")
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

// TestShadowCopyLockedTarget: a session on the node holds a lock on a
// move's new target table (as a pg_dump of the node would) from before the
// copy on. The copy's TRUNCATE waits for it one second at most, then
// deletes the slots instead and copies without FREEZE: the move goes past
// its copy while the lock is held and completes once it is gone, with
// every row, and the target's pages are not frozen.
func TestShadowCopyLockedTarget(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hold := holdFile(t)
	pool := itemsTree(t, ctx, startProxyEnv(t, 2, []string{"LATTICE_TEST_HOLD_AT=prepare:" + hold}, "--reshard-tick", "200ms"))
	want := itemsDigest(t, ctx, pool)
	before := shardNodes(t, ctx, pool, "items")
	from, to := 0, 1
	if before[0] == "n2/active" {
		from, to = 1, 0
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("SELECT lattice_move_shard('items', 0, 'n%d')", to+1)); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, hold, "the move to make its target")
	// A move keeps the shard's index: its target is shard 0's table on the
	// target node.
	const target = "lattice_s0000.items"
	locker := connect(t, testNodeDSN(t, to))
	mustExec(t, locker, "BEGIN")
	mustExec(t, locker, "LOCK TABLE "+target+" IN ACCESS SHARE MODE")
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	// The copy goes past the lock; the release, which drops the target's
	// write log trigger, waits for it (retrying short lock waits).
	store := harnessStore(t)
	pollUntil(t, 30*time.Second, "the move's copy to go past the locked target", func() (bool, error) {
		migs, err := store.Migrations(ctx, "lattice", "items")
		if err != nil || len(migs) != 1 {
			return false, err
		}
		switch migs[0].Phase {
		case shardmap.PhasePrepare, shardmap.PhaseCopy:
			return false, nil
		}
		return true, nil
	})
	mustExec(t, locker, "COMMIT")
	waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('items')", nil, func() error { return nil })
	if got := itemsDigest(t, ctx, pool); got != want {
		t.Errorf("after the move: %s, want %s", got, want)
	}
	after := shardNodes(t, ctx, pool, "items")
	if !strings.HasPrefix(after[0], fmt.Sprintf("n%d/", to+1)) {
		t.Errorf("shard 0 is %s after the move from n%d, want on n%d", after[0], from+1, to+1)
	}
	mustExec(t, locker, "CREATE EXTENSION IF NOT EXISTS pg_visibility")
	var frozen, pages int
	if err := locker.QueryRow(ctx, `SELECT count(*) FILTER (WHERE all_frozen), count(*) FROM pg_visibility_map('lattice_s0000.items')`).Scan(&frozen, &pages); err != nil {
		t.Fatal(err)
	}
	if pages == 0 || frozen == pages {
		t.Errorf("shard 0 on n%d: %d of its %d pages all-frozen, want the copy without FREEZE", to+1, frozen, pages)
	}
}

// splitAndMove reshards tree from 2 shards to 4 (shards 2 and 3 are the
// splits' targets), then moves shard 0 to the other node.
func splitAndMove(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string) {
	t.Helper()
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard($1, 4)", tree); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, fmt.Sprintf("SELECT lattice_reshard_complete('%s')", tree), nil, func() error { return nil })
	to := "n2"
	if shardNodes(t, ctx, pool, tree)[0] == "n2/active" {
		to = "n1"
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_move_shard($1, 0, $2)", tree, to); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, fmt.Sprintf("SELECT lattice_rebalance_complete('%s')", tree), nil, func() error { return nil })
}

// itemsTree makes items, a tree of 20,000 rows in 2 shards, through p and
// returns a pool to p, closed when t ends.
func itemsTree(t *testing.T, ctx context.Context, p *proxyProc) *pgxpool.Pool {
	t.Helper()
	return proxyPool(t, ctx, p,
		"CREATE TABLE items (k bigint PRIMARY KEY, v text NOT NULL)",
		"INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 20000) g",
		"SELECT lattice_create_tree('items', 'k', shard_count => 2)")
}

// itemsDigest is the row count and an order-free digest of items' rows.
func itemsDigest(t *testing.T, ctx context.Context, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(ctx, "SELECT count(*) || ' rows, ' || sum(hashtext(k || v)::bigint) FROM items").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
