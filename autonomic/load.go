package autonomic

import (
	"context"
	"math"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// LoadSource gives a tree's write rates per slot.
type LoadSource interface {
	// SlotWrites returns the rows written per second to each slot of the
	// tree (index = slot) over the source's window, or nil when it has no
	// data for the tree yet.
	SlotWrites(ctx context.Context, tenant, tree string) ([]float64, error)
}

// Clock tells the policy the time; the simulation's is fake.
type Clock interface{ Now() time.Time }

// SystemClock is the wall clock.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// ShardWrites sums the slots' write rates per shard that owns slots.
func ShardWrites(m *shardmap.Map, writes []float64) map[int]float64 {
	out := make(map[int]float64)
	for slot, idx := range m.Slots {
		out[idx] += at(writes, slot)
	}
	return out
}

// at is writes[slot], 0 past the end (a source with fewer slots than the map).
func at(writes []float64, slot int) float64 {
	if slot < len(writes) {
		return writes[slot]
	}
	return 0
}

// Midpoint is where a split of shard idx halves its load: the shard's
// slots from slot `from` on (in slot order) go to the new shard. Without
// load on the shard it halves the slots, as a split by slot count does.
// ok is false for a shard of fewer than two slots.
func Midpoint(m *shardmap.Map, idx int, writes []float64) (from int, ok bool) {
	var slots []int
	total := 0.0
	for slot, owner := range m.Slots {
		if owner == idx {
			slots = append(slots, slot)
			total += at(writes, slot)
		}
	}
	if len(slots) < 2 {
		return 0, false
	}
	if total <= 0 {
		return slots[len(slots)/2], true
	}
	best, bestGap := 1, math.Inf(1)
	prefix := 0.0
	for j := 1; j < len(slots); j++ {
		prefix += at(writes, slots[j-1])
		gap := math.Abs(prefix - total/2)
		// Equal gaps (cold slots between the halves) take the boundary
		// nearest the middle of the slots, leaving both sides room to split.
		if gap < bestGap-1e-9 || math.Abs(gap-bestGap) <= 1e-9 && abs(j-len(slots)/2) < abs(best-len(slots)/2) {
			best, bestGap = j, gap
		}
	}
	return slots[best], true
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
