package shardmap

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestOwningShards lists the shards that own slots, in order, as the slot
// counts do, for maps in runs and for scattered ones.
func TestOwningShards(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 200 {
		m := &Map{Slots: make([]int, 4096)}
		shards := 1 + r.IntN(300)
		for i := range m.Slots {
			if n%2 == 0 {
				m.Slots[i] = i * shards / len(m.Slots) // runs, as a fresh tree
			} else {
				m.Slots[i] = r.IntN(shards) * 3 // scattered, with gaps
			}
		}
		var want []int
		for idx := range m.SlotCounts() {
			want = append(want, idx)
		}
		sort.Ints(want)
		if got := m.OwningShards(); !slices.Equal(got, want) {
			t.Fatalf("map %d: OwningShards %v, want %v", n, got, want)
		}
	}
}

func BenchmarkOwningShards(b *testing.B) {
	m := &Map{Slots: make([]int, 4096)}
	for i := range m.Slots {
		m.Slots[i] = i * 16 / len(m.Slots)
	}
	for b.Loop() {
		m.OwningShards()
	}
}
