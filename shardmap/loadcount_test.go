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
