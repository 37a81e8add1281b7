package migrator

import (
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TestMergeETA extrapolates a merge's time left from the source shards its
// pass drained.
func TestMergeETA(t *testing.T) {
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	four := []MergeSource{{Shard: 0}, {Shard: 1}, {Shard: 2}, {Shard: 3}}
	tests := []struct {
		name  string
		st    MergeState
		phase string
		eta   float64 // -1: NULL
	}{
		{"sources not recorded yet", MergeState{}, MergeCopying, -1},
		{"nothing drained", MergeState{Sources: four}, MergeCopying, -1},
		{"one of four drained", MergeState{Sources: four, Done: []int{0}}, MergeCopying, 60},
		{"every shard drained", MergeState{Sources: four, Done: []int{0, 1, 2, 3}}, MergeCopying, 0},
		{"a re-drain's new pass", MergeState{Sources: four, Redrains: 1}, MergeCopying, -1},
		{"failed", MergeState{Sources: four, Done: []int{0}}, shardmap.OpFailed, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeETA(&shardmap.TreeOp{Started: started, Phase: tc.phase}, tc.st, started.Add(20*time.Second))
			switch {
			case tc.eta < 0 && got != nil:
				t.Errorf("ETA %v, want NULL", *got)
			case tc.eta >= 0 && (got == nil || *got != tc.eta):
				t.Errorf("ETA %v, want %v", got, tc.eta)
			}
		})
	}
}
