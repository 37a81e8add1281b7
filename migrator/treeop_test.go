package migrator

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/shardmap"
)

func newOpStore(t *testing.T) *shardmap.RedisStore {
	t.Helper()
	mr := miniredis.RunT(t)
	s := shardmap.NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
	t.Cleanup(func() { s.Close() })
	return s
}

func TestTreeOpInterlocks(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name              string
		op                shardmap.TreeOp
		tree              string
		resize, snapOrMrg bool
	}{
		{"snapshot of the tree", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Tree: "a", Target: "a2"}, "a", false, true},
		{"snapshot's new tree", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Tree: "a", Target: "a2"}, "a2", false, false},
		{"merge into the tree", shardmap.TreeOp{Kind: shardmap.OpMerge, Tree: "src", Target: "a"}, "a", false, true},
		{"merge from the tree", shardmap.TreeOp{Kind: shardmap.OpMerge, Tree: "a", Target: "dst"}, "a", false, false},
		{"resize of the tree", shardmap.TreeOp{Kind: shardmap.OpResize, Tree: "a"}, "a", true, false},
		{"another tree", shardmap.TreeOp{Kind: shardmap.OpResize, Tree: "b"}, "a", false, false},
		// The coordinator asks with a colocation group's map name ("g"),
		// the operations name the member they were called on.
		{"snapshot of a group member", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Tree: "m", Map: "g", Target: "m2"}, "g", false, true},
		{"merge into a group member", shardmap.TreeOp{Kind: shardmap.OpMerge, Tree: "src", Target: "m", TargetMap: "g"}, "g", false, true},
		{"merge from a group member", shardmap.TreeOp{Kind: shardmap.OpMerge, Tree: "m", Map: "g", Target: "dst"}, "g", false, false},
		{"resize of a group member", shardmap.TreeOp{Kind: shardmap.OpResize, Tree: "m", Map: "g"}, "g", true, false},
		{"resize of a group member, asked by its name", shardmap.TreeOp{Kind: shardmap.OpResize, Tree: "m", Map: "g"}, "m", true, false},
		{"another group", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Tree: "m", Map: "h", Target: "m2"}, "g", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newOpStore(t)
			op := tc.op
			op.ID, op.Tenant, op.Attempt = "op1", "app", "x"
			if _, err := s.StartTreeOp(ctx, &op); err != nil {
				t.Fatal(err)
			}
			il := TreeOpInterlocks{Store: s}
			if got := il.ResizeInFlight(ctx, "app", tc.tree); got != tc.resize {
				t.Errorf("ResizeInFlight = %v, want %v", got, tc.resize)
			}
			if got := il.SnapshotOrMergeRunning(ctx, "app", tc.tree); got != tc.snapOrMrg {
				t.Errorf("SnapshotOrMergeRunning = %v, want %v", got, tc.snapOrMrg)
			}
			if got := il.HoldFold(ctx, "app", tc.tree); got != tc.snapOrMrg {
				t.Errorf("HoldFold = %v, want %v", got, tc.snapOrMrg)
			}
			if il.SnapshotOrMergeRunning(ctx, "other", tc.tree) || il.ResizeInFlight(ctx, "other", tc.tree) {
				t.Error("another tenant's tree is held")
			}
		})
	}
}

func TestTreeOpRunnerResumes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newOpStore(t)
	store := &phaseStore{Store: s}
	opts := CoordinatorOptions{Tick: time.Hour, LeaseTTL: time.Minute}
	a := NewTreeOpRunner("proxy-a", store, opts, slog.New(slog.DiscardHandler))
	runs := make(chan *TreeOpRun, 4)
	release := make(chan struct{})
	a.Handle(shardmap.OpSnapshot, func(ctx context.Context, run *TreeOpRun) error {
		run.Op.Phase, run.Op.RowsDone = "copy", 5
		if err := run.Save(ctx); err != nil {
			return err
		}
		runs <- run
		<-release
		return run.Save(ctx)
	})
	op := &shardmap.TreeOp{Tenant: "app", Kind: shardmap.OpSnapshot, Tree: "acct", Target: "acct2"}
	if other, err := a.Start(ctx, op); err != nil || other != nil {
		t.Fatalf("start: %v %v", other, err)
	}
	a.Tick(ctx)
	first := <-runs
	if first.Resumed {
		t.Fatal("the first run of an operation started here counts as resumed")
	}
	// Another proxy neither runs it (the lease is a's) nor claims it.
	b := NewTreeOpRunner("proxy-b", store, opts, slog.New(slog.DiscardHandler))
	b.Handle(shardmap.OpSnapshot, func(ctx context.Context, run *TreeOpRun) error {
		runs <- run
		return nil
	})
	b.Tick(ctx)
	select {
	case run := <-runs:
		t.Fatalf("proxy b ran %+v while a holds the lease", run.Op)
	default:
	}
	// a dies: its lease expires and b resumes the operation; a's late
	// writes are refused.
	if err := s.ReleaseLease(ctx, "app", "acct", "proxy-a"); err != nil {
		t.Fatal(err)
	}
	b.Tick(ctx)
	b.Wait()
	second := <-runs
	if !second.Resumed || second.Op.Phase != "copy" || second.Op.RowsDone != 5 {
		t.Fatalf("resumed run %+v (resumed %v), want phase copy with 5 rows, resumed", second.Op, second.Resumed)
	}
	close(release)
	a.Wait()
	if err := first.Save(ctx); !errors.Is(err, shardmap.ErrAttempt) && !errors.Is(err, shardmap.ErrNotFound) {
		t.Fatalf("dead run's write: %v, want it refused", err)
	}
	if ops, _ := s.TreeOps(ctx, "app", "acct"); len(ops) != 0 {
		t.Fatalf("finished operation still recorded: %+v", ops[0])
	}
}

// countingInterlocks answers HoldFold from TreeOpInterlocks and counts the
// times it held.
type countingInterlocks struct {
	TreeOpInterlocks
	held atomic.Int32
}

func (c *countingInterlocks) HoldFold(ctx context.Context, tenant, tree string) bool {
	h := c.TreeOpInterlocks.HoldFold(ctx, tenant, tree)
	if h {
		c.held.Add(1)
	}
	return h
}

func (c *countingInterlocks) HoldMoveRelease(ctx context.Context, tenant, tree string) bool {
	h := c.TreeOpInterlocks.HoldMoveRelease(ctx, tenant, tree)
	if h {
		c.held.Add(1)
	}
	return h
}

// waitHeld waits until the interlocks have held a run three times; what
// names the run in the failure.
func (c *countingInterlocks) waitHeld(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.held.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%s was never held", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMoveReleaseHeldBySnapshot: a move flips while a snapshot of the tree
// is recorded, but keeps the table on its old node, which the snapshot
// copies from, until the snapshot is gone; then it drops it and finishes.
// A merge into the tree holds no move.
func TestMoveReleaseHeldBySnapshot(t *testing.T) {
	r := newRig(t)
	merge := &shardmap.TreeOp{ID: "merge1", Tenant: "app", Kind: shardmap.OpMerge, Tree: "other", Target: "items", Attempt: "x"}
	if _, err := r.store.StartTreeOp(r.ctx, merge); err != nil {
		t.Fatal(err)
	}
	mig := r.start(shardmap.Move)
	locks := &countingInterlocks{TreeOpInterlocks: TreeOpInterlocks{Store: r.store}}
	run := r.runner("")
	run.interlocks = locks
	snap := &shardmap.TreeOp{ID: "snap1", Tenant: "app", Kind: shardmap.OpSnapshot, Tree: "items", Target: "copy", Attempt: "x"}
	if _, err := r.store.StartTreeOp(r.ctx, snap); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Run(r.ctx, mig) }()
	locks.waitHeld(t, "the move")
	if stored := r.stored(mig); stored == nil || stored.Phase != shardmap.PhaseRelease {
		t.Fatalf("held move in phase %v, want %s", stored, shardmap.PhaseRelease)
	}
	if r.nodes.called("drop 0") {
		t.Fatal("the moved shard's old table was dropped while the snapshot ran")
	}
	if err := r.store.FinishTreeOp(r.ctx, "app", "snap1"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !r.nodes.called("drop 0") || r.stored(mig) != nil {
		t.Fatal("the move did not finish once the snapshot ended")
	}
}

// TestFoldHeldBySnapshot: a fold neither freezes nor drops its donor while
// a snapshot of the tree is recorded, and finishes once it is gone.
func TestFoldHeldBySnapshot(t *testing.T) {
	for _, at := range []shardmap.MigrationPhase{shardmap.PhaseDrain, shardmap.PhaseRelease} {
		t.Run(string(at), func(t *testing.T) {
			r := newRig(t)
			mig := r.start(shardmap.Fold)
			locks := &countingInterlocks{TreeOpInterlocks: TreeOpInterlocks{Store: r.store}}
			run := r.runner("")
			run.interlocks = locks
			snap := &shardmap.TreeOp{ID: "snap1", Tenant: "app", Kind: shardmap.OpSnapshot, Tree: "items", Target: "copy", Attempt: "x"}
			if at == shardmap.PhaseRelease {
				// Recorded after the flip, before the release.
				r.store.onPhase = func(p shardmap.MigrationPhase) {
					if p == shardmap.PhaseRelease {
						if _, err := r.store.StartTreeOp(r.ctx, snap); err != nil {
							t.Error(err)
						}
					}
				}
			} else if _, err := r.store.StartTreeOp(r.ctx, snap); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- run.Run(r.ctx, mig) }()
			locks.waitHeld(t, "the fold")
			stored := r.stored(mig)
			if stored == nil || stored.Phase != at {
				t.Fatalf("held fold in phase %v, want %s", stored, at)
			}
			if r.nodes.called("drop 1") {
				t.Fatal("the donor was dropped while the snapshot ran")
			}
			if err := r.store.FinishTreeOp(r.ctx, "app", "snap1"); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !r.nodes.called("drop 1") || r.stored(mig) != nil {
				t.Fatal("the fold did not finish once the snapshot ended")
			}
		})
	}
}
