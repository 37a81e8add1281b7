package migrator

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// racingRegistry creates a tree with a shard on node during the first
// registry write, as lattice_create_tree on another proxy could between
// RemoveNode's check and its write.
type racingRegistry struct {
	*shardmap.RedisStore
	node  string
	raced bool
}

func (r *racingRegistry) SwapNodes(ctx context.Context, n *shardmap.Nodes, expected uint64) error {
	if !r.raced {
		r.raced = true
		t := &shardmap.Tree{Tenant: "app", Name: "late", KeyColumn: "k", KeyType: shardmap.KeyInt, SlotCount: 16, ShardCount: 1}
		if err := r.RedisStore.CreateTree(ctx, t, shardmap.NewIdentityMap("app", "late", 16, 1, []string{r.node})); err != nil {
			return err
		}
	}
	return r.RedisStore.SwapNodes(ctx, n, expected)
}

func newNodeTestFunctions(t *testing.T, wrap func(*shardmap.RedisStore) NodeRegistry) (*Functions, *shardmap.RedisStore) {
	t.Helper()
	ctx := context.Background()
	mr := miniredis.RunT(t)
	store := shardmap.NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
	t.Cleanup(func() { store.Close() })
	seed := &shardmap.Nodes{}
	for _, n := range []string{"n1", "n2", "n3"} {
		seed.Nodes = append(seed.Nodes, shardmap.NodeEntry{Name: n, DSN: "postgres://u@" + n + "/db", State: shardmap.NodeActive, Added: time.Now()})
	}
	if err := store.SwapNodes(ctx, seed, 0); err != nil {
		t.Fatal(err)
	}
	reg := wrap(store)
	watch := shardmap.NewNodeWatch(reg, time.Second, nil, func(*shardmap.Nodes) error { return nil }, nil)
	f := NewFunctions(nil, store, nil, nil, nil)
	f.SetNodeAdmin(NodeAdmin{Registry: reg, Watch: watch})
	return f, store
}

func TestRemoveNodeRefusals(t *testing.T) {
	ctx := context.Background()
	f, store := newNodeTestFunctions(t, func(s *shardmap.RedisStore) NodeRegistry { return s })
	tr := &shardmap.Tree{Tenant: "app", Name: "t", KeyColumn: "k", KeyType: shardmap.KeyInt, SlotCount: 16, ShardCount: 1}
	if err := store.CreateTree(ctx, tr, shardmap.NewIdentityMap("app", "t", 16, 1, []string{"n2"})); err != nil {
		t.Fatal(err)
	}
	// Recorded in prepare, then moved on, as the runner does: a record past
	// prepare is written only over a stored one.
	mig := &shardmap.Migration{ID: "m1", Tenant: "app", Tree: "t", Kind: shardmap.Split,
		SourceNode: "n1", TargetNode: "n3", Phase: shardmap.PhasePrepare}
	for _, ph := range []shardmap.MigrationPhase{shardmap.PhasePrepare, shardmap.PhaseCopy} {
		mig.Phase = ph
		if err := store.PutMigration(ctx, mig); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ node, code string }{
		{"n1", sqlstate.ObjectNotInPrerequisiteState}, // the catalog node
		{"n2", sqlstate.ObjectNotInPrerequisiteState}, // holds a shard
		{"n3", sqlstate.ObjectNotInPrerequisiteState}, // a migration in flight writes to it
		{"n9", sqlstate.UndefinedObject},
	} {
		_, err := f.RemoveNode(ctx, tc.node)
		if !sqlstate.Is(err, tc.code) {
			t.Errorf("RemoveNode(%s) = %v, want %s", tc.node, err, tc.code)
		}
	}
	if reg, _ := store.Nodes(ctx); len(reg.Nodes) != 3 || reg.Version != 1 {
		t.Fatalf("refused removals changed the registry: %+v", reg)
	}
}

func TestRemoveNodePutsBackOnRace(t *testing.T) {
	ctx := context.Background()
	f, store := newNodeTestFunctions(t, func(s *shardmap.RedisStore) NodeRegistry { return &racingRegistry{RedisStore: s, node: "n3"} })
	_, err := f.RemoveNode(ctx, "n3")
	if !sqlstate.Is(err, sqlstate.ObjectNotInPrerequisiteState) {
		t.Fatalf("RemoveNode with a shard placed meanwhile = %v, want 55000", err)
	}
	reg, err := store.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.Node("n3"); !ok {
		t.Fatalf("the node holding the late shard is gone from the registry: %+v", reg.Nodes)
	}
}
