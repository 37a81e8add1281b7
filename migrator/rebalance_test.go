package migrator

import (
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

func shardsOf(nodes ...string) []placedShard {
	out := make([]placedShard, len(nodes))
	for i, n := range nodes {
		out[i] = placedShard{Index: i, Node: n, Weight: 100, Movable: true}
	}
	return out
}

// loadsAfter applies plan to shards and sums each node's weight.
func loadsAfter(shards []placedShard, plan []plannedMove) map[string]int64 {
	node := map[int]string{}
	for _, s := range shards {
		node[s.Index] = s.Node
	}
	for _, mv := range plan {
		node[mv.Shard] = mv.To
	}
	out := map[string]int64{}
	for _, s := range shards {
		out[node[s.Index]] += s.Weight
	}
	return out
}

func TestPlanRebalance(t *testing.T) {
	many := func(n int, node string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = node
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		shards    []placedShard
		active    []string
		drainOnly bool
		moves     int  // want exactly this many moves, -1: any
		balanced  bool // want every active node within 10% afterwards
		off       string
	}{
		{name: "balanced already", shards: shardsOf("n1", "n2", "n1", "n2"), active: []string{"n1", "n2"}, moves: 0, balanced: true},
		{name: "a new empty node", shards: shardsOf(append(many(32, "n1"), many(32, "n2")...)...), active: []string{"n1", "n2", "n3"}, moves: -1, balanced: true},
		{name: "drain n2 onto n1 and n3", shards: shardsOf(append(append(many(21, "n1"), many(21, "n2")...), many(22, "n3")...)...),
			active: []string{"n1", "n3"}, drainOnly: true, moves: 21, balanced: true, off: "n2"},
		{name: "fewer shards than balance needs", shards: shardsOf("n1", "n1"), active: []string{"n1", "n2", "n3"}, moves: 1},
		{name: "nothing movable", shards: func() []placedShard {
			s := shardsOf("n1", "n1", "n1")
			for i := range s {
				s[i].Movable = false
			}
			return s
		}(), active: []string{"n1", "n2"}, moves: 0},
		{name: "one heavy shard stays", shards: []placedShard{{0, "n1", 1000, true}, {1, "n2", 10, true}, {2, "n2", 10, true}},
			active: []string{"n1", "n2"}, moves: 0},
		{name: "uneven sizes", shards: []placedShard{{0, "n1", 400, true}, {1, "n1", 300, true}, {2, "n1", 200, true}, {3, "n1", 100, true},
			{4, "n1", 100, true}, {5, "n2", 100, true}}, active: []string{"n1", "n2"}, moves: -1, balanced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := planRebalance(append([]placedShard(nil), tc.shards...), tc.active, tc.drainOnly, planTolerance)
			if tc.moves >= 0 && len(plan) != tc.moves {
				t.Errorf("%d moves, want %d: %+v", len(plan), tc.moves, plan)
			}
			seen := map[int]bool{}
			for _, mv := range plan {
				if seen[mv.Shard] {
					t.Errorf("shard %d moves twice", mv.Shard)
				}
				seen[mv.Shard] = true
				if mv.From == mv.To {
					t.Errorf("shard %d moves to the node it is on", mv.Shard)
				}
			}
			loads := loadsAfter(tc.shards, plan)
			if tc.balanced && !balanced(loads, tc.active, balanceTolerance) {
				t.Errorf("not balanced afterwards: %v", loads)
			}
			if tc.off != "" && loads[tc.off] != 0 {
				t.Errorf("node %s still holds %d", tc.off, loads[tc.off])
			}
		})
	}
}

// TestFewestBytes holds the grow's placement: the node with the fewest
// bytes of the tree, not the fewest slots; a pending target counts as half
// a mean shard, so that two splits of one tick land apart.
func TestFewestBytes(t *testing.T) {
	m := shardmap.NewIdentityMap("t", "x", 16, 4, []string{"n1", "n2"}) // n1: 0, 2; n2: 1, 3
	nodes := []string{"n1", "n2", "n3"}
	for _, tc := range []struct {
		name  string
		bytes map[int]int64
		tweak func(m *shardmap.Map)
		want  string
	}{
		{name: "empty node first", bytes: map[int]int64{0: 10, 1: 10, 2: 10, 3: 10}, want: "n3"},
		{name: "bytes, not slots", bytes: map[int]int64{0: 10, 1: 500, 2: 10, 4: 600}, tweak: func(m *shardmap.Map) {
			// n1 owns 8 slots in 20 bytes, n2 and n3 4 slots each in 500 and 600.
			m.Shards[4] = shardmap.Shard{Index: 4, Node: "n3", State: shardmap.ShardActive}
			for s := 12; s < 16; s++ {
				m.Slots[s] = 4
			}
		}, want: "n1"},
		{name: "a pending target weighs", bytes: map[int]int64{0: 100, 1: 100, 2: 100, 3: 100}, tweak: func(m *shardmap.Map) {
			m.Shards[9] = shardmap.Shard{Index: 9, Node: "n3", State: shardmap.ShardPending}
			m.Shards[10] = shardmap.Shard{Index: 10, Node: "n3", State: shardmap.ShardPending}
			m.Shards[11] = shardmap.Shard{Index: 11, Node: "n3", State: shardmap.ShardPending}
			m.Shards[12] = shardmap.Shard{Index: 12, Node: "n3", State: shardmap.ShardPending}
			m.Shards[13] = shardmap.Shard{Index: 13, Node: "n3", State: shardmap.ShardPending}
		}, want: "n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := m.Clone()
			if tc.tweak != nil {
				tc.tweak(c)
			}
			if got := fewestBytes(c, tc.bytes, nodes); got != tc.want {
				t.Errorf("placed on %s, want %s", got, tc.want)
			}
		})
	}
}

// TestPlaceShards holds what a tick's re-plan may move: not a shard the
// intent moved or skipped before (so a plan ends while sizes change), not
// one in a migration or mixed; and a move in flight counts on its target.
func TestPlaceShards(t *testing.T) {
	m := shardmap.NewIdentityMap("t", "x", 16, 4, []string{"n1", "n2"}) // n1: 0, 2; n2: 1, 3
	mixed := m.Shards[3]
	mixed.Mixed = true
	m.Shards[3] = mixed
	flying := []*shardmap.Migration{{Kind: shardmap.Move, Source: 2, Target: 2, SourceNode: "n1", TargetNode: "n3", Phase: shardmap.PhaseCopy}}
	r := &shardmap.Reshard{Rebalance: shardmap.Rebalance{Kind: shardmap.IntentRebalance, Moved: []int{0}, Skipped: []int{1}}}
	got := map[int]placedShard{}
	for _, s := range placeShards(m, map[int]int64{0: 1, 1: 1, 2: 1, 3: 1}, flying, r) {
		got[s.Index] = s
	}
	for idx, want := range map[int]placedShard{
		0: {Index: 0, Node: "n1", Weight: 1},
		1: {Index: 1, Node: "n2", Weight: 1},
		2: {Index: 2, Node: "n3", Weight: 1},
		3: {Index: 3, Node: "n2", Weight: 1},
	} {
		if got[idx] != want {
			t.Errorf("shard %d: %+v, want %+v", idx, got[idx], want)
		}
	}
	r.Moved, r.Skipped, flying = nil, nil, nil
	for _, s := range placeShards(m, nil, flying, r) {
		if want := s.Index != 3; s.Movable != want {
			t.Errorf("shard %d movable %v, want %v", s.Index, s.Movable, want)
		}
	}
}
