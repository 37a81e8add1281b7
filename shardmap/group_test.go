package shardmap

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestColocatable(t *testing.T) {
	tree := func(kt KeyType, slots int) *Tree {
		return &Tree{Name: "x", KeyColumn: "k", KeyType: kt, SlotCount: slots}
	}
	tests := []struct {
		name   string
		t, a   *Tree
		target error
	}{
		{"ints together", tree(KeyInt, 4096), tree(KeyInt, 4096), nil},
		{"texts together", tree(KeyText, 4096), tree(KeyText, 4096), nil},
		{"uuid alone", tree(KeyUUID, 4096), tree(KeyUUID, 4096), nil},
		{"int with text", tree(KeyInt, 4096), tree(KeyText, 4096), ErrKeyMismatch},
		{"uuid with text", tree(KeyUUID, 4096), tree(KeyText, 4096), ErrKeyMismatch},
		{"slot counts differ", tree(KeyInt, 1024), tree(KeyInt, 4096), ErrSlotMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Colocatable(tc.t, tc.a)
			if tc.target == nil && err != nil || tc.target != nil && !errors.Is(err, tc.target) {
				t.Fatalf("Colocatable = %v, want %v", err, tc.target)
			}
		})
	}
}

// colocate registers name in the group of anchor, as lattice_create_tree
// does: built from the group's map as read.
func colocate(t *testing.T, s *RedisStore, tenant, name, anchor string) *Tree {
	t.Helper()
	ctx := context.Background()
	a, err := s.Tree(ctx, tenant, anchor)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Map(ctx, tenant, a.MapName())
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := testTree(tenant, name)
	tr.Group = a.MapName()
	if err := s.CreateColocated(ctx, tr, a, m.Epoch); err != nil {
		t.Fatalf("CreateColocated %s with %s: %v", name, anchor, err)
	}
	return tr
}

func TestCreateColocated(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "customers")
	colocate(t, s, "app", "orders", "customers")
	colocate(t, s, "app", "items", "orders") // through a member: the same group

	for _, name := range []string{"customers", "orders", "items"} {
		tr, err := s.Tree(ctx, "app", name)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Group != "customers" || tr.MapName() != "customers" {
			t.Errorf("%s: group %q, map name %q; want customers", name, tr.Group, tr.MapName())
		}
	}
	if _, err := s.Map(ctx, "app", "orders"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a member has a map of its own: %v", err)
	}

	anchor, _ := s.Tree(ctx, "app", "customers")
	m, _ := s.Map(ctx, "app", "customers")
	fresh := func(name string) *Tree {
		tr, _ := testTree("app", name)
		tr.Group = "customers"
		return tr
	}
	refusals := []struct {
		name   string
		setup  func()
		tree   *Tree
		anchor *Tree
		epoch  uint64
		target error
	}{
		{"registered already", nil, fresh("orders"), anchor, m.Epoch, ErrExists},
		{"map moved on", nil, fresh("lines"), anchor, m.Epoch - 1, ErrConflict},
		{"anchor entry changed", nil, fresh("lines"), &Tree{Tenant: "app", Name: "customers", KeyType: KeyText, SlotCount: DefaultSlotCount, Group: "customers"}, m.Epoch, ErrConflict},
		{"intent running", func() {
			s.client.Set(ctx, s.reshardKey("app", "customers"), `{"op_id":"x"}`, 0)
		}, fresh("lines"), anchor, m.Epoch, ErrGroupBusy},
		{"slot count differs", nil, func() *Tree { tr := fresh("lines"); tr.SlotCount = 1024; return tr }(), anchor, m.Epoch, ErrSlotMismatch},
		{"key type differs", nil, func() *Tree { tr := fresh("lines"); tr.KeyType = KeyInt; return tr }(), anchor, m.Epoch, ErrKeyMismatch},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
				defer s.client.Del(ctx, s.reshardKey("app", "customers"))
			}
			if err := s.CreateColocated(ctx, tc.tree, tc.anchor, tc.epoch); !errors.Is(err, tc.target) {
				t.Fatalf("CreateColocated = %v, want %v", err, tc.target)
			}
			if _, err := s.Tree(ctx, "app", "lines"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("a refused tree was registered: %v", err)
			}
		})
	}
}

func TestDropGroupMembers(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "customers")
	colocate(t, s, "app", "orders", "customers")
	colocate(t, s, "app", "items", "customers")

	// The first tree leaves: the group keeps its name and its map.
	if err := s.DeleteTree(ctx, "app", "customers"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Map(ctx, "app", "customers"); err != nil {
		t.Fatalf("the group's map went with its first tree: %v", err)
	}
	tr, m := testTree("app", "customers")
	if err := s.CreateTree(ctx, tr, m); !errors.Is(err, ErrNameInUse) {
		t.Fatalf("a new tree took the group's name: %v", err)
	}
	colocate(t, s, "app", "lines", "orders") // the group still takes members

	for _, name := range []string{"orders", "lines"} {
		if err := s.DeleteTree(ctx, "app", name); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Map(ctx, "app", "customers"); err != nil {
			t.Fatalf("the map went before the last member: %v", err)
		}
	}
	if err := s.DeleteTree(ctx, "app", "items"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Map(ctx, "app", "customers"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the last member left the group's map behind: %v", err)
	}
	if n, _ := s.client.Exists(ctx, s.groupKey("app", "customers")).Result(); n != 0 {
		t.Fatal("the last member left the group's member set behind")
	}
	mustCreate(t, s, "app", "customers") // the name is free again
	if err := s.DeleteTree(ctx, "app", "customers"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTree(ctx, "app", "customers"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second drop = %v, want ErrNotFound", err)
	}
}

func TestCacheGroupView(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "customers")
	mustCreate(t, s, "app", "plans")
	colocate(t, s, "app", "orders", "customers")
	c := NewCache(s, 0, nil)
	v, err := c.View(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"customers", "orders", true}, {"orders", "customers", true}, {"orders", "orders", true},
		{"orders", "plans", false}, {"plans", "plans", true}, {"orders", "nosuch", false},
	} {
		if got := v.Colocated(tc.a, tc.b); got != tc.want {
			t.Errorf("Colocated(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if got := v.Members("orders"); !slices.Equal(got, []string{"customers", "orders"}) {
		t.Errorf("Members(orders) = %v", got)
	}
	if v.GroupMap("orders").Tree != "orders" || v.GroupMap("customers").Epoch != v.GroupMap("orders").Epoch {
		t.Errorf("members' maps: %+v %+v", v.GroupMap("orders"), v.GroupMap("customers"))
	}

	// One write of the group's map moves every member, in one view.
	m, _ := s.Map(ctx, "app", "customers")
	next := m.Clone()
	next.Slots[0] = 1
	if err := s.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	if err := c.loadMap(ctx, "app", c.tenant("app"), "customers"); err != nil {
		t.Fatal(err)
	}
	v, _ = c.View(ctx, "app")
	for _, name := range []string{"customers", "orders"} {
		if got := v.Maps[name]; got.Epoch != next.Epoch || got.Slots[0] != 1 || got.Tree != name {
			t.Errorf("%s after the group's swap: epoch %d slot0 %d tree %q", name, got.Epoch, got.Slots[0], got.Tree)
		}
	}
	if v.Maps["plans"].Epoch != 1 {
		t.Errorf("another tree's map moved: %d", v.Maps["plans"].Epoch)
	}

	// Waiting on a member whose group's first tree is gone still works.
	if err := s.DeleteTree(ctx, "app", "customers"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refresh(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	m, _ = s.Map(ctx, "app", "customers")
	if err := s.SwapMap(ctx, m.Clone(), m.Epoch); err != nil {
		t.Fatal(err)
	}
	v, err = c.Wait(ctx, "app", "orders", m.Epoch+1)
	if err != nil || v.Maps["orders"].Epoch != m.Epoch+1 {
		t.Fatalf("Wait on a member: %v", err)
	}
}

// TestRegistrationAcksGroup: a proxy acknowledges a group's epoch under
// the group's name, and only once no statement on an older map of any
// member runs; under a member's own name, as soon as it routes by it.
func TestRegistrationAcksGroup(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "t", "customers")
	colocate(t, s, "t", "orders", "customers")
	if err := s.DeleteTree(ctx, "t", "customers"); err != nil {
		t.Fatal(err) // the group's name is no tree's now
	}
	c := NewCache(s, time.Hour, nil)
	r := NewRegistration("p1", s, c, time.Minute, time.Hour, nil)
	r.beat(ctx)
	old, release, err := r.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	r.acknowledge(ctx)
	m, _ := s.Map(ctx, "t", "customers")
	if acks, _ := s.Acks(ctx, "t", "customers"); acks["p1"] != m.Epoch {
		t.Fatalf("acks of the group %v, want p1 at %d", acks, m.Epoch)
	}
	if err := s.SwapMap(ctx, m.Clone(), m.Epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refresh(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "customers"); acks["p1"] != m.Epoch {
		t.Fatalf("acknowledged %d while a statement ran on orders at epoch %d", acks["p1"], old.Maps["orders"].Epoch)
	}
	release()
	r.acknowledge(ctx)
	if acks, _ := s.Acks(ctx, "t", "customers"); acks["p1"] != m.Epoch+1 {
		t.Fatalf("acks of the group %v, want p1 at %d", acks, m.Epoch+1)
	}
	// Under its own name a member is acknowledged as known, which is all
	// tree creation waits for; freezes read the group's.
	if acks, _ := s.Acks(ctx, "t", "orders"); acks["p1"] != m.Epoch+1 {
		t.Fatalf("acks of the member under its own name %v, want p1 at %d", acks, m.Epoch+1)
	}
}
