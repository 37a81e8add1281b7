package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestFreezeWaitsOnlyForItsSlots runs a point statement that lasts a
// minute, first on a slot outside a moving shard and then on one inside
// it. A proxy acknowledges a freeze while older statements run on other
// slots (shardmap.Registration.Narrow), so the first move completes while
// the statement still runs; a statement on the moving shard's own slots
// holds the freeze back until it ends, and the freeze is not even tried
// meanwhile (the slots are only marked about to freeze, which holds no
// write): none is rolled back.
func TestFreezeWaitsOnlyForItsSlots(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms", "--freeze-budget", "1s")
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		"CREATE TABLE na (id bigint PRIMARY KEY, bal bigint NOT NULL)",
		"INSERT INTO na SELECT g, 0 FROM generate_series(1, 400) g",
		"SELECT lattice_create_tree('na', 'id', shard_count => 4)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Shards 0 and 2 are on n1, 1 and 3 on n2: a key on n2 is off shard 0.
	var on int64 // a key of shard 0
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, "SELECT min(id) FROM lattice_s0000.na").Scan(&on); err != nil {
		t.Fatal(err)
	}
	off := slices.Min(slices.Collect(maps.Keys(tenantRows(t, 1, "lattice", "na"))))

	sleeper := connect(t, p.DSN("lattice"))
	const sleepSQL = "SELECT pg_sleep(60), bal FROM na WHERE id = "
	// running counts the point statement on the nodes themselves, where it
	// runs prepared: SELECT pg_sleep($1), bal FROM ... WHERE id = $2.
	running := func() (int, error) {
		n := 0
		for i := range 2 {
			c := connect(t, testNodeDSN(t, i))
			var k int
			err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1", "SELECT pg_sleep(%").Scan(&k)
			c.Close(ctx)
			if err != nil {
				return 0, err
			}
			n += k
		}
		return n, nil
	}
	sleep := func(key int64) (done chan error) {
		done = make(chan error, 1)
		go func() {
			_, err := sleeper.Exec(ctx, fmt.Sprintf("%s%d", sleepSQL, key))
			done <- err
		}()
		pollUntil(t, 10*time.Second, "the point statement to run", func() (bool, error) {
			n, err := running()
			return n == 1, err
		})
		return done
	}
	stopSleep := func(done chan error) {
		for i := range 2 {
			c := connect(t, testNodeDSN(t, i))
			mustExec(t, c, "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE $1", "SELECT pg_sleep(%")
			c.Close(ctx)
		}
		if err := <-done; sqlState(err) != "57014" {
			t.Fatalf("the point statement ended with %v, want a cancel (57014)", err)
		}
	}
	nodeOf := func(idx int) (string, error) {
		var n string
		err := pool.QueryRow(ctx, "SELECT node FROM lattice_shards('na') WHERE shard = $1", idx).Scan(&n)
		return n, err
	}
	ctl := connect(t, p.DSN("lattice"))

	// Off the moving shard: the move completes while the statement runs.
	done := sleep(off)
	mustExec(t, ctl, "SELECT lattice_move_shard('na', 0, 'n2')")
	pollUntil(t, 60*time.Second, "shard 0 to move to n2 beside a point statement on another shard", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("the point statement ended (%v) before the move completed", err)
		default:
		}
		n, err := nodeOf(0)
		return n == "n2", err
	})
	stopSleep(done)
	moveDone := func() (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, "SELECT lattice_rebalance_complete('na')").Scan(&ok)
		return ok, err
	}
	pollUntil(t, 60*time.Second, "the move to be released", moveDone)

	// On the moving shard itself: its freeze waits for the statement
	// before it freezes anything.
	rolledBack := func() float64 {
		fam := scrape(t, p)["lattice_migrator_freeze_seconds"]
		if fam == nil {
			return 0
		}
		n, _ := familySum(fam, map[string]string{"outcome": "rolled_back"})
		return n
	}
	before := rolledBack()
	done = sleep(on)
	mustExec(t, ctl, "SELECT lattice_move_shard('na', 0, 'n1')")
	time.Sleep(5 * time.Second) // five freeze budgets
	if n, err := nodeOf(0); err != nil || n != "n2" {
		t.Fatalf("shard 0 on %q (%v) while a statement on its slots ran, want it held on n2", n, err)
	}
	if n := rolledBack() - before; n != 0 {
		t.Fatalf("%v freezes rolled back while a statement on the moving slots ran, want none tried", n)
	}
	stopSleep(done)
	pollUntil(t, 60*time.Second, "shard 0 to move back to n1", func() (bool, error) {
		n, err := nodeOf(0)
		return n == "n1", err
	})
	pollUntil(t, 60*time.Second, "the move back to be released", moveDone)
	if n := rolledBack() - before; n != 0 {
		t.Fatalf("%v freezes rolled back in the move back, want none", n)
	}
}
