package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

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

// waitServedFromCache waits until p's registration has lapsed and it serves
// from its cached map, and then until l's writers have had 20 more inserts
// acknowledged.
func waitServedFromCache(t *testing.T, p *proxyProc, l *insertLedger) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the proxy to serve from its cached map", func() (bool, error) {
		return strings.Contains(p.Log(), "serving from the cached maps"), nil
	})
	before, _ := l.counts()
	pollUntil(t, 30*time.Second, "writes acknowledged from the cached map", func() (bool, error) {
		acked, _ := l.counts()
		return acked >= before+20, nil
	})
}

// TestRedisDown stops redis under a proxy. The proxy serves reads and
// writes from its cached map past its registration lease: it holds its
// presence sessions on the nodes, so no coordinator can move a slot under
// it (TestProxyCutOffFromRedis). Once a node ends one of those sessions it
// refuses with 57P03, and it serves again by itself when redis is back. A
// reshard caught by the outage pauses and completes after it, with every
// acknowledged row in place exactly once.
func TestRedisDown(t *testing.T) {
	fc := startFaultCluster(t, 2)

	t.Run("serves from the cached map through the outage", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const lease = 2 * time.Second
		p := fc.proxy(t, nil, "--proxy-lease", lease.String())
		conn, err := pgx.Connect(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		initial := createFaultTree(t, ctx, conn, "rd_cache", 1000, 4)
		cluster, err := fc.store.ClusterID(ctx)
		if err != nil {
			t.Fatal(err)
		}
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

		down := time.Now()
		if err := fc.redis.Stop(); err != nil {
			t.Fatal(err)
		}
		// Served throughout, well past the lease, which the proxy's log
		// shows has lapsed.
		served := 0
		for i := 0; time.Since(down) < lease+3*time.Second || !strings.Contains(p.Log(), "serving from the cached maps"); i++ {
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
		t.Logf("%d writes and reads served from the cached map in the %s redis was down", served, time.Since(down).Round(time.Second))
		// It says so, and stays ready for a balancer: it serves.
		if r := adminCall(t, ctx, p, "GET", "/readyz", ""); r.status != http.StatusOK {
			t.Errorf("/readyz while serving from the cache: %d %s", r.status, r.body)
		}
		if r := adminCall(t, ctx, p, "GET", "/metrics", ""); !strings.Contains(string(r.body), "\nlattice_proxy_serving_cached 1\n") {
			t.Error("/metrics does not show lattice_proxy_serving_cached 1 while serving from the cache")
		}

		// A node ends the proxy's presence: from then on the proxy cannot
		// tell whether a coordinator moved slots without it. It refuses;
		// it does not guess.
		endPresence(t, ctx, fc.nodeDSN(1), cluster)
		i := 0
		pollUntil(t, 30*time.Second, "the proxy to refuse with 57P03 once a node ended its presence", func() (bool, error) {
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
		p := fc.proxy(t, nil, "--proxy-lease", "2s")
		pool := proxyPool(t, ctx, p)
		initial := createFaultTreeIn(t, ctx, pool, "rd_reshard", 20000, 4)
		l := newInsertLedger()
		stop := startWriters(ctx, pool, "rd_reshard", 2, l)
		defer stop()

		// Shard 0's split is held in its copy (the lock keeps its
		// publication from being made) until Redis is down, so that a
		// migration is in flight then, however fast the others run.
		held := fc.lockShard(t, ctx, "rd_reshard", 0, "SHARE UPDATE EXCLUSIVE")
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
		held()
		t.Logf("redis stopped with migrations in phases %v", at)
		// Down past the proxy's lease: the writers go on from the cached map.
		waitServedFromCache(t, p, l)
		if err := fc.redis.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitReshardComplete(t, ctx, pool, "rd_reshard", 75*time.Second)
		stop()
		checkResharded(t, ctx, fc, pool, "rd_reshard", 8, initial, l)
		acked, failed := l.counts()
		t.Logf("%d inserts acknowledged, %d of unknown outcome (failures by SQLSTATE: %v)", acked, failed, l.failures)
		// A statement for slots frozen when redis stopped waits for a flip
		// that cannot come and fails after the hold (55000); nothing else
		// may fail, and the proxy never refused.
		for code, n := range l.failures {
			if code != "55000" {
				t.Errorf("%d inserts failed with %s", n, code)
			}
		}
	})
}

// TestProxyCutOffFromRedis cuts one proxy off from Redis (its Redis user is
// disabled) while the coordinating proxy keeps Redis, and reshards
// meanwhile. The cut-off proxy's registration lapses, but it holds its
// presence sessions on the nodes: it serves from its cached map, and the
// coordinator counts it as lagging, so no freeze gets past it and no read
// through it is stale. Once let back in, it re-reads the map, acknowledges,
// and the reshard completes with every acknowledged value in place.
func TestProxyCutOffFromRedis(t *testing.T) {
	fc := startFaultCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin := redis.NewClient(&redis.Options{Addr: fc.redis.Addr})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "cutoff", "on", ">cutoff", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	coord := fc.proxy(t, nil)
	cut := startProxyOn(t, "redis://cutoff:cutoff@"+fc.redis.Addr+"/0", fc.nodeDSNs(), nil,
		"--coordinator=false", "--proxy-lease", "2s")
	poolB := proxyPool(t, ctx, coord)
	poolA := proxyPool(t, ctx, cut)
	initial := createFaultTreeIn(t, ctx, poolB, "cutoff", 20000, 4)
	keys := make([]string, 32)
	for i := range keys {
		keys[i] = "k-" + strconv.Itoa(i*617)
	}
	var v int64
	if err := poolA.QueryRow(ctx, "SELECT v FROM cutoff WHERE k = $1", keys[0]).Scan(&v); err != nil {
		t.Fatal(err)
	}

	for _, cmd := range [][]any{{"ACL", "SETUSER", "cutoff", "off"}, {"CLIENT", "KILL", "USER", "cutoff"}} {
		if err := admin.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	pollUntil(t, 30*time.Second, "the cut-off proxy to serve from its cached map", func() (bool, error) {
		return strings.Contains(cut.Log(), "serving from the cached maps"), nil
	})
	if _, err := poolB.Exec(ctx, "SELECT lattice_reshard('cutoff', 8)"); err != nil {
		t.Fatal(err)
	}

	// Updates through the coordinating proxy give each key ever higher
	// values; reads through the cut-off one must never see a value older
	// than the last update acknowledged before the read began.
	l := newInsertLedger()
	var stale, reads atomic.Int64
	var readErr atomic.Value
	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		// Each update runs to its end, so that every outcome is known.
		for n := int64(1_000_000); wctx.Err() == nil; n++ {
			k := keys[n%int64(len(keys))]
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := poolB.Exec(sctx, "UPDATE cutoff SET v = $2 WHERE k = $1", k, n)
			cancel()
			l.record(k, n, err)
		}
	})
	wg.Go(func() {
		for i := 0; wctx.Err() == nil; i++ {
			k := keys[i%len(keys)]
			l.mu.Lock()
			floor, ok := l.acked[k]
			l.mu.Unlock()
			if !ok {
				floor = initial[k]
			}
			var got int64
			if err := poolA.QueryRow(wctx, "SELECT v FROM cutoff WHERE k = $1", k).Scan(&got); err != nil {
				if wctx.Err() == nil {
					readErr.CompareAndSwap(nil, err)
				}
				return
			}
			reads.Add(1)
			if got < floor {
				stale.Add(1)
			}
		}
	})
	stopAll := func() { stopWork(); wg.Wait() }
	defer stopAll()

	// Freezes are tried and rolled back: the cut-off proxy holds them up.
	pollUntil(t, 90*time.Second, "freezes to be tried while the proxy is cut off", func() (bool, error) {
		migs, err := fc.store.Migrations(ctx, "lattice", "cutoff")
		freezes := 0
		for _, m := range migs {
			freezes += m.Freezes
			if m.Phase == shardmap.PhaseFlip || m.Phase == shardmap.PhaseRelease || m.Phase == shardmap.PhaseDone {
				return false, fmt.Errorf("migration %s reached %s while a proxy serving from its cached map was cut off", m.ID, m.Phase)
			}
		}
		return freezes >= 4, err
	})
	if n := stale.Load(); n > 0 {
		t.Fatalf("%d stale reads through the cut-off proxy", n)
	}
	if !strings.Contains(coord.Log(), "waiting for proxies cut off from Redis") {
		t.Error("the coordinator never said it waits for the cut-off proxy")
	}
	held := reads.Load()

	if err := admin.Do(ctx, "ACL", "SETUSER", "cutoff", "on").Err(); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, poolB, "cutoff", 90*time.Second)
	stopAll()
	if err, _ := readErr.Load().(error); err != nil {
		t.Fatalf("a read through the cut-off proxy failed: %v", err)
	}
	if n := stale.Load(); n > 0 {
		t.Fatalf("%d stale reads through the proxy", n)
	}
	for code, n := range l.failures {
		t.Errorf("%d updates failed with %s", n, code)
	}
	t.Logf("%d reads through the proxy while it was cut off, %d in all, none stale", held, reads.Load())
	checkResharded(t, ctx, fc, poolB, "cutoff", 8, initial, l)
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
			pool := proxyPool(t, ctx, p)
			initial := createFaultTreeIn(t, ctx, pool, tc.tree, 20000, 4)
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
			// Down past the proxy's lease, as a crash and restart of a real
			// redis takes a while: the writers go on from the cached map.
			waitServedFromCache(t, p, l)
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
