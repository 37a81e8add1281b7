package migrator

import (
	"testing"
	"time"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
)

// TestResizeStatusOf counts a resize's progress in shards, as a reshard's
// is counted, and extrapolates its ETA from the shards done.
func TestResizeStatusOf(t *testing.T) {
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := started.Add(30 * time.Second)
	// mapOf makes a map of two slots for each owner given, in order.
	mapOf := func(highWater int, owners ...int) *shardmap.Map {
		m := &shardmap.Map{Tree: "items", Shards: map[int]shardmap.Shard{}, HighWater: highWater}
		for _, o := range owners {
			m.Slots = append(m.Slots, o, o)
			m.Shards[o] = shardmap.Shard{Index: o, State: shardmap.ShardActive}
		}
		return m
	}
	resize := func(src, dst int, phase shardmap.MigrationPhase) *shardmap.Migration {
		return &shardmap.Migration{Kind: shardmap.Resize, Source: src, Target: dst, Phase: phase, LagBytes: 100}
	}
	layout := btreeindex.Layout{Fillfactor: 70}
	tests := []struct {
		name                string
		phase               string
		st                  resizeState
		m                   *shardmap.Map
		migs                []*shardmap.Migration
		done, total, flying int
		lag                 int64
		eta                 float64 // -1: NULL
	}{
		{"layout being recorded", shardmap.OpIntent, resizeState{Layout: layout}, mapOf(4, 0, 1, 2, 3), nil, 0, 0, 0, 0, -1},
		{"nothing rewritten yet", resizeRewrite, resizeState{Layout: layout, HighWater: 4, Shards: 4}, mapOf(4, 0, 1, 2, 3), nil, 0, 4, 0, 0, -1},
		{"the first shard in flight", resizeRewrite, resizeState{Layout: layout, HighWater: 4, Shards: 4}, mapOf(5, 0, 1, 2, 3),
			[]*shardmap.Migration{resize(0, 4, shardmap.PhaseCopy)}, 0, 4, 1, 100, -1},
		// Shards 0 and 1 are rewritten into 4 and 5, 2 into 6 now; the
		// split of 3 is no resize.
		{"half done", resizeRewrite, resizeState{Layout: layout, HighWater: 4, Shards: 4}, mapOf(8, 4, 5, 2, 3),
			[]*shardmap.Migration{resize(2, 6, shardmap.PhaseDrain), {Kind: shardmap.Split, Source: 3, Target: 7, Phase: shardmap.PhaseCopy, LagBytes: 5},
				resize(0, 4, shardmap.PhaseDone)}, 2, 4, 1, 100, 30},
		{"every shard done", resizeRewrite, resizeState{Layout: layout, HighWater: 4, Shards: 4}, mapOf(8, 4, 5, 6, 7), nil, 4, 4, 0, 0, 0},
		// A member joined the group: every shard is to rewrite again.
		{"more left than recorded", resizeRewrite, resizeState{Layout: layout, HighWater: 8, Shards: 2}, mapOf(8, 4, 5, 6, 7), nil, 0, 4, 0, 0, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op := &shardmap.TreeOp{Tree: "items", Phase: tc.phase, Started: started, RowsDone: 10, RowsTotal: 40}
			got := resizeStatusOf(op, tc.st, tc.m, tc.migs, now)
			if got.ShardsDone != tc.done || got.ShardsTotal != tc.total || got.MigrationsInFlight != tc.flying || got.LagBytes != tc.lag {
				t.Errorf("shards %d of %d, %d in flight, lag %d; want %d of %d, %d, %d", got.ShardsDone, got.ShardsTotal,
					got.MigrationsInFlight, got.LagBytes, tc.done, tc.total, tc.flying, tc.lag)
			}
			switch {
			case tc.eta < 0 && got.ETASeconds != nil:
				t.Errorf("ETA %v before any shard is done, want NULL", *got.ETASeconds)
			case tc.eta >= 0 && (got.ETASeconds == nil || *got.ETASeconds != tc.eta):
				t.Errorf("ETA %v, want %v", got.ETASeconds, tc.eta)
			}
			if got.Phase != tc.phase || got.Layout != layout.String() || got.RowsCopied != 10 || got.RowsTotal != 40 || got.Elapsed != 30*time.Second {
				t.Errorf("status %+v", got)
			}
		})
	}
}
