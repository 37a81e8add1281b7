package shardmap

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestLoadCountersPublish(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "orders")
	c := NewCache(s, 0, nil)
	c.CountLoad()
	v, err := c.View(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	ctr := v.Trees["orders"].Counters()
	if ctr == nil {
		t.Fatal("no counters on a counting cache's tree")
	}
	ctr.Read(5)
	ctr.Read(5)
	ctr.Write(5, 3)
	ctr.Write(4095, 1)
	ctr.Read(-1)               // out of range: ignored
	ctr.Read(DefaultSlotCount) // out of range: ignored

	// A re-read view's Tree is a new object; it keeps the same counters, so
	// a plan holding the older Tree counts into the array that is published.
	v, err = c.Refresh(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if v.Trees["orders"].Counters() != ctr {
		t.Fatal("a refreshed view lost the tree's counters")
	}

	at := time.Unix(1_000_000_000, 0)
	pub := NewLoadPublisher(c, s, time.Second, nil)
	pub.Publish(ctx, at)
	pub.Publish(ctx, at) // nothing new counted: adds nothing
	l, err := s.TreeLoad(ctx, "app", "orders", DefaultSlotCount, at.Add(LoadBucket))
	if err != nil {
		t.Fatal(err)
	}
	secs := LoadWindow.Seconds()
	for _, tc := range []struct {
		slot int
		want SlotRate
	}{
		{5, SlotRate{Reads: 2 / secs, Writes: 1 / secs, Rows: 3 / secs}},
		{4095, SlotRate{Writes: 1 / secs, Rows: 1 / secs}},
		{0, SlotRate{}},
	} {
		if !rateNear(l.Slots[tc.slot], tc.want) {
			t.Errorf("slot %d: %+v, want %+v", tc.slot, l.Slots[tc.slot], tc.want)
		}
	}

	// A tree dropped and created again starts from zero.
	if err := s.DeleteTree(ctx, "app", "orders"); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, "app", "orders")
	v, err = c.Refresh(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if v.Trees["orders"].Counters() == ctr {
		t.Fatal("a re-created tree kept the dropped tree's counters")
	}
}

// A cache that does not count gives trees no counters, and a nil
// counter set counts nothing.
func TestLoadCountersOff(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "orders")
	v, err := NewCache(s, 0, nil).View(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	ctr := v.Trees["orders"].Counters()
	if ctr != nil {
		t.Fatal("counters on a cache that does not count")
	}
	ctr.Read(1)
	ctr.Write(1, 1)
}

// The proxy's bump must not allocate: it runs on every point query.
func TestLoadCountersNoAlloc(t *testing.T) {
	c := newSlotCounters(DefaultSlotCount)
	c.Read(0) // the array is made once, at the first bump
	if n := testing.AllocsPerRun(1000, func() { c.Read(7); c.Write(9, 2); c.Row(11) }); n != 0 {
		t.Fatalf("%v allocations per bump", n)
	}
}

// BenchmarkSlotCountersRead is the proxy's cost per counted statement,
// from sessions on every core bumping slots spread as keys hash.
func BenchmarkSlotCountersRead(b *testing.B) {
	c := newSlotCounters(DefaultSlotCount)
	var seed atomic.Uint32
	b.RunParallel(func(pb *testing.PB) {
		x := seed.Add(0x9e3779b9)
		for pb.Next() {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			c.Read(int(x & (DefaultSlotCount - 1)))
		}
	})
}

// A statement over whole shards counts one statement per shard, turning
// through each shard's slots, and spreads a write's rows evenly over them.
func TestLoadCountersShards(t *testing.T) {
	m := NewIdentityMap("app", "orders", 16, 4, []string{"n1"}) // shard i owns slots 4i..4i+3
	type want struct{ reads, writes, rows [16]uint64 }
	tests := []struct {
		name  string
		count func(c *SlotCounters)
		want  want
	}{
		{"a read of two shards, four times", func(c *SlotCounters) {
			for range 4 {
				c.Shards(m, []int{1, 3}, false, 0)
			}
		}, want{reads: [16]uint64{4: 1, 5: 1, 6: 1, 7: 1, 12: 1, 13: 1, 14: 1, 15: 1}}},
		{"ten rows on one shard", func(c *SlotCounters) { c.Shards(m, []int{2}, true, 10) },
			want{writes: [16]uint64{9: 1}, rows: [16]uint64{8: 2, 9: 3, 10: 3, 11: 2}}},
		{"two rows on one shard, twice", func(c *SlotCounters) {
			c.Shards(m, []int{0}, true, 2)
			c.Shards(m, []int{0}, true, 2)
		}, want{writes: [16]uint64{1: 1, 2: 1}, rows: [16]uint64{1: 1, 2: 2, 3: 1}}},
		{"no rows", func(c *SlotCounters) { c.Shards(m, []int{0}, true, 0) }, want{writes: [16]uint64{1: 1}}},
		{"shards that own nothing or are out of range", func(c *SlotCounters) {
			c.Shards(m, []int{-1, 4, 99}, true, 5)
			c.Shards(m, nil, false, 0)
		}, want{}},
		{"a shard listed twice", func(c *SlotCounters) { c.Shards(m, []int{1, 1}, false, 0) },
			want{reads: [16]uint64{5: 1}}},
		{"a map that changed", func(c *SlotCounters) {
			// Shard 1 owns slots 4..7, then 8..15.
			c.Shards(m, []int{1}, false, 0)
			c.Shards(NewIdentityMap("app", "orders", 16, 2, []string{"n1"}), []int{1}, false, 0)
		}, want{reads: [16]uint64{5: 1, 10: 1}}},
		{"a map of another slot count", func(c *SlotCounters) {
			c.Shards(NewIdentityMap("app", "orders", 32, 4, []string{"n1"}), []int{0}, true, 5)
		}, want{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newSlotCounters(16)
			tc.count(c)
			var got want
			for _, d := range c.take() {
				got.reads[d.Slot], got.writes[d.Slot], got.rows[d.Slot] = d.Reads, d.Writes, d.Rows
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	var nilCounters *SlotCounters
	nilCounters.Shards(m, []int{0}, true, 1)
}

// BenchmarkSlotCountersShards is the proxy's cost of counting one fan-out
// read over every shard of a 16-shard tree, and of a write's rows.
func BenchmarkSlotCountersShards(b *testing.B) {
	m := NewIdentityMap("app", "orders", DefaultSlotCount, 16, []string{"n1", "n2"})
	all := make([]int, 16)
	for i := range all {
		all[i] = i
	}
	c := newSlotCounters(DefaultSlotCount)
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			c.Shards(m, all, false, 0)
		}
	})
	b.Run("write", func(b *testing.B) {
		for b.Loop() {
			c.Shards(m, all, true, 100)
		}
	})
}
