package migrator

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// TestResizeRun walks the resize of one shard through the pipeline: a new
// index on the same node takes every slot, the old index retires and its
// table goes.
func TestResizeRun(t *testing.T) {
	r := newRig(t)
	run := r.runner("")
	before := r.mapNow()
	mig, err := run.StartResize(r.ctx, r.tree, 1)
	if err != nil {
		t.Fatal(err)
	}
	if mig.Target != before.HighWater || mig.TargetNode != before.Shards[1].Node || mig.SourceNode != mig.TargetNode {
		t.Fatalf("resize target %d on %s, want %d on %s", mig.Target, mig.TargetNode, before.HighWater, before.Shards[1].Node)
	}
	if _, err := r.run(run, mig); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
	m := r.mapNow()
	if m.Shards[1].State != shardmap.ShardRetired || m.Shards[mig.Target].State != shardmap.ShardActive || m.Shards[mig.Target].Mixed {
		t.Errorf("after the resize: source %+v, target %+v", m.Shards[1], m.Shards[mig.Target])
	}
	if !r.nodes.called("create "+strconv.Itoa(mig.Target)) || !r.nodes.called("drop 1") {
		t.Errorf("target not created or source not dropped: %v", r.nodes.calls)
	}
	want := []shardmap.MigrationPhase{shardmap.PhasePrepare, shardmap.PhaseCopy, shardmap.PhaseDrain,
		shardmap.PhaseFreeze, shardmap.PhaseFlip, shardmap.PhaseRelease, shardmap.PhaseDone}
	if got := r.store.recorded(); !slices.Equal(got, want) {
		t.Errorf("phases recorded %v, want %v", got, want)
	}
	if got := testutil.ToFloat64(run.metrics.ResizeShards.WithLabelValues("items", "app", "resized")); got != 1 {
		t.Errorf("resized shards counted %v, want 1", got)
	}
	// A shard in a migration is not resized.
	if _, err := run.StartResize(r.ctx, r.tree, 1); err == nil {
		t.Error("a retired shard was resized")
	}
	other, err := run.StartSplit(r.ctx, r.tree, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.StartResize(r.ctx, r.tree, 2); !errors.Is(err, ErrBusy) {
		t.Errorf("resize of the source of split %s: %v, want ErrBusy", other.ID, err)
	}
}

// TestFoldOfForwardedDonor: a fold takes as its donor a shard a resize is
// still forwarding, without waiting for it. The donor refuses retirement:
// the fold completes routing-only and the donor keeps its table. The
// resize then finds its source retired and gives the shard up, dropping
// its target and, the fold being over, the donor's table.
func TestFoldOfForwardedDonor(t *testing.T) {
	r := newRig(t)
	run := r.runner("")
	rz, err := run.StartResize(r.ctx, r.tree, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b, fwd := foldBusy(inFlight([]*shardmap.Migration{rz})); b[1] || !fwd[1] {
		t.Fatalf("a shrink's plan holds the forwarded shard busy (%v) or not forwarded (%v)", b, fwd)
	}
	fold, err := run.StartFold(r.ctx, r.tree, 1, 0)
	if err != nil {
		t.Fatalf("fold of a donor a resize forwards: %v (a resize is not waited for)", err)
	}
	if err := run.Run(r.ctx, fold); err != nil {
		t.Fatal(err)
	}
	if m := r.mapNow(); m.Shards[1].State != shardmap.ShardRetired || m.Slots[fold.Slots[0][0]] != 0 || r.stored(fold) != nil {
		t.Fatalf("fold not completed: donor %+v, slot %d -> %d", m.Shards[1], fold.Slots[0][0], m.Slots[fold.Slots[0][0]])
	}
	if r.nodes.called("drop 1") || r.nodes.rows(1, fold.Slots) == 0 {
		t.Fatal("the fold dropped the donor a resize forwards")
	}
	if got := testutil.ToFloat64(run.metrics.RoutingOnlyFolds.WithLabelValues("items", "app", ReasonResizeInFlight)); got != 1 {
		t.Errorf("routing-only folds counted %v, want 1", got)
	}
	if err := run.Run(r.ctx, r.stored(rz)); err != nil {
		t.Fatal(err)
	}
	m := r.mapNow()
	if _, ok := m.Shards[rz.Target]; ok {
		t.Errorf("the abandoned resize's target is still in the map: %+v", m.Shards[rz.Target])
	}
	if m.HighWater <= rz.Target {
		t.Errorf("high-water %d does not pass the abandoned target %d", m.HighWater, rz.Target)
	}
	if !r.nodes.called("drop 1") || !r.nodes.called("drop "+strconv.Itoa(rz.Target)) {
		t.Errorf("the abandoned resize left tables: %v", r.nodes.calls)
	}
	if r.stored(rz) != nil {
		t.Error("the abandoned resize's record is left")
	}
	if got := testutil.ToFloat64(run.metrics.ResizeShards.WithLabelValues("items", "app", "abandoned")); got != 1 {
		t.Errorf("abandoned shards counted %v, want 1", got)
	}
}

// TestResizeAndFoldNeverFreezeTogether: a resize does not freeze while a
// fold of its source is in flight, and a fold does not begin on a donor
// whose slots a resize froze; the one that comes second sees the other.
func TestResizeAndFoldNeverFreezeTogether(t *testing.T) {
	r := newRig(t)
	run := r.runner("")
	rz, err := run.StartResize(r.ctx, r.tree, 1)
	if err != nil {
		t.Fatal(err)
	}
	fold, err := run.StartFold(r.ctx, r.tree, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.mayFreeze(r.ctx, r.mapNow(), rz); !errors.Is(err, errResizeYields) {
		t.Errorf("resize freezes beside a fold of its source: %v", err)
	}
	// The resize froze first: the fold is dropped before it changes anything.
	if _, err := run.updateMap(r.ctx, "app", "items", func(m *shardmap.Map) (bool, error) {
		m.Frozen = append(m.Frozen, rz.Slots...)
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := run.Run(r.ctx, fold); err != nil {
		t.Fatal(err)
	}
	if r.stored(fold) != nil {
		t.Error("a fold of a donor a resize froze was not dropped")
	}
	if m := r.mapNow(); m.Shards[0].Mixed || m.Shards[1].State != shardmap.ShardActive {
		t.Errorf("the dropped fold changed the map: %+v %+v", m.Shards[0], m.Shards[1])
	}
	// Frozen (past forwarding), the resized shard is busy for a shrink.
	rz.Phase = shardmap.PhaseFreeze
	if b, _ := foldBusy([]*shardmap.Migration{rz}); !b[1] {
		t.Error("a frozen resize's source may be folded")
	}
	if _, err := run.StartFold(r.ctx, r.tree, 2, 1); !errors.Is(err, ErrBusy) {
		t.Errorf("a fold into a shard a resize forwards: %v, want ErrBusy", err)
	}
}

// TestResizeLayoutArguments reads lattice_resize's arguments as the proxy
// passes them (text), each refusal with its SQLSTATE.
func TestResizeLayoutArguments(t *testing.T) {
	s := func(v string) *string { return &v }
	for _, tc := range []struct {
		args map[string]*string
		want string // Layout.String, or the SQLSTATE
	}{
		{map[string]*string{"fillfactor": s("70")}, "fillfactor => 70"},
		{map[string]*string{"fillfactor": s("50"), "index_fillfactor": s("60"), "deduplicate": s("off")}, "fillfactor => 50, index_fillfactor => 60, deduplicate => false"},
		{map[string]*string{"fillfactor": s("100"), "deduplicate": s("true")}, "fillfactor => 100, deduplicate => true"},
		{map[string]*string{}, "22004"},
		{map[string]*string{"index_fillfactor": s("60")}, "22004"},
		{map[string]*string{"fillfactor": s("9")}, "22023"},
		{map[string]*string{"fillfactor": s("seventy")}, "22023"},
		{map[string]*string{"fillfactor": s("70"), "index_fillfactor": s("0")}, "22023"},
		{map[string]*string{"fillfactor": s("70"), "index_fillfactor": s("101")}, "22023"},
		{map[string]*string{"fillfactor": s("70"), "deduplicate": s("maybe")}, "22023"},
	} {
		l, err := resizeLayout(tc.args)
		got := l.String()
		if err != nil {
			got = sqlstate.As(err).Code
		}
		if got != tc.want {
			t.Errorf("%v: %s, want %s", tc.args, got, tc.want)
		}
	}
}

// TestToRewrite: the shards a resize still rewrites are those created
// before its layout that own slots and are not being rewritten.
func TestToRewrite(t *testing.T) {
	m := shardmap.NewIdentityMap("app", "items", 64, 4, []string{"n1"})
	m.Shards[5] = shardmap.Shard{Index: 5, Node: "n1", State: shardmap.ShardActive}
	for s := 48; s < 64; s++ {
		m.Slots[s] = 5 // shard 3 resized into 5 already
	}
	m.Shards[3] = shardmap.Shard{Index: 3, Node: "n1", State: shardmap.ShardRetired}
	rz := []*shardmap.Migration{{Kind: shardmap.Resize, Source: 1, Target: 4}}
	if got := toRewrite(m, 4, rz); !slices.Equal(got, []int{0, 2}) {
		t.Errorf("toRewrite = %v, want [0 2]", got)
	}
}
