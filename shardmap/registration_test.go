package shardmap

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestRegistrationAcknowledgesAfterOlderStatementsEnd(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	_, m := mustCreate(t, s, "t", "x")
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)

	if _, _, err := r.Acquire(ctx, "t"); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("before the first heartbeat: got %v, want ErrLeaseExpired", err)
	}
	r.beat(ctx)
	if live, _ := s.LiveProxies(ctx); !slices.Equal(live, []string{"p1"}) {
		t.Fatalf("registry: %v", live)
	}
	// Not serving the tenant yet, the proxy holds up no freeze of it.
	if got, _ := s.TenantProxies(ctx, "t"); len(got) != 0 {
		t.Fatalf("proxies of t before a statement: %v", got)
	}
	old, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.TenantProxies(ctx, "t"); !slices.Equal(got, []string{"p1"}) {
		t.Fatalf("proxies of t after a statement: %v", got)
	}
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "x"); acks["p1"] != m.Epoch {
		t.Fatalf("acks %v, want p1 at %d", acks, m.Epoch)
	}

	next := m.Clone()
	next.Frozen = [][2]int{{0, 10}}
	if err := s.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refresh(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	// A statement still runs on the old map: the new epoch waits.
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "x"); acks["p1"] != m.Epoch {
		t.Fatalf("acknowledged %d while a statement ran on epoch %d", acks["p1"], old.Maps["x"].Epoch)
	}
	// A statement that starts now plans on the new map.
	cur, release2, err := r.Acquire(ctx, "t")
	if err != nil || cur.Maps["x"].Epoch != next.Epoch {
		t.Fatalf("new statement got epoch %d (%v), want %d", cur.Maps["x"].Epoch, err, next.Epoch)
	}
	release()
	release() // twice is harmless
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "x"); acks["p1"] != next.Epoch {
		t.Fatalf("after the old statement ended: acks %v, want %d", acks, next.Epoch)
	}
	release2()

	// A lapsed lease stops service until a heartbeat re-reads the maps.
	r.liveUntil.Store(time.Now().Add(-time.Second).UnixNano())
	if _, _, err := r.Acquire(ctx, "t"); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("lapsed: got %v", err)
	}
	again := next.Clone()
	if err := s.SwapMap(ctx, again, next.Epoch); err != nil {
		t.Fatal(err)
	}
	r.beat(ctx)
	v, rel, err := r.Acquire(ctx, "t")
	if err != nil || v.Maps["x"].Epoch != again.Epoch {
		t.Fatalf("after re-registering: epoch %d (%v), want the re-read %d", v.Maps["x"].Epoch, err, again.Epoch)
	}
	rel()
}

// A proxy that loaded a tenant's view before it served the tenant (here
// through the cache directly) does not plan its first statement on that
// view: a freeze that did not wait for it may have moved on since.
func TestRegistrationReadsMapsAfterServing(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	_, m := mustCreate(t, s, "t", "x")
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)
	r.beat(ctx)
	if _, err := c.View(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	// A freeze: stored, then the registry read, where p1 is not yet.
	next := m.Clone()
	next.Frozen = [][2]int{{0, 10}}
	if err := s.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.TenantProxies(ctx, "t"); len(got) != 0 {
		t.Fatalf("proxies of t: %v", got)
	}
	v, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if v.Maps["x"].Epoch != next.Epoch {
		t.Fatalf("first statement planned on epoch %d, want the frozen map's %d", v.Maps["x"].Epoch, next.Epoch)
	}

	// A clean shutdown leaves every registry.
	rctx, cancel := context.WithCancel(ctx)
	cancel()
	r.Run(rctx)
	if got, _ := s.TenantProxies(ctx, "t"); len(got) != 0 {
		t.Fatalf("proxies of t after shutdown: %v", got)
	}
}

// fakePresence is held on the nodes from since on; zero means not held.
type fakePresence struct{ since time.Time }

func (p *fakePresence) HeldSince(t time.Time) bool {
	return !p.since.IsZero() && !p.since.After(t)
}

// Through a lapse a proxy serves its cached view of a tenant it served,
// but only while its presence on the nodes has held since before the lapse;
// it never reads the store to do so.
func TestRegistrationServesCachedThroughLapse(t *testing.T) {
	s, mr := newTestStore(t)
	ctx := context.Background()
	_, m := mustCreate(t, s, "t", "x")
	mustCreate(t, s, "u", "y")
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)
	p := &fakePresence{since: time.Now().Add(-time.Minute)}
	r.ServeThroughLapses(p)
	r.beat(ctx)
	_, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	release()

	// Redis goes away and the lease lapses.
	mr.Close()
	lapsed := time.Now()
	r.liveUntil.Store(lapsed.Add(-time.Second).UnixNano())
	cases := []struct {
		name   string
		tenant string
		since  time.Time
		serve  bool // the statement is served
		cached bool // the proxy serves from its cache at all
	}{
		{"held since before the lapse", "t", p.since, true, true},
		{"a tenant never served", "u", p.since, false, true},
		{"held again only after the lapse", "t", lapsed, false, false},
		{"not held", "t", time.Time{}, false, false},
	}
	for _, tc := range cases {
		p.since = tc.since
		v, release, err := r.Acquire(ctx, tc.tenant)
		switch {
		case tc.serve && (err != nil || v.Maps["x"].Epoch != m.Epoch):
			t.Fatalf("%s: got %v, want the cached epoch %d", tc.name, err, m.Epoch)
		case !tc.serve && !errors.Is(err, ErrLeaseExpired):
			t.Fatalf("%s: got %v, want ErrLeaseExpired", tc.name, err)
		}
		if tc.cached != r.Cached() {
			t.Fatalf("%s: Cached() = %v", tc.name, r.Cached())
		}
		if release != nil {
			release()
		}
	}
}

// TestRegistrationWakesOnlyForOldViews: the end of a statement on the
// tenant's current view cannot let an epoch be acknowledged, so it does not
// wake the acknowledger (a goroutine hand-off per statement); the end of
// the last statement on a replaced view does.
func TestRegistrationWakesOnlyForOldViews(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	_, m := mustCreate(t, s, "t", "x")
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)
	r.beat(ctx)
	poked := func() bool {
		select {
		case <-r.poke:
			return true
		default:
			return false
		}
	}
	cur, err := r.Hold(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	poked() // the first statement's map read installed a view
	r.Release(cur)
	if poked() {
		t.Fatal("the last statement on the current view woke the acknowledger")
	}
	old, err := r.Hold(ctx, "t")
	if err != nil || old != cur {
		t.Fatalf("second hold: %p (%v), want the same view %p", old, err, cur)
	}

	next := m.Clone()
	next.Frozen = [][2]int{{0, 10}}
	if err := s.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refresh(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if !poked() {
		t.Fatal("a new view did not wake the acknowledger")
	}
	r.Release(old)
	if !poked() {
		t.Fatal("the last statement on a replaced view did not wake the acknowledger")
	}
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "x"); acks["p1"] != next.Epoch {
		t.Fatalf("acks %v, want p1 at %d", acks, next.Epoch)
	}
}

// slowRenewal is a store whose tenant renewal runs during() first: the
// proxy's lease lapses while the renewal waits for Redis.
type slowRenewal struct {
	Coordination
	during func()
}

func (s slowRenewal) ServeTenants(ctx context.Context, id string, until time.Time, tenants ...string) error {
	if s.during != nil {
		s.during()
	}
	return s.Coordination.ServeTenants(ctx, id, until, tenants...)
}

// A renewal that began while the lease held and succeeded after it lapsed
// (Redis answered late) re-reads the maps like any renewal after a lapse:
// the proxy was not counted meanwhile, so a map may have moved on.
func TestRegistrationReReadsAfterLateRenewal(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	_, m := mustCreate(t, s, "t", "x")
	slow := &slowRenewal{Coordination: s}
	c, r := servingProxy(t, s, slow)
	next := m.Clone()
	next.Frozen = [][2]int{{0, 10}}
	if err := s.SwapMap(ctx, next, m.Epoch); err != nil { // the cache is not told
		t.Fatal(err)
	}
	slow.during = func() { r.liveUntil.Store(time.Now().Add(-time.Second).UnixNano()) }
	r.beat(ctx)
	if !r.Live() {
		t.Fatal("the late renewal did not make the proxy live again")
	}
	v, err := c.View(ctx, "t")
	if err != nil || v.Maps["x"].Epoch != next.Epoch {
		t.Fatalf("after a late renewal the cache holds epoch %d (%v), want %d: the maps were not re-read", v.Maps["x"].Epoch, err, next.Epoch)
	}
}

// A statement narrowed to one slot holds up a newer epoch only when that
// slot routes differently under it: a freeze of other slots goes on.
func TestRegistrationNarrowedHoldWaitsOnlyForItsSlot(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	mustCreate(t, s, "t", "x")
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)
	r.beat(ctx)

	for _, tc := range []struct {
		name     string
		freeze   [2]int
		freezing bool // marked about to freeze rather than frozen
		slot     int
		holdsUp  bool
	}{
		{"a slot outside the freeze", [2]int{0, 10}, false, 500, false},
		{"a frozen slot", [2]int{20, 30}, false, 25, true},
		{"a slot outside the mark", [2]int{40, 50}, true, 600, false},
		{"a slot about to freeze", [2]int{60, 70}, true, 65, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, err := r.Hold(ctx, "t")
			if err != nil {
				t.Fatal(err)
			}
			r.Narrow(old, "x", tc.slot)
			r.acknowledge(ctx)
			before, _ := s.Acks(ctx, "t", "x")
			cur := old.Maps["x"]
			next := cur.Clone()
			if tc.freezing {
				next.Freezing = append(slices.Clone(cur.Freezing), tc.freeze)
			} else {
				next.Frozen = append(slices.Clone(cur.Frozen), tc.freeze)
			}
			if err := s.SwapMap(ctx, next, cur.Epoch); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Refresh(ctx, "t"); err != nil {
				t.Fatal(err)
			}
			r.acknowledge(ctx)
			acks, _ := s.Acks(ctx, "t", "x")
			if held := acks["p1"] == before["p1"]; held != tc.holdsUp {
				t.Fatalf("slot %d of epoch %d running: acks %v, held up %v, want %v", tc.slot, cur.Epoch, acks, held, tc.holdsUp)
			}
			r.ReleaseSlot(old, "x", tc.slot)
			r.acknowledge(ctx)
			if acks, _ := s.Acks(ctx, "t", "x"); acks["p1"] != next.Epoch {
				t.Fatalf("after the statement ended: acks %v, want %d", acks, next.Epoch)
			}
		})
	}
}

// A tree dropped and made again under its name has a new map whose epochs
// start over, and the drop took its acknowledgements. The proxy
// acknowledges the new map from its first epoch, whether it saw the tree
// gone in between or only the new map, so the new tree's first freeze
// does not wait for an acknowledgement that would come only once its
// epochs passed the old tree's (TestRecreatedTreeReshards).
func TestRegistrationAcknowledgesARecreatedTree(t *testing.T) {
	for _, sawDrop := range []bool{true, false} {
		s, _ := newTestStore(t)
		ctx := context.Background()
		_, m := mustCreate(t, s, "t", "x")
		c, r := servingProxy(t, s, s)
		for range 3 {
			next := m.Clone()
			if err := s.SwapMap(ctx, next, m.Epoch); err != nil {
				t.Fatal(err)
			}
			m = next
		}
		if _, err := c.Refresh(ctx, "t"); err != nil {
			t.Fatal(err)
		}
		r.acknowledge(ctx)
		if err := s.DeleteTree(ctx, "t", "x"); err != nil {
			t.Fatal(err)
		}
		if sawDrop {
			if _, err := c.Refresh(ctx, "t"); err != nil {
				t.Fatal(err)
			}
			r.acknowledge(ctx)
		}
		_, again := mustCreate(t, s, "t", "x")
		if _, err := c.Refresh(ctx, "t"); err != nil {
			t.Fatal(err)
		}
		r.acknowledge(ctx)
		if acks, _ := s.Acks(ctx, "t", "x"); acks["p1"] != again.Epoch {
			t.Errorf("saw the drop %v: acks of the tree made again %v, want p1 at %d (the old tree reached %d)", sawDrop, acks, again.Epoch, m.Epoch)
		}
	}
}

// A tree is acknowledged under its own name once the proxy routes by it,
// which tree creation waits for. A member of a colocation group shares
// the group's map, so its own name gets the group map's epoch, and the
// member's drop takes those acknowledgements along while the group's stay.
func TestRegistrationAcknowledgesNewMembers(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	mustCreate(t, s, "t", "x")
	c, r := servingProxy(t, s, s)
	v, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	defer release() // a statement planned before the member existed does not hold it up
	y := colocate(t, s, "t", "y", "x")
	if _, err := c.Refresh(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	r.acknowledge(ctx)
	group, _ := s.Acks(ctx, "t", y.Group)
	member, _ := s.Acks(ctx, "t", "y")
	if member["p1"] != group["p1"] || member["p1"] < v.Maps["x"].Epoch {
		t.Fatalf("acks of the member %v, of its group %v; want the member at the group's epoch", member, group)
	}
	if err := s.DeleteTree(ctx, "t", "y"); err != nil {
		t.Fatal(err)
	}
	if member, _ := s.Acks(ctx, "t", "y"); len(member) != 0 {
		t.Errorf("acks of the dropped member: %v, want none", member)
	}
	if group, _ := s.Acks(ctx, "t", y.Group); group["p1"] == 0 {
		t.Errorf("acks of the group after a member's drop: %v, want them kept", group)
	}
}

// servingProxy is proxy p1 over coord, with a cache of s, its first
// heartbeat done and tenant "t" served once, as after a first statement.
func servingProxy(t *testing.T, s *RedisStore, coord Coordination) (*Cache, *Registration) {
	t.Helper()
	ctx := context.Background()
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", coord, c, time.Minute, time.Hour, nil)
	r.beat(ctx)
	_, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	release()
	return c, r
}

// A reference table's entry is acknowledged like a map: once no statement
// planned on an older entry runs. Deleting the entry takes its
// acknowledgements along, so a table made again under the name is waited
// for from its first epoch.
func TestRegistrationAcknowledgesReferenceEntries(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)
	r.beat(ctx)
	ack := ReferenceAckName("item")
	acked := func() uint64 {
		t.Helper()
		acks, err := s.Acks(ctx, "t", ack)
		if err != nil {
			t.Fatal(err)
		}
		return acks["p1"]
	}
	put := func(ref, prev *Reference) *Reference {
		t.Helper()
		if err := s.PutReference(ctx, ref, prev); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Refresh(ctx, "t"); err != nil {
			t.Fatal(err)
		}
		return ref
	}
	first := put(&Reference{Tenant: "t", Name: "item", Nodes: []string{"n1", "n2"}}, nil)
	if first.Epoch != 1 {
		t.Fatalf("a new entry's epoch: %d, want 1", first.Epoch)
	}
	old, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	r.acknowledge(ctx)
	if got := acked(); got != 1 {
		t.Fatalf("acknowledged %d, want 1", got)
	}
	marked := put(&Reference{Tenant: "t", Name: "item", Nodes: first.Nodes, ChangingSince: time.Now()}, first)
	// A write planned on the first entry still runs: the mark waits.
	r.acknowledge(ctx)
	if got := acked(); got != 1 {
		t.Fatalf("acknowledged %d while a statement ran on epoch %d", got, old.References["item"].Epoch)
	}
	release()
	r.acknowledge(ctx)
	if got := acked(); got != marked.Epoch {
		t.Fatalf("after the statement ended: acknowledged %d, want %d", got, marked.Epoch)
	}

	if err := s.DeleteReference(ctx, marked); err != nil {
		t.Fatal(err)
	}
	if acks, _ := s.Acks(ctx, "t", ack); len(acks) != 0 {
		t.Fatalf("acknowledgements left after the entry's deletion: %v", acks)
	}
	if _, err := c.Refresh(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	r.acknowledge(ctx)
	again := put(&Reference{Tenant: "t", Name: "item", Nodes: []string{"n1"}}, nil)
	r.acknowledge(ctx)
	if got := acked(); got != again.Epoch {
		t.Fatalf("the entry made again: acknowledged %d, want %d", got, again.Epoch)
	}
}
