package migrator

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

// TestTargetReplaysDDLStillRunning: DDL that passed its reshard check
// before a split or move was recorded, and logs itself after the run read
// the tree's entry, reaches the migration's target: prepare waits for the
// tree's DDL lock (the fake's WaitTreeDDL ends the statement) and builds
// the target from the entry read after it. Built from the entry read at
// the run's start, the target lacked the column or index (a missing unique
// index lets duplicates in).
func TestTargetReplaysDDLStillRunning(t *testing.T) {
	for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Move} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t)
			mig := r.start(kind)
			r.nodes.mu.Lock()
			r.nodes.ddlRunning = func() {
				r.swapTree(func(t *shardmap.Tree) {
					t.DDL = append(t.DDL, raceAlter)
					t.Columns = append(t.Columns, "color")
				})
			}
			r.nodes.mu.Unlock()
			if err := r.runner("").Run(r.ctx, mig); err != nil {
				t.Fatal(err)
			}
			r.nodes.mu.Lock()
			defer r.nodes.mu.Unlock()
			target := fmt.Sprintf("%s/%d", mig.TargetNode, mig.Target)
			if got := r.nodes.replayed[target]; !slices.Contains(got, raceAlter) {
				t.Errorf("%s target %s replayed %q, without the ALTER TABLE that ended after the run began", kind, target, got)
			}
			if r.nodes.ddlRunning != nil {
				t.Errorf("%s: prepare never waited for the tree's DDL", kind)
			}
		})
	}
}
