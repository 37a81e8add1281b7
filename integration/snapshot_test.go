package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/shardmap"
)

const (
	bankRows    = 2000
	bankBalance = 100
	bankInsert  = 1_000_000 // ids of the rows the inserter adds, from here up
)

// createBank makes tree name of bankRows accounts of bankBalance each,
// placed as lattice_create_tree's option placement says ("shard_count =>
// 8", "colocate_with => 'g'").
func createBank(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name, placement string) {
	t.Helper()
	for _, q := range []string{
		fmt.Sprintf("CREATE TABLE %s (id bigint PRIMARY KEY, bal bigint NOT NULL)", name),
		fmt.Sprintf("INSERT INTO %s SELECT g, %d FROM generate_series(1, %d) g", name, bankBalance, bankRows),
		fmt.Sprintf("SELECT lattice_create_tree('%s', 'id', %s)", name, placement),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// bankLoad moves money between two accounts in single-statement
// transactions (over two shards, often two nodes: a two-phase commit),
// keeping the total, and one inserter adds zero-balance rows with
// ascending ids, each committed before the next, so that a consistent
// copy holds a prefix of them.
type bankLoad struct {
	transfers, inserts atomic.Int64
	stopping           atomic.Bool
	// stop lets every statement in flight finish, then stops the load.
	// Cancelling one instead would make pgx return at once while the
	// proxy may still be committing it across nodes, and a read of the
	// totals right after could see that commit done on one node and not
	// yet on the other (ci-53: total 199999): a two-phase commit is
	// atomic, but no read spans the nodes' commits.
	stop func() error
}

// bankStopWait bounds the wait for the load's statements in flight; past
// it they are cancelled.
const bankStopWait = time.Minute

func startBankLoad(ctx context.Context, pool *pgxpool.Pool, tree string, writers int) *bankLoad {
	l := &bankLoad{}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for i := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			for runCtx.Err() == nil && !l.stopping.Load() {
				a, b := 1+rng.IntN(bankRows), 1+rng.IntN(bankRows)
				if a == b {
					continue
				}
				q := fmt.Sprintf("UPDATE %s SET bal = bal + CASE WHEN id = %d THEN -1 ELSE 1 END WHERE id = ANY('{%d,%d}')", tree, a, a, b)
				if _, err := pool.Exec(runCtx, q); err != nil {
					if runCtx.Err() == nil {
						errs <- fmt.Errorf("transfer: %w", err)
					}
					return
				}
				l.transfers.Add(1)
			}
		})
	}
	wg.Go(func() {
		for i := 0; runCtx.Err() == nil && !l.stopping.Load(); i++ {
			if _, err := pool.Exec(runCtx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 0)", tree, bankInsert+i)); err != nil {
				if runCtx.Err() == nil {
					errs <- fmt.Errorf("insert: %w", err)
				}
				return
			}
			l.inserts.Add(1)
		}
	})
	l.stop = func() error {
		l.stopping.Store(true)
		done := make(chan struct{})
		go func() {
			wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(bankStopWait):
			cancel()
			<-done
		}
		cancel()
		close(errs)
		return <-errs
	}
	return l
}

// checkBankCopy checks that tree holds a copy of a bank at one instant: the
// total of every account, each original account, and a prefix of the
// inserted rows.
func checkBankCopy(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string) {
	t.Helper()
	var sum, orig, ins, maxIns int64
	rows, err := pool.Query(ctx, "SELECT id, bal FROM "+tree)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, bal int64
		if err := rows.Scan(&id, &bal); err != nil {
			t.Fatal(err)
		}
		sum += bal
		if id < bankInsert {
			orig++
		} else {
			ins++
			maxIns = max(maxIns, id-bankInsert+1)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if sum != bankRows*bankBalance || orig != bankRows || ins != maxIns {
		t.Fatalf("%s: total %d over %d accounts, %d inserted rows up to the %dth; want total %d over %d and a prefix of the inserted rows",
			tree, sum, orig, ins, maxIns, bankRows*bankBalance, bankRows)
	}
	t.Logf("%s: total %d, %d accounts, %d inserted rows (a prefix)", tree, sum, orig, ins)
}

// checkNothingLeft checks that no snapshot left anything behind: no fence
// or fence function of a snapshot on the nodes, no frozen slot of tree, no
// recorded tree operation, and the new tree's shard tables only on the
// shards of its map.
func checkNothingLeft(t *testing.T, ctx context.Context, nodes int, store *shardmap.RedisStore, tree, snap string) {
	t.Helper()
	tables := 0
	for i := range nodes {
		c := connect(t, testNodeDSN(t, i))
		var fences, funcs, n int
		if err := c.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_fence_m_snap%'),
       (SELECT count(*) FROM pg_proc WHERE proname LIKE 'fence_m_snap%'),
       (SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE c.relname = $1 AND c.relkind = 'r' AND s.nspname LIKE 'lattice_s%')`,
			snap).Scan(&fences, &funcs, &n); err != nil {
			t.Fatal(err)
		}
		if fences != 0 || funcs != 0 {
			t.Errorf("node %d keeps %d snapshot fences and %d fence functions", i, fences, funcs)
		}
		tables += n
	}
	_, m := storedTree(t, ctx, store, snap)
	if tables != len(m.OwningShards()) {
		t.Errorf("%d shard tables of %s on the nodes, its map has %d shards", tables, snap, len(m.OwningShards()))
	}
	if _, src := storedTree(t, ctx, store, tree); len(src.Frozen) != 0 {
		t.Errorf("%s still has frozen slots %v", tree, src.Frozen)
	}
	if ops, err := store.TreeOps(ctx, "lattice", tree); err != nil || len(ops) != 0 {
		t.Errorf("tree operations left: %v %v", ops, err)
	}
}

var pauseRE = regexp.MustCompile(`msg="snapshot pause" .*? pause=([0-9.]+[µmn]?s)`)

// snapshotPauses are the write pauses a proxy's log reports.
func snapshotPauses(log string) []time.Duration {
	var out []time.Duration
	for _, m := range pauseRE.FindAllStringSubmatch(log, -1) {
		if d, err := time.ParseDuration(m[1]); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// TestSnapshotUnderLoad: a snapshot taken while writers move money between
// accounts (two-phase commits across nodes) and an inserter adds rows holds
// the invariant total and a prefix of the inserted rows: the tree at one
// instant. Its map is the tree's, its events go out, nothing is left.
func TestSnapshotUnderLoad(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--reshard-tick", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := proxyPool(t, ctx, p)
	listener := connect(t, p.DSN("lattice"))
	mustExec(t, listener, "LISTEN lattice_events")
	createBank(t, ctx, pool, "bank", "shard_count => 8")
	load := startBankLoad(ctx, pool, "bank", 4)
	waitUntil(t, ctx, "the load to start", func() bool { return load.transfers.Load() >= 20 && load.inserts.Load() >= 5 })
	if _, err := pool.Exec(ctx, "SELECT lattice_snapshot('bank', 'bank_snap')"); err != nil {
		load.stop()
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_snapshot_complete('bank_snap')", nil, load.stop)
	before := load.transfers.Load()
	waitUntil(t, ctx, "writes after the snapshot", func() bool { return load.transfers.Load() > before+20 })
	if err := load.stop(); err != nil {
		t.Fatalf("a client saw an error: %v", err)
	}
	checkBankCopy(t, ctx, pool, "bank_snap")
	checkBankCopy(t, ctx, pool, "bank")
	store := harnessStore(t)
	_, src := storedTree(t, ctx, store, "bank")
	snapTree, snap := storedTree(t, ctx, store, "bank_snap")
	if !slices.Equal(src.Slots, snap.Slots) || snapTree.KeyColumn != "id" || snapTree.SlotCount != shardmap.DefaultSlotCount {
		t.Fatal("the snapshot's map or key is not the tree's")
	}
	var ev []string
	for len(ev) < 2 {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.WaitForNotification(wctx)
		wcancel()
		if err != nil {
			t.Fatalf("events seen %v: %v", ev, err)
		}
		for _, name := range []string{migrator.EventSnapshotStarted, migrator.EventSnapshotCompleted} {
			if strings.Contains(n.Payload, `"event":"`+name+`"`) && strings.Contains(n.Payload, `"target_tree":"bank_snap"`) {
				ev = append(ev, name)
			}
		}
	}
	if ev[0] != migrator.EventSnapshotStarted || ev[1] != migrator.EventSnapshotCompleted {
		t.Fatalf("events %v, want started then completed", ev)
	}
	checkNothingLeft(t, ctx, 3, store, "bank", "bank_snap")
	// Counters and the duration histogram, tagged with the tree and tenant.
	tt, bank := []string{"tenant", "tree"}, map[string]string{"tree": "bank", "tenant": "lattice"}
	checkMetrics(t, p, []metricCase{
		{"lattice_snapshot_initiated_total", tt, bank, eq(1), "1 snapshot"},
		{"lattice_snapshot_completed_total", tt, bank, eq(1), "1 snapshot"},
		{"lattice_snapshot_duration_seconds", tt, bank, eq(1), "1 snapshot"},
		{"lattice_snapshot_rows_copied_total", tt, bank, ge(bankRows), "every account at least"},
		{"lattice_snapshot_pause_seconds", []string{"outcome", "tenant", "tree"}, map[string]string{"tree": "bank", "outcome": "held"}, eq(1), "1 pause held"},
	})
	t.Logf("%d transfers, %d inserts; write pauses %v", load.transfers.Load(), load.inserts.Load(), snapshotPauses(p.Log()))
}

// BenchmarkSnapshotPause reports the write pause of snapshots of a tree of
// 8 shards on 3 nodes under the bank load, p50 and p99 over b.N snapshots.
func BenchmarkSnapshotPause(b *testing.B) {
	resetNodes(b)
	ctx := context.Background()
	p := startProxy(b, 3, "--reshard-tick", "200ms")
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	createBank(b, ctx, pool, "bank", "shard_count => 8")
	load := startBankLoad(ctx, pool, "bank", 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bank_snap%d", i)
		if _, err := pool.Exec(ctx, fmt.Sprintf("SELECT lattice_snapshot('bank', '%s')", name)); err != nil {
			b.Fatal(err)
		}
		for done := false; !done; {
			if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT lattice_snapshot_complete('%s')", name)).Scan(&done); err != nil {
				b.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	b.StopTimer()
	if err := load.stop(); err != nil {
		b.Fatal(err)
	}
	ps := snapshotPauses(p.Log())
	if len(ps) == 0 {
		b.Fatal("no pause logged")
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	b.ReportMetric(float64(ps[len(ps)/2].Microseconds())/1000, "pause-p50-ms")
	b.ReportMetric(float64(ps[(len(ps)*99)/100].Microseconds())/1000, "pause-p99-ms")
	b.Logf("%d pauses: %v", len(ps), ps)
}

// countingHold is the real interlocks, counting the times a fold was held.
type countingHold struct {
	migrator.TreeOpInterlocks
	held atomic.Int32
}

func (c *countingHold) HoldFold(ctx context.Context, tenant, tree string) bool {
	h := c.TreeOpInterlocks.HoldFold(ctx, tenant, tree)
	if h {
		c.held.Add(1)
	}
	return h
}

// snapshotHoldProxy starts a proxy on fresh nodes whose snapshot runs are
// held after each node's first copied shard while the returned path
// exists (LATTICE_TEST_HOLD_AT); path.reached appears once one is.
func snapshotHoldProxy(t *testing.T, nodes int) (*proxyProc, string) {
	t.Helper()
	resetNodes(t)
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return startProxyEnv(t, nodes, []string{"LATTICE_TEST_HOLD_AT=snapshot_copy:" + hold}, "--reshard-tick", "200ms"), hold
}

// waitSnapshotHeld waits until a snapshot run is held (snapshotHoldProxy).
func waitSnapshotHeld(t *testing.T, ctx context.Context, hold string) {
	t.Helper()
	waitUntil(t, ctx, "the snapshot held in its copy", func() bool {
		_, err := os.Stat(hold + ".reached")
		return err == nil
	})
}

// TestSnapshotInterlocks holds two snapshots in their copy phase (the
// test-only hold hook) and shows the specification's first rule: a fold of
// the tree that was running goes on draining but neither freezes nor drops
// its donor, and a shrink of the other tree starts no fold; both finish
// once the snapshots are done, and the snapshots hold every row.
func TestSnapshotInterlocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, hold := snapshotHoldProxy(t, 2)
	pool := proxyPool(t, ctx, p)
	createBank(t, ctx, pool, "fa", "shard_count => 4")
	createBank(t, ctx, pool, "fb", "shard_count => 4")
	for _, q := range []string{"SELECT lattice_snapshot('fa', 'fa_snap')", "SELECT lattice_snapshot('fb', 'fb_snap')"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	phase := func(tree string) string {
		var ph string
		if err := pool.QueryRow(ctx, "SELECT phase FROM lattice_snapshot_status($1)", tree).Scan(&ph); err != nil {
			t.Fatal(err)
		}
		return ph
	}
	waitUntil(t, ctx, "both snapshots held in their copy", func() bool {
		_, err := os.Stat(hold + ".reached")
		return err == nil && phase("fa") == migrator.SnapshotCopy && phase("fb") == migrator.SnapshotCopy
	})

	// A shrink of fb starts no fold while fb's snapshot runs.
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('fb', 3)"); err != nil {
		t.Fatal(err)
	}
	store := harnessStore(t)
	folds := func() []*shardmap.Migration {
		migs, err := store.Migrations(ctx, "lattice", "fb")
		if err != nil {
			t.Fatal(err)
		}
		return migs
	}
	waitUntil(t, ctx, "the coordinator to pass fb over twice, or fold it", func() bool {
		return strings.Count(p.Log(), `msg="shrink starts no fold: a snapshot of the tree or a merge into it runs" tree=fb`) >= 2 || len(folds()) > 0
	})
	if migs, err := store.Migrations(ctx, "lattice", "fb"); err != nil || len(migs) != 0 {
		t.Fatalf("a shrink started %d folds of fb while its snapshot ran (%v)", len(migs), err)
	}

	// A fold of fa, run here, is held before its freeze.
	locks := &countingHold{TreeOpInterlocks: migrator.TreeOpInterlocks{Store: store}}
	runner := migrator.NewRunner(ctCluster(t, 2), store, migrator.Options{}, nil, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	migrator.NewCoordinator("it-snapshot-fold", runner, migrator.CoordinatorOptions{}, locks)
	fa, _ := storedTree(t, ctx, store, "fa")
	fold, err := runner.StartFold(ctx, fa, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	folded := make(chan error, 1)
	go func() { folded <- runner.Run(ctx, fold) }()
	waitUntil(t, ctx, "the fold to be held, or to go on", func() bool {
		migs, err := store.Migrations(ctx, "lattice", "fa")
		return locks.held.Load() >= 3 || err != nil || len(migs) != 1 || migs[0].Phase != shardmap.PhasePrepare && migs[0].Phase != shardmap.PhaseCopy && migs[0].Phase != shardmap.PhaseDrain
	})
	migs, err := store.Migrations(ctx, "lattice", "fa")
	if err != nil || len(migs) != 1 || migs[0].Phase != shardmap.PhaseDrain {
		t.Fatalf("the fold left its drain while fa's snapshot ran: %+v %v", migs, err)
	}
	if _, m := storedTree(t, ctx, store, "fa"); m.Shards[1].State != shardmap.ShardActive || len(m.Frozen) != 0 {
		t.Fatalf("fa's donor %+v, frozen %v while the snapshot ran", m.Shards[1], m.Frozen)
	}

	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_snapshot_complete('fa_snap') AND lattice_snapshot_complete('fb_snap')", nil, func() error { return nil })
	if err := <-folded; err != nil {
		t.Fatalf("fold: %v", err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_reshard_complete('fb')", nil, func() error { return nil })
	for _, tree := range []string{"fa", "fa_snap", "fb", "fb_snap"} {
		checkBankCopy(t, ctx, pool, tree)
	}
	if _, m := storedTree(t, ctx, store, "fa"); m.Shards[1].State != shardmap.ShardRetired {
		t.Fatalf("fa's donor is %s after the fold", m.Shards[1].State)
	}
	if _, m := storedTree(t, ctx, store, "fb"); m.DistinctShards() != 3 {
		t.Fatalf("fb has %d shards after its shrink to 3", m.DistinctShards())
	}
}

// TestSnapshotCrash kills the proxy that runs a snapshot (SIGKILL, the
// test-only hook) once its first shard is copied, under the bank load on
// another proxy. A new proxy takes the tree's lease over, drops what the
// dead run made, pauses again and completes; the copy holds the tree at one
// instant and nothing is left behind. Once for a tree alone, once for a
// colocation group's member that is not the tree the group is named after
// (its pause freezes the group's map, its run holds the group's lease).
func TestSnapshotCrash(t *testing.T) {
	for _, tc := range []struct {
		name      string
		setup     []string // statements before the bank is made
		placement string
	}{
		{"tree", nil, "shard_count => 6"},
		{"group member", []string{
			"CREATE TABLE kcg (id bigint PRIMARY KEY, note text)",
			"INSERT INTO kcg SELECT g, 'n' || g FROM generate_series(1, 500) g",
			"SELECT lattice_create_tree('kcg', 'id', shard_count => 6)",
		}, "colocate_with => 'kcg'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms"}
			b := startProxy(t, 3, append([]string{"--coordinator=false"}, fast...)...)
			a := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_AT=snapshot_copy"}, fast...)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			pool := proxyPool(t, ctx, b)
			for _, q := range tc.setup {
				if _, err := pool.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			createBank(t, ctx, pool, "kc", tc.placement)
			load := startBankLoad(ctx, pool, "kc", 2)
			if _, err := pool.Exec(ctx, "SELECT lattice_snapshot('kc', 'kc_snap')"); err != nil {
				load.stop()
				t.Fatal(err)
			}
			if !a.WaitExit(time.Minute) {
				load.stop()
				t.Fatal("the snapshot's proxy did not reach its crash point")
			}
			if err := a.crashedAt("snapshot_copy"); err != nil {
				load.stop()
				t.Fatal(err)
			}
			var done bool
			if err := pool.QueryRow(ctx, "SELECT lattice_snapshot_complete('kc_snap')").Scan(&done); err != nil || done {
				load.stop()
				t.Fatalf("complete after the crash: %v %v, want false", done, err)
			}
			c := startProxy(t, 3, fast...)
			waitFor(t, ctx, pool, "SELECT lattice_snapshot_complete('kc_snap')", nil, load.stop)
			if err := load.stop(); err != nil {
				t.Fatalf("a client saw an error: %v", err)
			}
			if !strings.Contains(c.Log(), "snapshot resumed") || !strings.Contains(c.Log(), `msg="snapshot completed"`) {
				t.Fatal("the new proxy did not resume and complete the snapshot")
			}
			checkBankCopy(t, ctx, pool, "kc_snap")
			checkBankCopy(t, ctx, pool, "kc")
			checkNothingLeft(t, ctx, 3, harnessStore(t), "kc", "kc_snap")
			if tc.setup == nil {
				return
			}
			// The copy is a tree of its own; the group's other member
			// kept its rows.
			store := harnessStore(t)
			if kc, _ := storedTree(t, ctx, store, "kc"); kc.Group != "kcg" {
				t.Errorf("kc is in group %q, want kcg", kc.Group)
			}
			if snap, _ := storedTree(t, ctx, store, "kc_snap"); snap.Group != "" {
				t.Errorf("kc_snap is in group %q, want none", snap.Group)
			}
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM kcg").Scan(&n); err != nil || n != 500 {
				t.Errorf("kcg holds %d rows (%v), want 500", n, err)
			}
		})
	}
}

// TestSnapshotRefusesDDL: DDL on a tree is refused with 55000 while a
// snapshot copies it, held after each node's first shard. A TRUNCATE or a
// rewriting ALTER TABLE committed then would make the shards not yet copied
// read as empty under the pause's snapshot (neither is MVCC-safe), and the
// new tree would silently lack their rows. Once the snapshot is complete
// the copy holds every row and the DDL runs.
func TestSnapshotRefusesDDL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, hold := snapshotHoldProxy(t, 2)
	pool := proxyPool(t, ctx, p)
	createBank(t, ctx, pool, "sd", "shard_count => 4")
	if _, err := pool.Exec(ctx, "SELECT lattice_snapshot('sd', 'sd_snap')"); err != nil {
		t.Fatal(err)
	}
	waitSnapshotHeld(t, ctx, hold)
	ddl := []string{"TRUNCATE sd", "ALTER TABLE sd ALTER COLUMN bal TYPE numeric"}
	for _, q := range ddl {
		_, err := pool.Exec(ctx, q)
		var pgErr *pgconn.PgError
		switch {
		case !errors.As(err, &pgErr) || pgErr.Code != "55000":
			t.Errorf("%s during the snapshot's copy: got %v, want SQLSTATE 55000", q, err)
		case !strings.Contains(pgErr.Hint, "lattice_snapshot_complete('sd_snap')"):
			t.Errorf("%s: hint %q does not say to wait for lattice_snapshot_complete('sd_snap')", q, pgErr.Hint)
		}
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_snapshot_complete('sd_snap')", nil, func() error { return nil })
	checkBankCopy(t, ctx, pool, "sd_snap")
	for _, q := range ddl {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s after the snapshot: %v", q, err)
		}
	}
	checkBankCopy(t, ctx, pool, "sd_snap")
}

// TestSnapshotHoldsMoveRelease: a shard moved while a snapshot copies the
// tree (held after each node's first shard) flips, but keeps its table on
// its old node, which the snapshot copies from, until the snapshot is
// complete. Before, the move dropped that table: the snapshot's copy
// failed, and it paused the tree's writes and copied everything again.
func TestSnapshotHoldsMoveRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, hold := snapshotHoldProxy(t, 3)
	pool := proxyPool(t, ctx, p)
	createBank(t, ctx, pool, "sm", "shard_count => 6")
	// The last shard of a node with several is copied after the hold.
	byNode := map[string][]int{}
	rows, err := pool.Query(ctx, "SELECT shard, node FROM lattice_shards('sm') ORDER BY shard")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var idx int
		var node string
		if err := rows.Scan(&idx, &node); err != nil {
			t.Fatal(err)
		}
		byNode[node] = append(byNode[node], idx)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	moved, from := -1, ""
	for n, idxs := range byNode {
		if len(idxs) > 1 {
			moved, from = idxs[len(idxs)-1], n
		}
	}
	to := map[string]string{"n1": "n2", "n2": "n3", "n3": "n1"}[from]
	if moved < 0 {
		t.Fatalf("no node holds two shards of sm: %v", byNode)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_snapshot('sm', 'sm_snap')"); err != nil {
		t.Fatal(err)
	}
	waitSnapshotHeld(t, ctx, hold)
	if _, err := pool.Exec(ctx, "SELECT lattice_move_shard('sm', $1, $2)", moved, to); err != nil {
		t.Fatal(err)
	}
	const held = `msg="move held: a snapshot of the tree runs"`
	store := harnessStore(t)
	onTarget := func() bool {
		var node string
		if err := pool.QueryRow(ctx, "SELECT node FROM lattice_shards('sm') WHERE shard = $1", moved).Scan(&node); err != nil {
			t.Fatal(err)
		}
		return node == to
	}
	waitUntil(t, ctx, "the move held before its release, or done", func() bool {
		migs, err := store.Migrations(ctx, "lattice", "sm")
		return strings.Contains(p.Log(), held) || err == nil && len(migs) == 0 && onTarget()
	})
	if !onTarget() {
		t.Fatalf("shard %d held before the move's flip to %s", moved, to)
	}
	if !strings.Contains(p.Log(), held) {
		t.Errorf("the move of shard %d ended while the snapshot copied the tree", moved)
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_snapshot_complete('sm_snap') AND lattice_rebalance_complete('sm')", nil, func() error { return nil })
	if strings.Contains(p.Log(), "snapshot resumed") {
		t.Error("the snapshot failed and ran again: the move dropped a table it had still to copy")
	}
	checkBankCopy(t, ctx, pool, "sm_snap")
	checkBankCopy(t, ctx, pool, "sm")
	var left int
	if err := connect(t, testNodeDSN(t, int(from[1]-'1'))).QueryRow(ctx,
		"SELECT count(*) FROM pg_class WHERE relname = 'sm' AND relnamespace = to_regnamespace($1)", fmt.Sprintf("lattice_s%04d", moved)).Scan(&left); err != nil || left != 0 {
		t.Errorf("the moved shard's old table is left on %s: %d (%v)", from, left, err)
	}
}
