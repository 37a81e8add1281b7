package migrator

import (
	"slices"
	"testing"

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
