package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// nodeBytes sums pg_total_relation_size of the tree's owning shard tables
// per node, read on the nodes themselves.
func nodeBytes(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	conns := map[string]*pgx.Conn{} // one a node: a new backend is dear on a 2-core machine
	defer func() {
		for _, c := range conns {
			c.Close(ctx)
		}
	}()
	for idx, ns := range shardNodes(t, ctx, pool, tree) {
		node, state, _ := strings.Cut(ns, "/")
		if state != "active" {
			continue
		}
		c := conns[node]
		if c == nil {
			i, err := strconv.Atoi(strings.TrimPrefix(node, "n"))
			if err != nil {
				t.Fatalf("node name %q", node)
			}
			if c, err = pgx.Connect(ctx, testNodeDSN(t, i-1)); err != nil {
				t.Fatal(err)
			}
			conns[node] = c
		}
		var n int64
		if err := c.QueryRow(ctx, "SELECT pg_total_relation_size($1)", fmt.Sprintf("lattice_s%04d.%s", idx, tree)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[node] += n
	}
	return out
}

// withinTenPercent reports whether every node's bytes are within 10% of
// their mean.
func withinTenPercent(bytes map[string]int64) bool {
	var total int64
	for _, b := range bytes {
		total += b
	}
	mean := float64(total) / float64(len(bytes))
	for _, b := range bytes {
		if d := float64(b) - mean; d > 0.1*mean || -d > 0.1*mean {
			return false
		}
	}
	return true
}

// TestScaleOut is the elastic-nodes proof: a tree of 64 shards and 200,000
// rows on 2 nodes, the ledger workload through two proxies; lattice_add_node
// adds a third node (no proxy restarts), lattice_rebalance gives it an even
// share of the bytes, lattice_drain_node empties node 2 and
// lattice_remove_node removes it. Every acknowledged write is present
// exactly once, no read is stale, no client sees an error, the bytes of the
// active nodes are within 10% of their mean after the rebalance, and node 2
// keeps no shard schema, publication or replication slot.
func TestScaleOut(t *testing.T) {
	if testing.Short() {
		t.Skip("long: rebalances and drains a 200,000-row tree under load")
	}
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var conns []*pgx.Conn // one plain session per proxy, for lattice_nodes
	var pools []*pgxpool.Pool
	for range 2 {
		p := startProxy(t, 2, "--reshard-tick", "500ms") // the first seeds the registry with n1 and n2
		pool, err := pgxpool.New(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pools = append(pools, pool)
		c, err := pgx.Connect(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		conns = append(conns, c)
	}
	load := newLoad(t, ctx, pools, 200_000, 64)
	admin := pools[0]
	if b := nodeBytes(t, ctx, admin, "catalogue"); len(b) != 2 {
		t.Fatalf("the tree is on %v, want n1 and n2", b)
	}
	failed, finish := load.run(ctx)

	var msg string
	if err := admin.QueryRow(ctx, "SELECT lattice_add_node('n3', $1)", testNodeDSN(t, 2)).Scan(&msg); err != nil {
		finish()
		t.Fatalf("lattice_add_node: %v", err)
	}
	t.Logf("lattice_add_node: %s", msg)
	// Either proxy may hold the tree's lease: both must have the node.
	for _, c := range conns {
		waitNodes(t, c, "n1,n2,n3")
	}

	start := time.Now()
	if err := admin.QueryRow(ctx, "SELECT lattice_rebalance('catalogue')").Scan(&msg); err != nil {
		finish()
		t.Fatal(err)
	}
	t.Logf("lattice_rebalance: %s", msg)
	waitFor(t, ctx, admin, "SELECT lattice_rebalance_complete('catalogue')", failed, finish)
	after := nodeBytes(t, ctx, admin, "catalogue")
	t.Logf("rebalanced in %s (%d writes, %d reads so far): bytes per node %v", time.Since(start).Round(time.Millisecond), load.writes.Load(), load.reads.Load(), after)
	if len(after) != 3 || !withinTenPercent(after) {
		t.Errorf("after the rebalance the bytes per node are %v, want every one of n1, n2, n3 within 10%% of the mean", after)
	}

	start = time.Now()
	if err := admin.QueryRow(ctx, "SELECT lattice_drain_node('n2')").Scan(&msg); err != nil {
		finish()
		t.Fatal(err)
	}
	t.Logf("lattice_drain_node: %s", msg)
	waitFor(t, ctx, admin, "SELECT lattice_drain_complete('n2')", failed, finish)
	drained := nodeBytes(t, ctx, admin, "catalogue")
	t.Logf("drained n2 in %s: bytes per node %v", time.Since(start).Round(time.Millisecond), drained)
	if _, ok := drained["n2"]; ok {
		t.Errorf("n2 still holds shards after the drain: %v", drained)
	}
	for _, r := range listNodes(t, conns[1]) {
		if want := map[bool]string{true: "draining", false: "active"}[r.Node == "n2"]; r.State != want || r.Node == "n2" && r.Shards != 0 {
			t.Errorf("lattice_nodes after the drain: %s is %s with %d shards", r.Node, r.State, r.Shards)
		}
	}
	if err := admin.QueryRow(ctx, "SELECT lattice_remove_node('n2')").Scan(&msg); err != nil {
		finish()
		t.Fatalf("lattice_remove_node: %v", err)
	}
	t.Logf("lattice_remove_node: %s", msg)
	for _, c := range conns {
		waitNodes(t, c, "n1,n3")
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if load.writes.Load() == 0 || load.reads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads", load.writes.Load(), load.reads.Load())
	}
	verifyReshardedTree(t, ctx, admin, load.ledger, 64)
	if left := latticeLeftovers(t, ctx, 1); len(left) != 0 {
		t.Errorf("n2 keeps %v after the drain", left)
	}
	t.Logf("%d writes, %d reads", load.writes.Load(), load.reads.Load())
}
