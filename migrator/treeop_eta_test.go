package migrator

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
)

// TestTreeOpETA: each kind's estimate is the one its status function
// reports, read from the operation's record (and, for a resize, the map).
func TestTreeOpETA(t *testing.T) {
	ctx := context.Background()
	s := newOpStore(t)
	tree := &shardmap.Tree{Tenant: "app", Name: "items", KeyColumn: "id", KeyType: shardmap.KeyText,
		Columns: []string{"id"}, SlotCount: 16, ShardCount: 4, DDL: []string{"CREATE TABLE {{table}} (id text PRIMARY KEY)"}}
	if err := s.CreateTree(ctx, tree, shardmap.NewIdentityMap("app", "items", 16, 4, []string{"n1"})); err != nil {
		t.Fatal(err)
	}
	f := NewFunctions(nil, s, nil, nil, nil)
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := started.Add(60 * time.Second)
	state := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	four := []MergeSource{{Shard: 0}, {Shard: 1}, {Shard: 2}, {Shard: 3}}
	tests := []struct {
		name string
		op   shardmap.TreeOp
		eta  float64 // -1: none
	}{
		{"snapshot pausing", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Phase: SnapshotPause}, -1},
		{"snapshot copying, no row yet", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Phase: SnapshotCopy, RowsTotal: 100}, -1},
		{"snapshot copied a quarter", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Phase: SnapshotCopy, RowsDone: 25, RowsTotal: 100}, 180},
		{"snapshot registering", shardmap.TreeOp{Kind: shardmap.OpSnapshot, Phase: SnapshotRegister, RowsDone: 100, RowsTotal: 100}, 0},
		{"merge drained one of four", shardmap.TreeOp{Kind: shardmap.OpMerge, Phase: "copy", State: state(MergeState{Sources: four, Done: []int{0}})}, 180},
		{"merge drained none", shardmap.TreeOp{Kind: shardmap.OpMerge, Phase: "copy", State: state(MergeState{Sources: four})}, -1},
		// Shards 0 and 1 are below the mark, 2 and 3 were rewritten.
		{"resize rewrote half", shardmap.TreeOp{Kind: shardmap.OpResize, Phase: resizeRewrite,
			State: state(resizeState{Layout: btreeindex.Layout{Fillfactor: 70}, HighWater: 2, Shards: 4})}, 60},
		{"resize recording its layout", shardmap.TreeOp{Kind: shardmap.OpResize, Phase: shardmap.OpIntent,
			State: state(resizeState{Layout: btreeindex.Layout{Fillfactor: 70}})}, -1},
		{"a kind of another build", shardmap.TreeOp{Kind: "compact", Phase: "copy"}, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op := tc.op
			op.Tenant, op.Tree, op.Started = "app", "items", started
			got, err := f.TreeOpETA(ctx, &op, now)
			switch {
			case err != nil:
				t.Fatal(err)
			case tc.eta < 0 && got != nil:
				t.Errorf("ETA %v, want none", *got)
			case tc.eta >= 0 && (got == nil || *got != tc.eta):
				t.Errorf("ETA %v, want %v", got, tc.eta)
			}
		})
	}
}
