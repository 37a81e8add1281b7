package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// loadLedger is what clients were told: per key, the version of the last
// acknowledged write and whether it was a delete. Each key has one writer
// and versions only grow, so a read is stale exactly when it shows an
// older version than the one acknowledged before the read began.
type loadLedger struct {
	mu      sync.Mutex
	acked   map[string]loadEntry
	deletes map[string]int64 // last delete issued per key, acknowledged or not
}

type loadEntry struct {
	ver     int64
	deleted bool
}

func (l *loadLedger) get(k string) loadEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked[k]
}

// reshardLoad runs writers and readers through the proxies while it
// reshards, and returns the first client error or stale read.
type reshardLoad struct {
	pools   []*pgxpool.Pool
	ledger  *loadLedger
	version atomic.Int64
	keys    int
	writes  atomic.Int64
	reads   atomic.Int64
	// tolerate lists SQLSTATEs a fault test expects (counted in refused,
	// not fatal): refusals of a statement that did not run, and 08006, a
	// lost connection, whose write may or may not have committed. The
	// ledger's checks accept both outcomes of such a write: versions only
	// grow, and a delete is recorded in deletes before it is sent.
	tolerate  []string
	refused   atomic.Int64
	refusedMu sync.Mutex
	refusedAt []time.Time
	// pick, if set, chooses writer w's next key number (one with n%4 == w,
	// so that each key keeps one writer); uniform otherwise.
	pick func(rng *rand.Rand, w int) int
}

// refusal reports whether err is one of the tolerated refusals, and
// notes when it came.
func (r *reshardLoad) refusal(err error) bool {
	if !slices.Contains(r.tolerate, sqlState(err)) {
		return false
	}
	r.refused.Add(1)
	r.refusedMu.Lock()
	r.refusedAt = append(r.refusedAt, time.Now())
	r.refusedMu.Unlock()
	return true
}

// refusalTimes is when each tolerated refusal came.
func (r *reshardLoad) refusalTimes() []time.Time {
	r.refusedMu.Lock()
	defer r.refusedMu.Unlock()
	return slices.Clone(r.refusedAt)
}

func (r *reshardLoad) writer(ctx context.Context, w int) error {
	rng := rand.New(rand.NewPCG(uint64(w), 99))
	pool := r.pools[w%len(r.pools)]
	for ctx.Err() == nil {
		n := rng.IntN(r.keys/4)*4 + w
		if r.pick != nil {
			n = r.pick(rng, w)
		}
		k := "c-" + strconv.Itoa(n)
		ver := r.version.Add(1)
		var err error
		del := rng.IntN(5) == 0
		if del {
			r.ledger.mu.Lock()
			r.ledger.deletes[k] = ver
			r.ledger.mu.Unlock()
			_, err = pool.Exec(ctx, "DELETE FROM catalogue WHERE k = $1", k)
		} else {
			_, err = pool.Exec(ctx, "INSERT INTO catalogue (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", k, ver)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil // cut off by the end of the run: never acknowledged
			}
			if r.refusal(err) {
				continue
			}
			return fmt.Errorf("writer %d, key %s: %w", w, k, err)
		}
		r.ledger.mu.Lock()
		r.ledger.acked[k] = loadEntry{ver: ver, deleted: del}
		r.ledger.mu.Unlock()
		r.writes.Add(1)
	}
	return nil
}

func (r *reshardLoad) reader(ctx context.Context, i int) error {
	rng := rand.New(rand.NewPCG(uint64(i), 1234))
	pool := r.pools[i%len(r.pools)]
	for ctx.Err() == nil {
		k := "c-" + strconv.Itoa(rng.IntN(r.keys))
		before := r.ledger.get(k)
		var v int64
		err := pool.QueryRow(ctx, "SELECT v FROM catalogue WHERE k = $1", k).Scan(&v)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			r.ledger.mu.Lock()
			deletedSince := r.ledger.deletes[k] > before.ver
			r.ledger.mu.Unlock()
			if !before.deleted && !deletedSince {
				return fmt.Errorf("stale read of %s through proxy %d at %s: no row, but version %d was acknowledged before the read", k, i%len(r.pools), time.Now().Format(time.StampMilli), before.ver)
			}
		case err != nil:
			if ctx.Err() != nil || r.refusal(err) {
				continue
			}
			return fmt.Errorf("reader %d, key %s: %w", i, k, err)
		case v < before.ver:
			return fmt.Errorf("stale read of %s through proxy %d at %s: version %d, but %d (deleted %v) was acknowledged before the read", k, i%len(r.pools), time.Now().Format(time.StampMilli), v, before.ver, before.deleted)
		}
		r.reads.Add(1)
	}
	return nil
}

// TestReshardUnderLoad is the online reshard's main proof: a tree of 64
// shards on 3 nodes with 200,000 rows is resharded 64 -> 16 -> 128 -> 64
// while 4 writers and 2 readers work through one proxy.
func TestReshardUnderLoad(t *testing.T) { reshardUnderLoad(t, 1) }

// TestReshardUnderLoadTwoProxies is the same proof through two proxies
// sharing Redis: every freeze and flip is acknowledged by both. A test of
// its own, so that make test's parts run the two at once.
func TestReshardUnderLoadTwoProxies(t *testing.T) { reshardUnderLoad(t, 2) }

func reshardUnderLoad(t *testing.T, proxies int) {
	if testing.Short() {
		t.Skip("long: reshards a 200,000-row tree three times")
	}
	resetNodes(t)
	// Three reshards took 7.5 min on a 2-core machine under load 20.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var procs []*proxyProc
	for range proxies {
		procs = append(procs, startProxy(t, 3))
	}
	load := &reshardLoad{keys: 200_000, ledger: &loadLedger{acked: map[string]loadEntry{}, deletes: map[string]int64{}}}
	for _, p := range procs {
		pool, err := pgxpool.New(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		load.pools = append(load.pools, pool)
	}
	admin := load.pools[0]
	for _, q := range []string{
		"CREATE TABLE catalogue (k text PRIMARY KEY, v bigint NOT NULL, pad text)",
		"INSERT INTO catalogue SELECT 'c-' || g, 0, md5(g::text) FROM generate_series(0, 199999) g",
		"SELECT lattice_create_tree('catalogue', 'k', shard_count => 64)",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for n := 0; n < load.keys; n++ {
		load.ledger.acked["c-"+strconv.Itoa(n)] = loadEntry{}
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- load.writer(runCtx, i) }()
	}
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- load.reader(runCtx, i) }()
	}
	failed := func() error {
		select {
		case err := <-errs:
			if err != nil {
				return err
			}
		default:
		}
		return nil
	}
	for _, n := range []int{16, 128, 64} {
		start := time.Now()
		if _, err := admin.Exec(ctx, "SELECT lattice_reshard('catalogue', $1)", n); err != nil {
			stop()
			t.Fatalf("lattice_reshard(%d): %v", n, err)
		}
		for {
			var done bool
			if err := admin.QueryRow(ctx, "SELECT lattice_reshard_complete('catalogue')").Scan(&done); err != nil {
				stop()
				t.Fatal(err)
			}
			if done {
				break
			}
			if err := failed(); err != nil {
				stop()
				t.Fatal(err)
			}
			select {
			case <-ctx.Done():
				stop()
				t.Fatalf("reshard to %d did not complete", n)
			case <-time.After(200 * time.Millisecond):
			}
		}
		t.Logf("resharded to %d in %s (%d writes, %d reads so far)", n, time.Since(start).Round(time.Millisecond), load.writes.Load(), load.reads.Load())
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if load.writes.Load() == 0 || load.reads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads", load.writes.Load(), load.reads.Load())
	}
	verifyReshardedTree(t, ctx, admin, load.ledger, 64)
}

// verifyReshardedTree checks, on the nodes directly, that every
// acknowledged write is present exactly once with its last value, that the
// tree has the target number of shards, and that nothing of a migration or
// of a retired donor is left.
func verifyReshardedTree(t *testing.T, ctx context.Context, proxy *pgxpool.Pool, ledger *loadLedger, shards int) {
	t.Helper()
	dsns := make([]string, 3)
	for i := range dsns {
		dsns[i] = testNodeDSN(t, i)
	}
	verifyLedgerOn(t, ctx, proxy, dsns, ledger, shards)
}

// verifyLedgerOn is verifyReshardedTree over the nodes at dsns (n1, n2, ...).
func verifyLedgerOn(t *testing.T, ctx context.Context, proxy *pgxpool.Pool, dsns []string, ledger *loadLedger, shards int) {
	t.Helper()
	// The proxy serves lattice_shards only whole (SELECT * FROM ...).
	rows, err := proxy.Query(ctx, "SELECT * FROM lattice_shards('catalogue')")
	if err != nil {
		t.Fatal(err)
	}
	type shardRow struct {
		idx        int32
		node       string
		state      string
		slotsOwned int32
	}
	var all []shardRow
	for rows.Next() {
		var s shardRow
		var schema, ranges string
		var estimate *int64
		var group *string
		var reads, writes, written float64
		if err := rows.Scan(&s.idx, &s.node, &schema, &ranges, &s.slotsOwned, &s.state, &estimate, &group, &reads, &writes, &written); err != nil {
			t.Fatal(err)
		}
		all = append(all, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	owning := 0
	for _, s := range all {
		if s.slotsOwned > 0 {
			owning++
		}
	}
	if owning != shards {
		t.Fatalf("lattice_shards shows %d shards owning slots, want %d", owning, shards)
	}
	seen := map[string]int{}
	values := map[string]int64{}
	for i, dsn := range dsns {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		node := fmt.Sprintf("n%d", i+1)
		for _, s := range all {
			if s.node != node {
				continue
			}
			table := fmt.Sprintf("lattice_s%04d.catalogue", s.idx)
			var exists bool
			if err := c.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if s.state == "retired" {
				if exists {
					t.Errorf("retired shard %d still has its table on %s", s.idx, node)
				}
				continue
			}
			rs, err := c.Query(ctx, "SELECT k, v FROM "+table)
			if err != nil {
				t.Fatal(err)
			}
			var k string
			var v int64
			if _, err := pgx.ForEachRow(rs, []any{&k, &v}, func() error {
				seen[k]++
				values[k] = v
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		var left int
		if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_publication)
			+ (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_fence_m_%')`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("node %s: %d replication slots, publications or fences left", node, left)
		}
		c.Close(ctx)
	}
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	bad := 0
	for k, e := range ledger.acked {
		switch {
		case e.deleted && seen[k] != 0:
			// A delete may have been followed by an unacknowledged
			// re-insert cut off at the end; it carries a newer version.
			if values[k] <= e.ver {
				bad++
				t.Errorf("key %s: deleted at version %d, present with %d", k, e.ver, values[k])
			}
		case !e.deleted && seen[k] == 0 && ledger.deletes[k] > e.ver:
			// A delete cut off at the end may have committed unacknowledged.
		case !e.deleted && seen[k] != 1:
			bad++
			t.Errorf("key %s: present %d times, want once", k, seen[k])
		case !e.deleted && values[k] < e.ver:
			bad++
			t.Errorf("key %s: version %d, last acknowledged %d", k, values[k], e.ver)
		}
		if bad > 20 {
			t.Fatal("too many differences")
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("key %s stored %d times", k, n)
		}
	}
}

// seedAndRun makes the ledger's tree, catalogue, of load.keys rows on
// shards shards through load.pools[0], and starts 4 writers and 2 readers
// through all the pools. stop ends them; each sends its result on errs
// and is done in wg.
func (load *reshardLoad) seedAndRun(t *testing.T, ctx context.Context, shards int) (stop context.CancelFunc, wg *sync.WaitGroup, errs chan error) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE catalogue (k text PRIMARY KEY, v bigint NOT NULL, pad text)",
		fmt.Sprintf("INSERT INTO catalogue SELECT 'c-' || g, 0, md5(g::text) FROM generate_series(0, %d) g", load.keys-1),
		fmt.Sprintf("SELECT lattice_create_tree('catalogue', 'k', shard_count => %d)", shards),
	} {
		if _, err := load.pools[0].Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for n := 0; n < load.keys; n++ {
		load.ledger.acked["c-"+strconv.Itoa(n)] = loadEntry{}
	}
	runCtx, stop := context.WithCancel(ctx)
	wg = &sync.WaitGroup{}
	errs = make(chan error, 6)
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- load.writer(runCtx, i) }()
	}
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- load.reader(runCtx, i) }()
	}
	return stop, wg, errs
}
