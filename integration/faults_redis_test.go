package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
)

// migrationPhases lists the phases of tree's migrations in redis.
func migrationPhases(ctx context.Context, fc *faultCluster, tree string) ([]shardmap.MigrationPhase, error) {
	migs, err := fc.store.Migrations(ctx, "lattice", tree)
	if err != nil {
		return nil, err
	}
	var out []shardmap.MigrationPhase
	for _, m := range migs {
		out = append(out, m.Phase)
	}
	return out, nil
}

// startWriters runs n insert-only writers through pool until the returned
// stop is called; stop waits for them.
func startWriters(ctx context.Context, pool *pgxpool.Pool, tree string, n int, l *insertLedger) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			insertWriter(wctx, pool, tree, fmt.Sprintf("w%d", i), l, 5*time.Millisecond, 30*time.Second)
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// TestRedisDown stops redis under a proxy. Within its registration lease
// the proxy serves reads and writes from its cached map; once the lease
// lapses it refuses with 57P03 (DESIGN section 5: a proxy whose lease
// expired stops serving until it has re-read the map), and it serves again
// by itself when redis is back. A reshard caught by the outage pauses and
// completes after it, with every acknowledged row in place exactly once.
func TestRedisDown(t *testing.T) {
	fc := startFaultCluster(t, 2)

	t.Run("serves from the cached map within the lease", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const lease = 10 * time.Second
		p := fc.proxy(t, nil, "--proxy-lease", lease.String())
		conn, err := pgx.Connect(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		initial := createFaultTree(t, ctx, conn, "rd_cache", 1000, 4)
		l := newInsertLedger()
		write := func(k string, v int64) error {
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err := conn.Exec(sctx, "INSERT INTO rd_cache (k, v) VALUES ($1, $2)", k, v)
			l.record(k, v, err)
			return err
		}
		if err := write("before", 1); err != nil {
			t.Fatal(err)
		}

		// The proxy heartbeats every second, so its lease holds until at
		// least lease - 1 s - its 0.5 s margin after redis stops: statements
		// in the first 3 s are served from the cached map.
		down := time.Now()
		if err := fc.redis.Stop(); err != nil {
			t.Fatal(err)
		}
		served := 0
		for i := 0; time.Since(down) < 3*time.Second; i++ {
			k := "cached-" + strconv.Itoa(i)
			if err := write(k, int64(i)); err != nil {
				t.Fatalf("write %d, %s after redis stopped: %v", i, time.Since(down).Round(time.Millisecond), err)
			}
			var v int64
			if err := conn.QueryRow(ctx, "SELECT v FROM rd_cache WHERE k = $1", k).Scan(&v); err != nil || v != int64(i) {
				t.Fatalf("read back %s = %d, %v", k, v, err)
			}
			served++
		}
		if served == 0 {
			t.Fatal("no statement ran while redis was down")
		}
		t.Logf("%d writes and reads served from the cached map with redis down", served)

		// The lease lapses: the proxy refuses, it does not guess.
		i := 0
		pollUntil(t, lease+30*time.Second, "the proxy to refuse with 57P03 once its lease lapsed", func() (bool, error) {
			i++
			err := write("lapsed-"+strconv.Itoa(i), int64(i))
			switch code := sqlState(err); {
			case err == nil:
				return false, nil
			case code == "57P03":
				return true, nil
			default:
				return false, fmt.Errorf("SQLSTATE %q (%v), want 57P03", code, err)
			}
		})
		if err := fc.redis.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		pollUntil(t, 30*time.Second, "the proxy to serve again after redis came back", func() (bool, error) {
			i++
			err := write("back-"+strconv.Itoa(i), int64(i))
			if err != nil && sqlState(err) != "57P03" {
				return false, err
			}
			return err == nil, nil
		})
		checkTreeAgainst(t, ctx, fc, "rd_cache", initial, l)
	})

	t.Run("a reshard pauses and resumes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if !fc.redis.Running() {
			if err := fc.redis.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
		p := fc.proxy(t, nil)
		pool, err := pgxpool.New(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		initial := createFaultTree(t, ctx, conn.Conn(), "rd_reshard", 20000, 4)
		conn.Release()
		l := newInsertLedger()
		stop := startWriters(ctx, pool, "rd_reshard", 2, l)
		defer stop()

		if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rd_reshard', 8)"); err != nil {
			t.Fatal(err)
		}
		var at []shardmap.MigrationPhase
		pollUntil(t, 60*time.Second, "a migration to copy or drain", func() (bool, error) {
			var err error
			at, err = migrationPhases(ctx, fc, "rd_reshard")
			return slices.Contains(at, shardmap.PhaseCopy) || slices.Contains(at, shardmap.PhaseDrain), err
		})
		if err := fc.redis.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("redis stopped with migrations in phases %v", at)
		// Down long enough for the proxy's lease to lapse: the writers are
		// refused, which shows the outage reached the proxy.
		pollUntil(t, 30*time.Second, "writers to be refused with 57P03", func() (bool, error) {
			return l.failed("57P03") > 0, nil
		})
		if err := fc.redis.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitReshardComplete(t, ctx, pool, "rd_reshard", 75*time.Second)
		stop()
		checkResharded(t, ctx, fc, pool, "rd_reshard", 8, initial, l)
		acked, failed := l.counts()
		t.Logf("%d inserts acknowledged, %d of unknown outcome (failures by SQLSTATE: %v)", acked, failed, l.failures)
	})
}

// TestRedisCrashMidReshard kills redis-server with SIGKILL in the middle of
// a reshard and starts it again on the same port and data dir: the map and
// the migrations' records come back from the append-only file, and the
// reshard completes with no row lost or duplicated.
func TestRedisCrashMidReshard(t *testing.T) {
	fc := startFaultCluster(t, 2)
	for _, tc := range []struct {
		name  string
		tree  string
		phase shardmap.MigrationPhase
		// hold is a lock on the source table, taken by a transaction
		// without a transaction id, that keeps the migration in its phase
		// until redis is dead: SHARE UPDATE EXCLUSIVE makes CREATE
		// PUBLICATION wait (copy); ROW EXCLUSIVE makes the fence's CREATE
		// TRIGGER time out, so every freeze rolls back to the drain. Reads
		// and writes go through either.
		hold string
	}{
		{"during the shadow copy", "rc_copy", shardmap.PhaseCopy, "SHARE UPDATE EXCLUSIVE"},
		{"during the drain", "rc_drain", shardmap.PhaseDrain, "ROW EXCLUSIVE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if !fc.redis.Running() {
				if err := fc.redis.Restart(ctx); err != nil {
					t.Fatal(err)
				}
			}
			p := fc.proxy(t, nil)
			pool, err := pgxpool.New(ctx, p.DSN("lattice"))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			initial := createFaultTree(t, ctx, conn.Conn(), tc.tree, 20000, 4)
			conn.Release()
			// A reshard 4 -> 5 splits shard 0 (the largest owners tie; the
			// lowest index goes first); the lock on its table holds the
			// migration in its phase.
			release := fc.lockShard(t, ctx, tc.tree, 0, tc.hold)
			defer release()
			l := newInsertLedger()
			stop := startWriters(ctx, pool, tc.tree, 2, l)
			defer stop()
			if _, err := pool.Exec(ctx, "SELECT lattice_reshard($1, 5)", tc.tree); err != nil {
				t.Fatal(err)
			}
			var at []shardmap.MigrationPhase
			pollUntil(t, 60*time.Second, "the migration to reach "+string(tc.phase), func() (bool, error) {
				var err error
				at, err = migrationPhases(ctx, fc, tc.tree)
				return slices.Contains(at, tc.phase), err
			})
			if err := fc.redis.Kill(); err != nil {
				t.Fatal(err)
			}
			t.Logf("redis killed with the migration in phase %v", at)
			release()
			// Down until the proxy's lease lapses, as a crash and restart of
			// a real redis takes a while.
			pollUntil(t, 30*time.Second, "writers to be refused with 57P03", func() (bool, error) {
				return l.failed("57P03") > 0, nil
			})
			if err := fc.redis.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			waitReshardComplete(t, ctx, pool, tc.tree, 75*time.Second)
			stop()
			checkResharded(t, ctx, fc, pool, tc.tree, 5, initial, l)
			acked, failed := l.counts()
			t.Logf("%d inserts acknowledged, %d of unknown outcome (failures by SQLSTATE: %v)", acked, failed, l.failures)
		})
	}
}
