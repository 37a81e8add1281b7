package migrator

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

// raceStore runs a hook once, just before the named call reaches the
// store: another writer of the registry getting in between the
// coordinator's read of a tree entry and its write.
type raceStore struct {
	Store
	mu    sync.Mutex
	hooks map[string]func()
}

func (s *raceStore) fire(call string) {
	s.mu.Lock()
	h := s.hooks[call]
	delete(s.hooks, call)
	s.mu.Unlock()
	if h != nil {
		h()
	}
}

func (s *raceStore) StartReshard(ctx context.Context, op *shardmap.Reshard) (*shardmap.Reshard, error) {
	s.fire("StartReshard")
	return s.Store.StartReshard(ctx, op)
}

func (s *raceStore) Migrations(ctx context.Context, tenant, tree string) ([]*shardmap.Migration, error) {
	s.fire("Migrations")
	return s.Store.Migrations(ctx, tenant, tree)
}

// swapTree changes the rig's tree entry by compare-and-set, as a proxy's
// DDL or lattice_set_tree_option does.
func (r *testRig) swapTree(change func(t *shardmap.Tree)) {
	cur, err := r.store.Tree(r.ctx, "app", "items")
	if err != nil {
		r.t.Fatal(err)
	}
	next := *cur
	next.DDL, next.Columns = slices.Clone(cur.DDL), slices.Clone(cur.Columns)
	change(&next)
	if err := r.store.SwapTree(r.ctx, &next, cur); err != nil {
		r.t.Fatal(err)
	}
}

// emptyTables leaves every shard table of the rig in place, without rows.
func (r *testRig) emptyTables() {
	r.nodes.mu.Lock()
	defer r.nodes.mu.Unlock()
	for idx := range r.nodes.tables {
		r.nodes.tables[idx] = map[int]map[string]string{}
	}
}

const raceAlter = "ALTER TABLE {{table}} ADD COLUMN color text"

// TestRepinKeepsConcurrentRegistryWrites: DDL, a tree option or a
// colocation join committed between lattice_reshard's read of the tree
// entry and the re-pin's intent (nothing refuses them yet) stays in the
// registry, and the shards the re-pin creates replay that DDL. The re-pin
// wrote back the entry it had read before, with its new shard count, and
// built the new shards from that entry's DDL log: the change was lost
// from the registry, from those shards and from every later reshard.
func TestRepinKeepsConcurrentRegistryWrites(t *testing.T) {
	for _, tc := range []struct {
		name   string
		write  func(r *testRig)
		repins bool // the tree is still alone, so the re-pin goes ahead
		check  func(t *testing.T, r *testRig, got *shardmap.Tree)
	}{
		{"alter table", func(r *testRig) {
			r.swapTree(func(t *shardmap.Tree) {
				t.DDL = append(t.DDL, raceAlter)
				t.Columns = append(t.Columns, "color")
			})
		}, true, func(t *testing.T, r *testRig, got *shardmap.Tree) {
			if !slices.Contains(got.DDL, raceAlter) || !slices.Contains(got.Columns, "color") {
				t.Errorf("registry entry after the re-pin: DDL %q, columns %q; the ALTER TABLE is lost", got.DDL, got.Columns)
			}
			r.nodes.mu.Lock()
			defer r.nodes.mu.Unlock()
			for _, idx := range []int{4, 5} {
				if !slices.Contains(r.nodes.built[idx], raceAlter) {
					t.Errorf("new shard %d replayed %q, without the ALTER TABLE", idx, r.nodes.built[idx])
				}
			}
		}},
		{"tree option", func(r *testRig) {
			r.swapTree(func(t *shardmap.Tree) { t.AutosplitOff = true })
		}, true, func(t *testing.T, r *testRig, got *shardmap.Tree) {
			if !got.AutosplitOff {
				t.Error("autosplit is on again after the re-pin: the option set before it is lost")
			}
		}},
		{"colocation join", func(r *testRig) {
			anchor, err := r.store.Tree(r.ctx, "app", "items")
			if err != nil {
				r.t.Fatal(err)
			}
			member := *anchor
			member.Name, member.Group = "items_b", "items"
			if err := r.store.CreateColocated(r.ctx, &member, anchor, r.mapNow().Epoch); err != nil {
				r.t.Fatal(err)
			}
		}, false, func(t *testing.T, r *testRig, got *shardmap.Tree) {
			if got.Group != "items" {
				t.Errorf("items is in group %q after the reshard, want items: the join is lost", got.Group)
			}
			if m := r.mapNow(); len(m.Frozen) != 0 {
				t.Errorf("the group's map is left frozen at %v", m.Frozen)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.emptyTables()
			rs := &raceStore{Store: r.store, hooks: map[string]func(){"StartReshard": func() { tc.write(r) }}}
			c := NewCoordinator("c1", newRunner(r.nodes, rs, r.opts, nil, slog.New(slog.DiscardHandler)), CoordinatorOptions{}, nil)
			msg, err := c.Reshard(r.ctx, "app", "items", 6)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(msg, "re-pinned"); got != tc.repins {
				t.Fatalf("Reshard: %q, want a re-pin %v", msg, tc.repins)
			}
			got, err := r.store.Tree(r.ctx, "app", "items")
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 6, false: 4}[tc.repins]; got.ShardCount != want {
				t.Errorf("registry shard count %d, want %d", got.ShardCount, want)
			}
			tc.check(t, r, got)
		})
	}
}

// TestCompleteKeepsConcurrentRegistryWrites: a tree option set during the
// tick that completes a reshard stays. complete wrote back every member's
// entry as the tick had read it at its start.
func TestCompleteKeepsConcurrentRegistryWrites(t *testing.T) {
	r := newRig(t)
	r.swapTree(func(t *shardmap.Tree) { t.ShardCount = 2 }) // before the reshard that has already reached 4
	rs := &raceStore{Store: r.store, hooks: map[string]func(){"Migrations": func() {
		r.swapTree(func(t *shardmap.Tree) { t.AutohealOff = true })
	}}}
	c := NewCoordinator("c1", newRunner(r.nodes, rs, r.opts, nil, slog.New(slog.DiscardHandler)), CoordinatorOptions{}, nil)
	op := &shardmap.Reshard{OpID: newID(), Tenant: "app", Tree: "items", Target: 4, From: 2, Grow: true, Phase: ReshardMigrating}
	if other, err := r.store.StartReshard(r.ctx, op); err != nil || other != nil {
		t.Fatalf("StartReshard: %v, %v", other, err)
	}
	if err := c.Tick(r.ctx, "app", "items"); err != nil {
		t.Fatal(err)
	}
	got, err := r.store.Tree(r.ctx, "app", "items")
	if err != nil {
		t.Fatal(err)
	}
	if got.ShardCount != 4 || !got.AutohealOff {
		t.Fatalf("after the completion: shard count %d (want 4), autoheal off %v (want true)", got.ShardCount, got.AutohealOff)
	}
}
