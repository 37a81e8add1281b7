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
	old, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
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

// TestRegistrationAcknowledgesUnservedTenants: a proxy that has served no
// statement of a tenant still acknowledges the epochs of its reshards, or
// every freeze would wait for it in vain.
func TestRegistrationAcknowledgesUnservedTenants(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	_, m := mustCreate(t, s, "t", "x")
	mustCreate(t, s, "quiet", "y")
	r := NewRegistration("idle", s, NewCache(s, time.Hour, nil), time.Minute, time.Hour, nil)
	r.beat(ctx)
	r.loadResharding(ctx)
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "x"); len(acks) != 0 {
		t.Fatalf("acks %v before any reshard: the tenant was not served", acks)
	}
	if _, err := s.StartReshard(ctx, &Reshard{OpID: "op", Tenant: "t", Tree: "x", Target: 8}); err != nil {
		t.Fatal(err)
	}
	r.loadResharding(ctx)
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "x"); acks["idle"] != m.Epoch {
		t.Fatalf("acks %v, want idle at %d", acks, m.Epoch)
	}
	if acks, _ := s.Acks(ctx, "quiet", "y"); len(acks) != 0 {
		t.Errorf("acks of a tenant without a reshard: %v", acks)
	}
}
