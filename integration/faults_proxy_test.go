package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
)

// TestProxyKilledDuringFreeze has two proxies: A runs the reshard
// coordinator (with a freeze budget long enough that the freeze waits for
// acknowledgements rather than rolling back), B only serves clients. A
// statement on B that planned on the map before the freeze keeps B from
// acknowledging it (one planned before the slots were marked about to
// freeze would be waited for before the freeze: B's starts after the mark,
// while a statement on A holds the freeze back, and A's is cancelled
// once B's runs), and clients on B and A send writes for the frozen
// slots, which the proxies hold. B is then killed with SIGKILL: its
// registration lease expires, the coordinator stops waiting for it, the
// freeze flips within a bounded time, the writes A held are served, the
// reshard completes and no acknowledged write is lost.
func TestProxyKilledDuringFreeze(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fc := startFaultCluster(t, 2)
	a := fc.proxy(t, nil, "--freeze-budget", "60s")
	b := fc.proxy(t, nil, "--coordinator=false")
	poolA := proxyPool(t, ctx, a)
	connA, err := pgx.Connect(ctx, a.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close(ctx)
	initial := createFaultTree(t, ctx, connA, "pk", 10000, 4)
	tr, m, err := fc.shardMap(ctx, "pk")
	if err != nil {
		t.Fatal(err)
	}
	// 4 -> 5 splits shard 0 (owners tie; the lowest index goes first) and
	// moves the upper half of its slots.
	moving := m.SlotRanges(0)[0]
	moving[0] = (moving[0] + moving[1] + 1) / 2
	movingKeys := keysOn(t, tr, m, "held-", 12, func(slot int, _ shardmap.Shard) bool {
		return slot >= moving[0] && slot <= moving[1]
	})
	// A key of the initial rows in the moving slots.
	slowKey := keysOn(t, tr, m, "k-", 1, func(slot int, _ shardmap.Shard) bool {
		return slot >= moving[0] && slot <= moving[1]
	})[0]

	// B's long statement must plan on the map that marks the slots about
	// to freeze, and run on through the freeze, on a slot that freezes, so
	// that B cannot acknowledge the freeze's epoch (a statement on another
	// slot would not hold it: TestFreezeWaitsOnlyForItsSlots). A statement
	// on A planned before the mark holds the freeze back until B's runs.
	node0 := int(m.Shards[0].Node[1] - '1')
	watch, err := pgx.Connect(ctx, fc.nodeDSN(node0))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	running := func(what, sleep string) {
		pollUntil(t, 30*time.Second, what, func() (bool, error) {
			var n int
			err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND state = 'active' AND pid <> pg_backend_pid()`, "%"+sleep+"%").Scan(&n)
			return n > 0, err
		})
	}
	// B serves the tenant, and so acknowledges its maps, from its first
	// statement on.
	connB, err := pgx.Connect(ctx, b.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, connB, "SELECT v FROM pk WHERE k = $1", slowKey)
	slowA, err := pgx.Connect(ctx, a.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer slowA.Close(context.Background())
	slowAErr := make(chan error, 1)
	go func() {
		_, err := slowA.Exec(ctx, "SELECT pg_sleep(600), v FROM pk WHERE k = $1", slowKey)
		slowAErr <- err
	}()
	running("A's long statement to run on its node", "pg_sleep(600)")

	l := newInsertLedger()
	stopA := startWriters(ctx, poolA, "pk", 2, l)
	defer stopA()
	if _, err := poolA.Exec(ctx, "SELECT lattice_reshard('pk', 5)"); err != nil {
		t.Fatal(err)
	}
	bTag := fmt.Sprintf("-%d-", b.cmd.Process.Pid) // a proxy's id holds its pid
	pollUntil(t, 60*time.Second, "B to acknowledge the mark of the moving slots", func() (bool, error) {
		_, m, err := fc.shardMap(ctx, "pk")
		if err != nil || !m.IsFreezing(moving[0]) {
			return false, err
		}
		acks, err := fc.store.Acks(ctx, "lattice", "pk")
		for id, epoch := range acks {
			if strings.Contains(id, bTag) && epoch >= m.Epoch {
				return true, err
			}
		}
		return false, err
	})
	slowErr := make(chan error, 1)
	go func() {
		_, err := connB.Exec(ctx, "SELECT pg_sleep(60), v FROM pk WHERE k = $1", slowKey)
		slowErr <- err
	}()
	running("B's long statement to run on its node", "pg_sleep(60)")
	mustExec(t, watch, "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid()")
	if err := <-slowAErr; sqlState(err) != "57014" {
		t.Fatalf("A's long statement ended with %v, want a cancel (57014)", err)
	}

	var frozen *shardmap.Map
	pollUntil(t, 60*time.Second, "the moving slots to freeze", func() (bool, error) {
		_, m, err := fc.shardMap(ctx, "pk")
		if err != nil {
			return false, err
		}
		frozen = m
		return m.IsFrozen(moving[0]), nil
	})
	// A acknowledges the freeze at once; B cannot while its long
	// statement runs.
	pollUntil(t, 20*time.Second, "every proxy but B to acknowledge the freeze", func() (bool, error) {
		acks, err := fc.store.Acks(ctx, "lattice", "pk")
		if err != nil {
			return false, err
		}
		live, err := fc.store.LiveProxies(ctx)
		if err != nil {
			return false, err
		}
		if len(live) != 2 {
			return false, fmt.Errorf("live proxies %v, want A and B", live)
		}
		for _, id := range live {
			isB := strings.Contains(id, bTag)
			if isB && acks[id] >= frozen.Epoch {
				return false, fmt.Errorf("B acknowledged the freeze epoch %d while its statement on an older map ran (acks %v)", frozen.Epoch, acks)
			}
			if !isB && acks[id] < frozen.Epoch {
				return false, nil
			}
		}
		return true, nil
	})

	// Writes for the frozen slots, on B and on A: the proxies hold them
	// until the slots move (nothing outside a proxy shows a held statement;
	// the check below is that none has returned while the slots are frozen).
	held := newInsertLedger()
	var heldWG sync.WaitGroup
	returned := make(chan string, len(movingKeys))
	heldErrs := make(chan error, len(movingKeys))
	for i, k := range movingKeys {
		p := a
		if i%2 == 0 {
			p = b
		}
		c, err := pgx.Connect(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		heldWG.Add(1)
		go func() {
			defer heldWG.Done()
			sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			_, err := c.Exec(sctx, "INSERT INTO pk (k, v) VALUES ($1, $2)", k, int64(i))
			held.record(k, int64(i), err)
			if p == a && err != nil && sqlState(err) != "55000" {
				// 55000 is a hold that outlived the proxy's hold timeout:
				// refused, not lost. Anything else is a failure.
				heldErrs <- fmt.Errorf("write of %s held on A: %w", k, err)
			}
			returned <- fmt.Sprintf("%s on %s: %v", k, map[bool]string{true: "B", false: "A"}[p == b], err)
		}()
	}
	_, m, err = fc.shardMap(ctx, "pk")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-returned:
		if m.IsFrozen(moving[0]) {
			t.Fatalf("a write for a frozen slot returned while the slot was frozen: %s", r)
		}
	default:
	}
	if !m.IsFrozen(moving[0]) {
		t.Fatalf("the slots thawed before B was killed (epoch %d): the freeze did not wait for B", m.Epoch)
	}

	b.Kill()
	killed := time.Now()
	if err := <-slowErr; err == nil {
		t.Error("B's long statement succeeded although B was killed")
	}
	// B's lease (5 s by default) expires and the coordinator flips without
	// it; 30 s more covers a loaded machine, not a stalled freeze (the
	// budget is 60 s).
	pollUntil(t, 35*time.Second, "the freeze to flip after B was killed", func() (bool, error) {
		_, m, err := fc.shardMap(ctx, "pk")
		if err != nil {
			return false, err
		}
		return !m.IsFrozen(moving[0]) && m.Slots[moving[0]] != 0, nil
	})
	t.Logf("flipped %s after B was killed", time.Since(killed).Round(time.Millisecond))
	heldWG.Wait()
	close(returned)
	for r := range returned {
		t.Log("held write:", r)
	}
	held.mu.Lock()
	for k, v := range held.acked {
		l.record(k, v, nil)
	}
	for k, v := range held.uncertain {
		l.recordCut(k, v)
	}
	held.mu.Unlock()
	close(heldErrs)
	for err := range heldErrs {
		t.Error(err)
	}

	waitReshardComplete(t, ctx, poolA, "pk", 60*time.Second)
	stopA()
	// A hold that outlived the hold timeout (55000) is refused, not lost;
	// any other failure of a write on A is a fault of the freeze.
	l.mu.Lock()
	for code, n := range l.failures {
		if code != "55000" {
			t.Errorf("%d writes on A failed with %s", n, code)
		}
	}
	l.mu.Unlock()
	checkResharded(t, ctx, fc, poolA, "pk", 5, initial, l)
	acked, failed := l.counts()
	t.Logf("%d inserts acknowledged, %d of unknown outcome (failures by SQLSTATE: %v)", acked, failed, l.failures)
}
