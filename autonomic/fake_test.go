package autonomic

import (
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) advance(d time.Duration) { c.now = c.now.Add(d) }

func newClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

// identity is a tree of n shards over slots slots, as lattice_create_tree
// makes it.
func identity(slots, n int) *shardmap.Map {
	return shardmap.NewIdentityMap("t", "tree", slots, n, []string{"n1", "n2", "n3"})
}

// spread is per-slot writes: perSecond spread evenly over [lo, hi].
func spread(slots, lo, hi int, perSecond float64) []float64 {
	w := make([]float64, slots)
	for s := lo; s <= hi; s++ {
		w[s] = perSecond / float64(hi-lo+1)
	}
	return w
}

// onShard is per-slot writes with share of total on shard idx's slots and
// the rest spread over the others.
func onShard(m *shardmap.Map, idx int, total, share float64) []float64 {
	counts := m.SlotCounts()
	w := make([]float64, len(m.Slots))
	rest := len(m.Slots) - counts[idx]
	for s, owner := range m.Slots {
		if owner == idx {
			w[s] = total * share / float64(counts[idx])
		} else {
			w[s] = total * (1 - share) / float64(rest)
		}
	}
	return w
}

// split applies a split to a map as the migrator's flip does: the slots of
// sp.Shard from sp.From on go to a new shard at the high-water mark.
func applySplit(m *shardmap.Map, shard, from int) int {
	idx := m.HighWater
	m.HighWater++
	m.Shards[idx] = shardmap.Shard{Index: idx, Node: "n1", State: shardmap.ShardActive}
	for s, owner := range m.Slots {
		if owner == shard && s >= from {
			m.Slots[s] = idx
		}
	}
	return idx
}

// applyFold applies a fold: the donor's slots go to the survivor and the
// donor is retired.
func applyFold(m *shardmap.Map, donor, survivor int) {
	for s, owner := range m.Slots {
		if owner == donor {
			m.Slots[s] = survivor
		}
	}
	d := m.Shards[donor]
	d.State = shardmap.ShardRetired
	m.Shards[donor] = d
}
