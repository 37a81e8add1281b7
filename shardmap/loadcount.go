package shardmap

import (
	"sync/atomic"
)

// SlotCounters counts one tree's statements and rows written per slot in
// this proxy, between two publications of the load signal (load.go). The
// proxy bumps them on every statement on one slot, so a bump is an atomic
// add on a preallocated array: no lock, no map, no allocation.
type SlotCounters struct {
	slots int
	// turn picks the slot a statement over whole shards counts on
	// (Shards), so that those statements spread over each shard's slots.
	turn atomic.Uint32
	// arr is made at the first bump, so that a proxy caching many idle
	// trees holds no counters for them.
	arr atomic.Pointer[[]slotCounter]
	// index is the last map Shards counted on, with each shard's slots.
	index atomic.Pointer[shardSlots]
}

// slotCounter fits a publication interval: 2^32 statements or rows on one
// slot in a few seconds is out of reach.
type slotCounter struct {
	reads, writes, rows atomic.Uint32
}

func newSlotCounters(slots int) *SlotCounters { return &SlotCounters{slots: slots} }

// Counters are the load counters of t in this proxy: nil unless the Cache
// that made t counts load (CountLoad). Every Tree of one tree (by name and
// creation time) in a Cache's views shares them, so a plan that holds an
// older view's Tree counts into the same array.
func (t *Tree) Counters() *SlotCounters { return t.counters }

func (c *SlotCounters) array() []slotCounter {
	if p := c.arr.Load(); p != nil {
		return *p
	}
	a := make([]slotCounter, c.slots)
	if c.arr.CompareAndSwap(nil, &a) {
		return a
	}
	return *c.arr.Load()
}

// Read counts a statement on slot that wrote nothing. A nil c counts
// nothing.
func (c *SlotCounters) Read(slot int) {
	if c == nil || uint(slot) >= uint(c.slots) {
		return
	}
	c.array()[slot].reads.Add(1)
}

// Write counts a statement on slot that wrote rows rows.
func (c *SlotCounters) Write(slot int, rows int64) {
	if c == nil || uint(slot) >= uint(c.slots) {
		return
	}
	a := c.array()
	a[slot].writes.Add(1)
	if rows > 0 {
		a[slot].rows.Add(uint32(min(rows, 1<<31)))
	}
}

// Row counts one row written on slot by a statement over several slots
// (a COPY FROM routes each row by its key), which Write does not count.
func (c *SlotCounters) Row(slot int) {
	if c == nil || uint(slot) >= uint(c.slots) {
		return
	}
	c.array()[slot].rows.Add(1)
}

// Shards counts one statement over whole shards of m (a fan-out read, or
// a part of an UPDATE or DELETE without the key). Which slots it touched
// is not known, so each shard counts one statement on a slot that turns
// through the shard's slots from statement to statement, and a write's
// rows spread evenly over the shard's slots: a shard's rates stay exact,
// and its load midpoint is then its slot midpoint, as without load data.
// It finds each shard's slots in an index of m (slotsOf), so a read costs
// a bump per shard, not a walk over the map's slots.
func (c *SlotCounters) Shards(m *Map, shards []int, write bool, rows int64) {
	if c == nil || m == nil || len(m.Slots) != c.slots || len(shards) == 0 {
		return
	}
	owned := c.slotsOf(m)
	var counted []bool // a shard listed twice counts once
	if len(shards) > 1 {
		counted = make([]bool, len(owned))
	}
	turn := int64(c.turn.Add(1))
	a := c.array()
	for _, idx := range shards {
		if uint(idx) >= uint(len(owned)) || len(owned[idx]) == 0 {
			continue
		}
		if counted != nil {
			if counted[idx] {
				continue
			}
			counted[idx] = true
		}
		own := owned[idx]
		k := int64(len(own))
		pick := turn % k
		if !write {
			a[own[pick]].reads.Add(1)
			continue
		}
		a[own[pick]].writes.Add(1)
		// The remainder goes to the k slots from the picked one on, so
		// that it too turns through the shard.
		base, remainder := max(rows, 0)/k, max(rows, 0)%k
		for i, slot := range own {
			n := base
			if (int64(i)-pick+k)%k < remainder {
				n++
			}
			if n > 0 {
				a[slot].rows.Add(uint32(min(n, 1<<31)))
			}
		}
	}
}

// shardSlots are the slots of each shard of one map, in slot order.
type shardSlots struct {
	m     *Map
	slots [][]int32 // by shard index
}

// slotsOf returns the slots of each shard of m, by shard index, made from
// one walk over m's slots the first time m is counted and kept until
// another map is: maps change only with the tree's epochs.
func (c *SlotCounters) slotsOf(m *Map) [][]int32 {
	if ix := c.index.Load(); ix != nil && ix.m == m {
		return ix.slots
	}
	n := 0
	for _, idx := range m.Slots {
		n = max(n, idx+1)
	}
	counts := make([]int, n)
	for _, idx := range m.Slots {
		if idx >= 0 {
			counts[idx]++
		}
	}
	all := make([]int32, 0, len(m.Slots))
	slots := make([][]int32, n)
	for idx, k := range counts {
		slots[idx] = all[len(all) : len(all) : len(all)+k]
		all = all[:len(all)+k]
	}
	for slot, idx := range m.Slots {
		if idx >= 0 {
			slots[idx] = append(slots[idx], int32(slot))
		}
	}
	c.index.Store(&shardSlots{m: m, slots: slots})
	return slots
}

// take returns what was counted since the last take, non-zero slots only,
// and starts the counts again from zero. A bump racing with it lands in
// this take or the next, never in neither.
func (c *SlotCounters) take() []SlotDelta {
	p := c.arr.Load()
	if p == nil {
		return nil
	}
	var out []SlotDelta
	for slot := range *p {
		sc := &(*p)[slot]
		if sc.reads.Load() == 0 && sc.writes.Load() == 0 && sc.rows.Load() == 0 {
			continue
		}
		d := SlotDelta{Slot: slot, Reads: uint64(sc.reads.Swap(0)), Writes: uint64(sc.writes.Swap(0)), Rows: uint64(sc.rows.Swap(0))}
		if d.Reads|d.Writes|d.Rows != 0 {
			out = append(out, d)
		}
	}
	return out
}

// CountLoad makes c give every tree it caches its load counters, for the
// proxy's statements to bump and a LoadPublisher to publish. Call it
// before the cache is used.
func (c *Cache) CountLoad() { c.countLoad = true }

// attachCounters gives each tree of a new view the counters of the same
// tree in the old one (same name and creation time: a tree dropped and
// created again starts from zero), or new ones. Called with the tenant's
// mu held, before the view is published.
func (c *Cache) attachCounters(old *View, trees map[string]*Tree, ms map[string]*Map) {
	if !c.countLoad {
		return
	}
	for name, t := range trees {
		if old != nil {
			if o := old.Trees[name]; o != nil && o.counters != nil && o.Created.Equal(t.Created) && len(old.Maps[name].Slots) == len(ms[name].Slots) {
				t.counters = o.counters
				continue
			}
		}
		t.counters = newSlotCounters(len(ms[name].Slots))
	}
}
