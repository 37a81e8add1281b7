package migrator

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TestSplitSourcesSkipInFlight: a grow does not split the source or the
// target of a move until the move is done. The target's write log (5.5)
// relies on it: another move's release of those slots would delete past
// the log (replica mode, the migrator setting), and the move's comparison
// through the log would then fail a good copy.
func TestSplitSourcesSkipInFlight(t *testing.T) {
	m := &shardmap.Map{Slots: make([]int, 8), Shards: map[int]shardmap.Shard{
		0: {Index: 0, State: shardmap.ShardActive},
		1: {Index: 1, State: shardmap.ShardActive},
		2: {Index: 2, State: shardmap.ShardActive},
	}}
	for s := range m.Slots {
		m.Slots[s] = s / 3 // 0: 0-2, 1: 3-5, 2: 6-7
	}
	for _, tc := range []struct {
		phase shardmap.MigrationPhase
		want  []int
	}{
		{shardmap.PhaseFlip, []int{2}},
		{shardmap.PhaseVerifyFailed, []int{2}},
		{shardmap.PhaseRelease, []int{2}},
		{shardmap.PhaseDone, []int{0, 1, 2}},
	} {
		mig := &shardmap.Migration{Kind: shardmap.Split, Source: 0, Target: 1, Phase: tc.phase}
		got := splitSources(m, inFlight([]*shardmap.Migration{mig}))
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("phase %s: split sources %v, want %v", tc.phase, got, tc.want)
		}
	}
}

// TestComparisonsAndFreezesApart: a freeze waits while another move of
// the tree is compared on a node it shares, and a comparison while another
// move freezes on one, so that the comparison's scans do not take the
// pause's CPU and I/O; moves on other nodes do not wait for each other.
func TestComparisonsAndFreezesApart(t *testing.T) {
	mig := &shardmap.Migration{ID: "m", SourceNode: "n1", TargetNode: "n2"}
	for _, tc := range []struct {
		phase          shardmap.MigrationPhase
		source, target string
		freeze, cmp    bool // holdsFreeze, holdsComparison
	}{
		{shardmap.PhaseFlip, "n2", "n3", true, false},
		{shardmap.PhaseFlip, "n3", "n1", true, false},
		{shardmap.PhaseFlip, "n3", "n3", false, false},
		{shardmap.PhaseFreeze, "n1", "n3", false, true},
		{shardmap.PhaseFreeze, "n3", "n2", false, true},
		{shardmap.PhaseFreeze, "n3", "n3", false, false},
		{shardmap.PhaseCopy, "n3", "n1", true, false},
		{shardmap.PhaseCopy, "n1", "n2", false, false},
		{shardmap.PhaseRelease, "n1", "n3", true, false},
		{shardmap.PhaseDrain, "n1", "n2", false, false},
	} {
		o := &shardmap.Migration{ID: "o", Phase: tc.phase, SourceNode: tc.source, TargetNode: tc.target}
		if got := holdsFreeze(o, mig); got != tc.freeze {
			t.Errorf("%s %s->%s: holds the freeze %v, want %v", tc.phase, tc.source, tc.target, got, tc.freeze)
		}
		if got := holdsComparison(o, mig); got != tc.cmp {
			t.Errorf("%s %s->%s: holds the comparison %v, want %v", tc.phase, tc.source, tc.target, got, tc.cmp)
		}
	}
}

// TestTickBoundedByBudget: a shrink's first tick asks the nodes for row
// counts and never gets an answer. The tick gives up at its budget (half
// the lease), and a later tick plans the folds, so the reshard completes.
// Without the budget the coordinator waited on that call for ever, and no
// tree's reshard went on.
func TestTickBoundedByBudget(t *testing.T) {
	r := newRig(t)
	r.nodes.rowCountStalls = 1
	c := NewCoordinator("c1", r.runner(""), CoordinatorOptions{Tick: 20 * time.Millisecond, LeaseTTL: 400 * time.Millisecond}, nil)
	r.runCoordinator(t, c)
	if _, err := c.Reshard(r.ctx, "app", "items", 2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := r.store.Reshard(r.ctx, "app", "items")
		if errors.Is(err, shardmap.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shrink did not complete in 20 s after a row count that never answered (map %v)", r.mapNow().Shards)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := r.mapNow().DistinctShards(); got != 2 {
		t.Fatalf("shrunk to %d shards, want 2", got)
	}
	r.nodes.mu.Lock()
	defer r.nodes.mu.Unlock()
	if r.nodes.rowCountStalls != 0 {
		t.Fatal("no row count stalled: the test tested nothing")
	}
}
