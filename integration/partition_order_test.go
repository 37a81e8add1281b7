package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TestPartitionOrder checks the two orderings a coordinator relies on when
// it counts a proxy cut off from Redis as not serving because the proxy's
// presence session on a node is gone (docs/DESIGN.md section 12), with real
// packet drops between the proxy's network namespace and one node:
//
//   - a statement the partition holds back fails within the proxy's user
//     timeout and never reaches the node once the partition heals (it was
//     retransmitted and ran after a flip and a release before);
//   - the proxy stops serving more than that user timeout before the node
//     ends its presence session, which is when a coordinator may stop
//     waiting for it.
func TestPartitionOrder(t *testing.T) {
	requireNetNS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fc, _, nsB, a, b := startNetPair(t, ctx)
	createFaultTreeIn(t, ctx, a, "ghost", 100, 3)
	tr, m, err := fc.shardMap(ctx, "ghost")
	if err != nil {
		t.Fatal(err)
	}
	onNode := func(node string) string {
		return keysOn(t, tr, m, "g-", 1, func(_ int, sh shardmap.Shard) bool { return sh.Node == node })[0]
	}
	cutNode, readKey, ghostKey := fc.nodePort(2), onNode("n1"), onNode("n3")
	// Proxy B's backends to n3 and n1 open, and its view of the tenant read.
	for _, k := range []string{readKey, ghostKey} {
		var n int
		if err := b.QueryRow(ctx, "SELECT count(*) FROM ghost WHERE k = $1", k).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("a held-back statement never runs late", func(t *testing.T) {
		heal := nsB.cut(t, cutNode, cutBoth)
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		start := time.Now()
		_, err := b.Exec(sctx, "INSERT INTO ghost (k, v) VALUES ($1, 1)", ghostKey)
		scancel()
		took := time.Since(start)
		heal()
		if sqlState(err) != "08006" {
			t.Fatalf("the INSERT through the partition returned %v after %s; want 08006 (the backend's socket gave up)", err, took.Round(time.Millisecond))
		}
		t.Logf("the INSERT failed after %s: %v", took.Round(time.Millisecond), err)
		// Long enough for a retransmission to arrive after the heal.
		time.Sleep(5 * time.Second)
		var n int
		if err := a.QueryRow(ctx, "SELECT count(*) FROM ghost WHERE k = $1", ghostKey).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d rows of %s after the heal (%v): the held-back INSERT ran", n, ghostKey, err)
		}
	})

	t.Run("the proxy stops serving well before the node ends its presence", func(t *testing.T) {
		// B serves again once its presence session on n3 is open again.
		pollUntil(t, 30*time.Second, "proxy B to serve "+ghostKey, func() (bool, error) {
			var n int
			return b.QueryRow(ctx, "SELECT count(*) FROM ghost WHERE k = $1", ghostKey).Scan(&n) == nil, nil
		})
		node := connect(t, fc.nodeDSN(2))
		defer node.Close(ctx)
		presence := func() (int, error) {
			var n int
			err := node.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'lattice proxy %' AND host(client_addr) = $1`, nsB.ip).Scan(&n)
			return n, err
		}
		pollUntil(t, 30*time.Second, "proxy B's presence session on n3", func() (bool, error) {
			n, err := presence()
			return n > 0, err
		})
		healRedis, healNode := nsB.cut(t, fc.redisPort(t), cutBoth), nsB.cut(t, cutNode, cutBoth)
		defer healRedis()
		defer healNode()
		start := time.Now()
		// A reader through B, one statement at a time: when the last one
		// that B served began, and whether B refused one (57P03, after
		// waiting up to 3 s for its lease).
		var mu sync.Mutex
		var lastServed time.Duration
		refused := false
		rctx, rstop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for rctx.Err() == nil {
				began := time.Since(start)
				var n int
				err := b.QueryRow(rctx, "SELECT count(*) FROM ghost WHERE k = $1", readKey).Scan(&n)
				mu.Lock()
				if err == nil {
					lastServed = began
				} else if sqlState(err) == "57P03" {
					refused = true
				}
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}()
		var gone time.Duration
		pollUntil(t, 90*time.Second, "n3 to end proxy B's presence session", func() (bool, error) {
			n, err := presence()
			gone = time.Since(start)
			return n == 0, err
		})
		time.Sleep(5 * time.Second)
		rstop()
		<-done
		t.Logf("proxy B last served a statement begun %s after the cut; n3 ended its presence session after %s", lastServed.Round(time.Millisecond), gone.Round(time.Millisecond))
		// What B sent before it stopped must be in the node or dropped
		// (8 s, the backends' user timeout) before the node ends the session.
		if !refused || lastServed+8*time.Second >= gone {
			t.Fatalf("proxy B served a statement begun %s after the cut (refused one: %v); n3 ended its presence after %s: the proxy must stop serving more than 8 s before", lastServed, refused, gone)
		}
	})
}
