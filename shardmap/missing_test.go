package shardmap

import (
	"context"
	"errors"
	"testing"
)

// nodeTrees is the nodes' answer in a test: which tenants have trees.
type nodeTrees map[string]bool

func (n nodeTrees) HasTrees(_ context.Context, tenant string) (bool, error) { return n[tenant], nil }

// TestCacheMissingMaps: a store that lost a tenant's trees while the nodes
// still hold them gives a Missing view, not an empty one; a tenant without
// trees anywhere, and one whose trees the store lists, are served.
func TestCacheMissingMaps(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		inStore     bool // the store lists a tree of the tenant
		onNodes     bool // the nodes hold one
		wantMissing bool
	}{
		{"no trees anywhere", false, false, false},
		{"trees in the store", true, true, false},
		{"store lost them", false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, mr := newTestStore(t)
			if tc.inStore || tc.onNodes {
				mustCreate(t, s, "app", "catalogue")
			}
			c := newTestCache(t, s, 0)
			c.CheckNodes(nodeTrees{"app": tc.onNodes})
			v := view(t, c, "app")
			if v.Missing {
				t.Fatalf("Missing before the store lost anything")
			}
			if !tc.inStore {
				mr.FlushAll()
			}
			v, err := c.Refresh(ctx, "app")
			if err != nil {
				t.Fatal(err)
			}
			if v.Missing != tc.wantMissing {
				t.Fatalf("Missing = %v, want %v (trees %v)", v.Missing, tc.wantMissing, v.Trees)
			}
			if got := view(t, c, "app"); got != v {
				t.Fatal("the refreshed view is not the one installed")
			}
		})
	}
}

// TestPutMigrationOnlyCreatesInPrepare: a migration whose record was lost
// cannot write itself back in a later phase, so it stops instead of running
// on beside a recovery.
func TestPutMigrationOnlyCreatesInPrepare(t *testing.T) {
	ctx := context.Background()
	s, mr := newTestStore(t)
	m := &Migration{ID: "m1", Tenant: "t", Tree: "x", Phase: PhasePrepare}
	if err := s.PutMigration(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Phase = PhaseDrain
	if err := s.PutMigration(ctx, m); err != nil {
		t.Fatalf("phase change of a stored record: %v", err)
	}
	mr.FlushAll()
	m.Phase = PhaseFreeze
	if err := s.PutMigration(ctx, m); !errors.Is(err, ErrNotFound) {
		t.Fatalf("phase change of a lost record: %v, want ErrNotFound", err)
	}
	if migs, err := s.Migrations(ctx, "t", "x"); err != nil || len(migs) != 0 {
		t.Fatalf("records after the refused write: %v, %v", migs, err)
	}
}

// flushOnMap is a store that loses everything just before its first read
// of a map or of map epochs: the tree list was read while the tree was
// still there.
type flushOnMap struct {
	Store
	flush func()
	done  bool
}

func (f *flushOnMap) flushOnce() {
	if !f.done {
		f.done = true
		f.flush()
	}
}

func (f *flushOnMap) Map(ctx context.Context, tenant, name string) (*Map, error) {
	f.flushOnce()
	return f.Store.Map(ctx, tenant, name)
}

func (f *flushOnMap) MapEpochs(ctx context.Context, tenant string, names []string) (map[string]uint64, error) {
	f.flushOnce()
	return f.Store.MapEpochs(ctx, tenant, names)
}

// TestCacheLossBetweenReads: the store is flushed between the read of the
// tree list and the read of a listed tree's map. The view must be Missing,
// not a view without the tree, which would send its statements to the
// empty template on the catalog node (a read that finds no row).
func TestCacheLossBetweenReads(t *testing.T) {
	ctx := context.Background()
	s, mr := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	racy := &flushOnMap{Store: s, done: true, flush: mr.FlushAll}
	c := newTestCache(t, racy, 0)
	c.CheckNodes(nodeTrees{"app": true})
	if v := view(t, c, "app"); v.Missing || v.Trees["catalogue"] == nil {
		t.Fatalf("first view: missing %v, trees %v", v.Missing, v.Trees)
	}
	racy.done = false
	v, err := c.Refresh(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if !v.Missing {
		t.Fatalf("the store lost the tree between its reads, but the view is not Missing (trees %v)", v.Trees)
	}
}

// madeMeanwhile is the nodes' answer when a tree is made between the
// cache's read of the empty list and its question to the nodes: the tree
// registers, then its template commits, then the nodes answer.
type madeMeanwhile struct {
	t *testing.T
	s *RedisStore
}

func (n madeMeanwhile) HasTrees(_ context.Context, tenant string) (bool, error) {
	mustCreate(n.t, n.s, tenant, "made")
	return true, nil
}

// TestCacheTreeMadeWhileChecking: a tree made between the read of an
// empty list and the nodes' answer is served, not taken for a loss of the
// tenant's maps.
func TestCacheTreeMadeWhileChecking(t *testing.T) {
	s, _ := newTestStore(t)
	c := newTestCache(t, s, 0)
	c.CheckNodes(madeMeanwhile{t, s})
	v, err := c.Refresh(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	if v.Missing || v.Trees["made"] == nil {
		t.Fatalf("Missing = %v, trees %v; want the new tree served", v.Missing, v.Trees)
	}
}
