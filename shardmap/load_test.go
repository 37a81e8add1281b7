package shardmap

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestTreeLoad(t *testing.T) {
	ctx := context.Background()
	s, mr := newTestStore(t)
	// now is 2 s into a bucket; the window is the six buckets before it.
	base := time.Unix(1_000_000_000, 0) // a multiple of LoadBucket
	now := base.Add(2 * time.Second)
	inWindow := base.Add(-LoadBucket + time.Second)
	add := func(at time.Time, d ...SlotDelta) {
		t.Helper()
		if err := s.AddLoad(ctx, "app", "orders", at, d); err != nil {
			t.Fatal(err)
		}
	}
	// Two proxies publish into the same bucket; their counts sum.
	add(inWindow, SlotDelta{Slot: 7, Reads: 30, Writes: 60, Rows: 120})
	add(inWindow, SlotDelta{Slot: 7, Writes: 30, Rows: 30}, SlotDelta{Slot: 4000, Reads: 3})
	add(base.Add(-LoadWindow), SlotDelta{Slot: 9, Writes: 30})                // the oldest bucket of the window
	add(now, SlotDelta{Slot: 8, Writes: 1000})                                // the incomplete bucket: not counted yet
	add(base.Add(-LoadWindow-time.Second), SlotDelta{Slot: 10, Writes: 1000}) // before the window
	add(inWindow, SlotDelta{Slot: 99999, Writes: 5})                          // beyond the slot count: ignored

	l, err := s.TreeLoad(ctx, "app", "orders", DefaultSlotCount, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.To.Sub(l.From); got != LoadWindow || !l.To.Equal(base) {
		t.Fatalf("window [%v, %v), want %v ending at %v", l.From, l.To, LoadWindow, base)
	}
	secs := LoadWindow.Seconds()
	tests := []struct {
		slot int
		want SlotRate
	}{
		{7, SlotRate{Reads: 30 / secs, Writes: 90 / secs, Rows: 150 / secs}},
		{4000, SlotRate{Reads: 3 / secs}},
		{9, SlotRate{Writes: 30 / secs}},
		{8, SlotRate{}},
		{10, SlotRate{}},
		{0, SlotRate{}},
	}
	for _, tc := range tests {
		if !rateNear(l.Slots[tc.slot], tc.want) {
			t.Errorf("slot %d: %+v, want %+v", tc.slot, l.Slots[tc.slot], tc.want)
		}
	}
	if l.Empty() {
		t.Fatal("Empty with counted slots")
	}

	m := NewIdentityMap("app", "orders", DefaultSlotCount, 4, []string{"n1", "n2"})
	byShard := l.ByShard(m)
	if len(byShard) != 4 || !rateNear(byShard[0], SlotRate{Reads: 30 / secs, Writes: 120 / secs, Rows: 150 / secs}) ||
		!rateNear(byShard[3], SlotRate{Reads: 3 / secs}) || byShard[1] != (SlotRate{}) {
		t.Fatalf("ByShard %+v", byShard)
	}
	byNode := l.ByNode(m)
	if !rateNear(byNode["n1"], byShard[0].Add(byShard[2])) || !rateNear(byNode["n2"], byShard[1].Add(byShard[3])) {
		t.Fatalf("ByNode %+v", byNode)
	}

	// Another tree and another tenant see none of it.
	for _, k := range [][2]string{{"app", "other"}, {"x", "orders"}} {
		o, err := s.TreeLoad(ctx, k[0], k[1], DefaultSlotCount, now)
		if err != nil || !o.Empty() {
			t.Fatalf("%v: %v, empty %v", k, err, o.Empty())
		}
	}

	// A bucket ages out LoadRetention after its end: a proxy that stops
	// publishing leaves nothing behind.
	if ttl := mr.TTL(s.loadKey("app", "orders", loadBucketOf(inWindow))); ttl <= LoadRetention || ttl > LoadRetention+LoadBucket {
		t.Fatalf("bucket TTL %v, want in (%v, %v]", ttl, LoadRetention, LoadRetention+LoadBucket)
	}
	mr.FastForward(LoadRetention + LoadBucket)
	l, err = s.TreeLoad(ctx, "app", "orders", DefaultSlotCount, now)
	if err != nil || !l.Empty() {
		t.Fatalf("after retention: %v, empty %v", err, l.Empty())
	}
}

// A publication larger than one pipeline chunk lands whole.
func TestAddLoadChunks(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	at := time.Unix(1_000_000_000, 0)
	var d []SlotDelta
	for slot := 0; slot < DefaultSlotCount; slot++ {
		d = append(d, SlotDelta{Slot: slot, Reads: 1, Writes: 2, Rows: 3})
	}
	if err := s.AddLoad(ctx, "app", "orders", at, d); err != nil {
		t.Fatal(err)
	}
	l, err := s.TreeLoad(ctx, "app", "orders", DefaultSlotCount, at.Add(LoadBucket))
	if err != nil {
		t.Fatal(err)
	}
	secs := LoadWindow.Seconds()
	for slot, r := range l.Slots {
		if !rateNear(r, SlotRate{Reads: 1 / secs, Writes: 2 / secs, Rows: 3 / secs}) {
			t.Fatalf("slot %d: %+v", slot, r)
		}
	}
}

func rateNear(a, b SlotRate) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	return near(a.Reads, b.Reads) && near(a.Writes, b.Writes) && near(a.Rows, b.Rows)
}
