package integration

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

type fakeInterlocks struct{ resize, snapshot bool }

func (f *fakeInterlocks) ResizeInFlight(context.Context, string, string) bool { return f.resize }
func (f *fakeInterlocks) SnapshotOrMergeRunning(context.Context, string, string) bool {
	return f.snapshot
}
func (f *fakeInterlocks) HoldFold(context.Context, string, string) bool        { return false }
func (f *fakeInterlocks) HoldMoveRelease(context.Context, string, string) bool { return false }

type reshardEnv struct {
	t       *testing.T
	ctx     context.Context
	cluster *pgshard.Cluster
	store   *shardmap.RedisStore
	metrics *migrator.Metrics
	runner  *migrator.Runner
	coord   *migrator.Coordinator
	locks   *fakeInterlocks
	cat     *pgx.Conn
}

func newReshardEnv(t *testing.T, ctx context.Context) *reshardEnv {
	resetNodes(t)
	e := &reshardEnv{t: t, ctx: ctx, cluster: ctCluster(t, 2), metrics: migrator.NewMetrics(nil), locks: &fakeInterlocks{}}
	var err error
	if e.store, err = shardmap.OpenRedis(ctx, testRedisURL(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.store.Close() })
	if e.cat, err = pgx.Connect(ctx, testNodeDSN(t, 0)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.cat.Close(context.Background()) })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.runner = migrator.NewRunner(e.cluster, e.store, migrator.Options{}, e.metrics, log)
	e.coord = migrator.NewCoordinator("coord-a", e.runner, migrator.CoordinatorOptions{}, e.locks)
	return e
}

func (e *reshardEnv) tree(name string, rows, shards int) *shardmap.Tree {
	ctExec(e.t, e.ctx, e.cat, `CREATE TABLE `+name+` (k text PRIMARY KEY, v int)`)
	if rows > 0 {
		ctExec(e.t, e.ctx, e.cat, `INSERT INTO `+name+` SELECT 'k' || g, g FROM generate_series(1, `+strconv.Itoa(rows)+`) g`)
	}
	tr, _, err := e.cluster.CreateTree(e.ctx, e.store, pgshard.TreeSpec{Table: name, KeyColumn: "k", ShardCount: shards})
	if err != nil {
		e.t.Fatal(err)
	}
	return tr
}

func (e *reshardEnv) sqlState(err error) string {
	var se *sqlstate.Error
	if errors.As(err, &se) {
		return se.Code
	}
	return ""
}

// run ticks the coordinator until the reshard of tree completes.
func (e *reshardEnv) run(tree string) {
	for {
		done, err := e.coord.ReshardComplete(e.ctx, "lattice", tree)
		if err != nil {
			e.t.Fatal(err)
		}
		if done {
			return
		}
		if err := e.coord.Tick(e.ctx, "lattice", tree); err != nil && !errors.Is(err, shardmap.ErrNotFound) {
			e.t.Fatal(err)
		}
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("reshard of %s did not complete: %v", tree, e.ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (e *reshardEnv) distinct(tree string) *shardmap.Map {
	m, err := e.store.Map(e.ctx, "lattice", tree)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// TestReshardSemantics checks each row of the specification's Semantics
// table, the Shrinking rules and the telemetry counters, against real
// nodes and Redis, with the coordinator ticked by the test.
func TestReshardSemantics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newReshardEnv(t, ctx)
	e.tree("cat", 3000, 4)

	t.Run("target range", func(t *testing.T) {
		for _, c := range []struct {
			tree   string
			n      int
			reason string
		}{{"cat", 1, migrator.ReasonMin}, {"cat", 0, migrator.ReasonMin}, {"cat", 4097, migrator.ReasonMax}} {
			_, err := e.coord.Reshard(ctx, "lattice", c.tree, c.n)
			if e.sqlState(err) != "22023" {
				t.Errorf("n=%d: got %v, want SQLSTATE 22023", c.n, err)
			}
			if r := (*migrator.Rejected)(nil); !errors.As(err, &r) || r.Reason != c.reason {
				t.Errorf("n=%d: got %v, want a rejection with reason %s", c.n, err, c.reason)
			}
			if got := testutil.ToFloat64(e.metrics.ReshardRejected.WithLabelValues(c.tree, "lattice", c.reason)); got == 0 {
				t.Errorf("n=%d: rejection not counted with reason %s", c.n, c.reason)
			}
		}
	})

	t.Run("same count is a no-op", func(t *testing.T) {
		epoch := e.distinct("cat").Epoch
		msg, err := e.coord.Reshard(ctx, "lattice", "cat", 4)
		if err != nil || !strings.Contains(msg, "already has 4") {
			t.Fatalf("got %q %v", msg, err)
		}
		if done, _ := e.coord.ReshardComplete(ctx, "lattice", "cat"); !done || e.distinct("cat").Epoch != epoch {
			t.Fatal("a no-op reshard changed something")
		}
	})

	t.Run("grow, idempotence and concurrent target", func(t *testing.T) {
		if _, err := e.coord.Reshard(ctx, "lattice", "cat", 7); err != nil {
			t.Fatal(err)
		}
		if done, _ := e.coord.ReshardComplete(ctx, "lattice", "cat"); done {
			t.Fatal("complete right after starting a reshard of a non-empty tree")
		}
		if msg, err := e.coord.Reshard(ctx, "lattice", "cat", 7); err != nil || !strings.Contains(msg, "already running") {
			t.Fatalf("repeat: %q %v", msg, err)
		}
		if _, err := e.coord.Reshard(ctx, "lattice", "cat", 5); e.sqlState(err) != "55000" {
			t.Fatalf("different target: %v, want 55000", err)
		}
		if got := testutil.ToFloat64(e.metrics.ReshardRejected.WithLabelValues("cat", "lattice", migrator.ReasonInProgress)); got != 1 {
			t.Fatalf("already_in_progress counted %v times", got)
		}
		// Another coordinator does nothing while this one holds the lease.
		other := migrator.NewCoordinator("coord-b", e.runner, migrator.CoordinatorOptions{}, nil)
		if err := other.Tick(ctx, "lattice", "cat"); err != nil {
			t.Fatal(err)
		}
		if err := e.coord.Tick(ctx, "lattice", "cat"); err != nil {
			t.Fatal(err)
		}
		if migs, _ := e.store.Migrations(ctx, "lattice", "cat"); len(migs) > 3 {
			t.Fatalf("%d migrations for a grow from 4 to 7 (two coordinators ran?)", len(migs))
		}
		e.run("cat")
		m := e.distinct("cat")
		if m.DistinctShards() != 7 {
			t.Fatalf("%d distinct shards after growing to 7", m.DistinctShards())
		}
		tr, _ := e.store.Tree(ctx, "lattice", "cat")
		if tr.ShardCount != 7 {
			t.Fatalf("registry shard count %d", tr.ShardCount)
		}
		if testutil.ToFloat64(e.metrics.ReshardInitiated.WithLabelValues("cat", "lattice")) != 1 ||
			testutil.ToFloat64(e.metrics.ReshardCompleted.WithLabelValues("cat", "lattice")) != 1 ||
			testutil.ToFloat64(e.metrics.CoordinatorCompleted.WithLabelValues("cat", "lattice", "reshard")) != 1 {
			t.Fatal("initiated, completed and coordinator completed must each count 1")
		}
	})

	var retired []int
	t.Run("shrink retires donors and never reuses them", func(t *testing.T) {
		e.locks.snapshot = true
		if _, err := e.coord.Reshard(ctx, "lattice", "cat", 3); err != nil {
			t.Fatal(err)
		}
		if err := e.coord.Tick(ctx, "lattice", "cat"); err != nil {
			t.Fatal(err)
		}
		if migs, _ := e.store.Migrations(ctx, "lattice", "cat"); len(migs) != 0 {
			t.Fatalf("a fold started while a snapshot or merge runs: %d migrations", len(migs))
		}
		e.locks.snapshot = false
		e.run("cat")
		m := e.distinct("cat")
		if m.DistinctShards() != 3 {
			t.Fatalf("%d distinct shards after shrinking to 3", m.DistinctShards())
		}
		for idx, sh := range m.Shards {
			if sh.State == shardmap.ShardRetired {
				retired = append(retired, idx)
				if idx >= m.HighWater {
					t.Errorf("retired shard %d is at or above the high-water mark %d", idx, m.HighWater)
				}
			}
		}
		if len(retired) != 4 {
			t.Fatalf("retired shards %v, want 4", retired)
		}
		if got := testutil.ToFloat64(e.metrics.ConsolidationsCommitted.WithLabelValues("cat", "lattice", strconv.Itoa(retired[0]))); got != 1 {
			t.Errorf("consolidation of donor %d counted %v times", retired[0], got)
		}
		var rows int
		for _, idx := range m.OwningShards() {
			p, _ := e.cluster.Admin(ctx, m.Shards[idx].Node, "lattice")
			var n int
			if err := p.QueryRow(ctx, "SELECT count(*) FROM "+pgshard.ShardTable(&shardmap.Tree{Name: "cat"}, idx)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			rows += n
		}
		if rows != 3000 {
			t.Fatalf("%d rows after grow and shrink, want 3000", rows)
		}
		// A later grow allocates above every retired index.
		tr, _ := e.store.Tree(ctx, "lattice", "cat")
		mig, err := e.runner.StartSplit(ctx, tr, m.OwningShards()[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range retired {
			if mig.Target == r {
				t.Fatalf("split target %d reuses a retired index", r)
			}
		}
		// A fold refuses a pair while either side is the target of an
		// in-flight migration.
		if _, err := e.runner.StartFold(ctx, tr, mig.Target, m.OwningShards()[1]); err == nil {
			t.Fatal("a fold of a split's target was accepted while the split is in flight")
		}
		if err := e.runner.Run(ctx, mig); err != nil {
			t.Fatal(err)
		}
		// A retired shard refuses to become a split source.
		if _, err := e.runner.StartSplit(ctx, tr, retired[0]); err == nil {
			t.Fatal("a retired shard was accepted as a split source")
		}
	})

	t.Run("resize interlock", func(t *testing.T) {
		e.locks.resize = true
		defer func() { e.locks.resize = false }()
		if _, err := e.coord.Reshard(ctx, "lattice", "cat", 6); e.sqlState(err) != "55000" {
			t.Fatalf("non-empty tree during a resize: %v, want 55000", err)
		}
		if testutil.ToFloat64(e.metrics.ReshardRejected.WithLabelValues("cat", "lattice", migrator.ReasonResizeInFlight)) != 1 {
			t.Fatal("resize_in_flight not counted")
		}
		// The empty-tree re-pin is decided before the resize check.
		ctExec(t, ctx, e.cat, "CREATE TABLE empty1 (k text PRIMARY KEY)")
		if _, _, err := e.cluster.CreateTree(ctx, e.store, pgshard.TreeSpec{Table: "empty1", KeyColumn: "k", ShardCount: 4}); err != nil {
			t.Fatal(err)
		}
		msg, err := e.coord.Reshard(ctx, "lattice", "empty1", 6)
		if err != nil || !strings.Contains(msg, "re-pinned") {
			t.Fatalf("empty tree during a resize: %q %v", msg, err)
		}
	})

	t.Run("empty tree re-pin revives retired indices", func(t *testing.T) {
		m := e.distinct("cat")
		for idx, sh := range m.Shards {
			if sh.State == shardmap.ShardRetired {
				continue
			}
			p, _ := e.cluster.Admin(ctx, sh.Node, "lattice")
			if _, err := p.Exec(ctx, "DELETE FROM "+pgshard.ShardTable(&shardmap.Tree{Name: "cat"}, idx)); err != nil {
				t.Fatal(err)
			}
		}
		before := testutil.ToFloat64(e.metrics.ReshardCompleted.WithLabelValues("cat", "lattice"))
		msg, err := e.coord.Reshard(ctx, "lattice", "cat", 8)
		if err != nil || !strings.Contains(msg, "re-pinned") {
			t.Fatalf("got %q %v", msg, err)
		}
		if done, _ := e.coord.ReshardComplete(ctx, "lattice", "cat"); !done {
			t.Fatal("a re-pin left a reshard running")
		}
		if testutil.ToFloat64(e.metrics.ReshardCompleted.WithLabelValues("cat", "lattice")) != before+1 {
			t.Fatal("the re-pin did not count as completed")
		}
		n := e.distinct("cat")
		if n.DistinctShards() != 8 || len(n.Frozen) != 0 {
			t.Fatalf("after re-pin: %d shards, frozen %v", n.DistinctShards(), n.Frozen)
		}
		want := shardmap.NewIdentityMap("lattice", "cat", 4096, 8, []string{"x"})
		for s := range n.Slots {
			if n.Slots[s] != want.Slots[s] {
				t.Fatalf("slot %d owned by %d, identity map says %d", s, n.Slots[s], want.Slots[s])
			}
		}
		for _, r := range retired {
			if r >= 8 {
				continue
			}
			if n.Shards[r].State != shardmap.ShardActive {
				t.Errorf("retired index %d not revived", r)
			}
			p, _ := e.cluster.Admin(ctx, n.Shards[r].Node, "lattice")
			var exists bool
			if err := p.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgshard.ShardTable(&shardmap.Tree{Name: "cat"}, r)).Scan(&exists); err != nil || !exists {
				t.Errorf("revived shard %d has no table (%v)", r, err)
			}
		}
		var fences int
		for i := range 2 {
			c, err := pgx.Connect(ctx, testNodeDSN(t, i))
			if err != nil {
				t.Fatal(err)
			}
			var n int
			if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_fence_m_%'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			fences += n
			c.Close(ctx)
		}
		if fences != 0 {
			t.Fatalf("%d fences left after the re-pin", fences)
		}
	})
}
