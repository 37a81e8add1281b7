package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// openStore opens the harness's redis the way `lattice serve --redis` does.
// Proxies started by other tests share the key space and the event channel,
// so each test works in a tenant of its own.
func openStore(t *testing.T) (*shardmap.RedisStore, string) {
	t.Helper()
	return harnessStore(t), fmt.Sprintf("it_store_%d", time.Now().UnixNano())
}

// storedTree reads tree name of the default tenant and its map from store.
func storedTree(t *testing.T, ctx context.Context, store *shardmap.RedisStore, name string) (*shardmap.Tree, *shardmap.Map) {
	t.Helper()
	tree, err := store.Tree(ctx, "lattice", name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := store.Map(ctx, "lattice", tree.MapName()) // a colocation group's, for a member
	if err != nil {
		t.Fatal(err)
	}
	return tree, m
}

// harnessStore opens the harness's redis for the test, closed at its end.
func harnessStore(t *testing.T) *shardmap.RedisStore {
	t.Helper()
	s, err := shardmap.OpenRedis(context.Background(), testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func createTree(t *testing.T, s shardmap.Store, tenant, name string) *shardmap.Tree {
	t.Helper()
	tr := &shardmap.Tree{
		Tenant: tenant, Name: name, KeyColumn: "id", KeyType: shardmap.KeyInt,
		Columns: []string{"id", "v"}, SlotCount: shardmap.DefaultSlotCount, ShardCount: 4,
		DDL: []string{"CREATE TABLE {{table}} (id bigint PRIMARY KEY, v text)"},
	}
	m := shardmap.NewIdentityMap(tenant, name, shardmap.DefaultSlotCount, 4, []string{"n1", "n2", "n3"})
	if err := s.CreateTree(context.Background(), tr, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.DeleteTree(context.Background(), tenant, name) })
	return tr
}

// TestRedisStoreCompareAndSet races read-modify-swap writers on two
// connections pools (two proxies) against real Redis: every success must
// raise the epoch by exactly one and no write may be lost.
func TestRedisStoreCompareAndSet(t *testing.T) {
	ctx := context.Background()
	s1, tenant := openStore(t)
	s2, _ := openStore(t)
	createTree(t, s1, tenant, "catalogue")
	if err := s2.CreateTree(ctx, &shardmap.Tree{Tenant: tenant, Name: "catalogue"},
		&shardmap.Map{Tenant: tenant, Tree: "catalogue"}); !errors.Is(err, shardmap.ErrExists) {
		t.Fatalf("second CreateTree: %v, want ErrExists", err)
	}

	const workers, perWorker = 8, 25
	var swaps, conflicts atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		s := []*shardmap.RedisStore{s1, s2}[w%2]
		wg.Go(func() {
			for range perWorker {
				for {
					m, err := s.Map(ctx, tenant, "catalogue")
					if err != nil {
						t.Error(err)
						return
					}
					m.Slots[w]++
					err = s.SwapMap(ctx, m, m.Epoch)
					if errors.Is(err, shardmap.ErrConflict) {
						conflicts.Add(1)
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					swaps.Add(1)
					break
				}
			}
		})
	}
	wg.Wait()
	m, err := s1.Map(ctx, tenant, "catalogue")
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != uint64(1+swaps.Load()) || swaps.Load() != workers*perWorker {
		t.Fatalf("epoch %d after %d swaps, want %d swaps", m.Epoch, swaps.Load(), workers*perWorker)
	}
	for w := range workers {
		if m.Slots[w] != perWorker {
			t.Errorf("slot %d = %d, want %d: a swap was lost", w, m.Slots[w], perWorker)
		}
	}
	t.Logf("%d swaps, %d conflicts", swaps.Load(), conflicts.Load())
}

// TestRedisStoreSubscribe checks that subscribers created before a change
// (two proxies) both receive its event, in order, from real Redis.
func TestRedisStoreSubscribe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, tenant := openStore(t)
	other, _ := openStore(t)
	subs := make([]<-chan shardmap.Event, 2)
	for i, st := range []*shardmap.RedisStore{s, other} {
		var err error
		if subs[i], err = st.Subscribe(ctx); err != nil {
			t.Fatal(err)
		}
	}

	tr := createTree(t, s, tenant, "catalogue")
	m, err := s.Map(ctx, tenant, "catalogue")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SwapMap(ctx, m, 1); err != nil {
		t.Fatal(err)
	}
	next := *tr
	next.ShardCount = 8
	if err := s.SwapTree(ctx, &next, tr); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTree(ctx, tenant, "catalogue"); err != nil {
		t.Fatal(err)
	}

	want := []shardmap.Event{
		{Kind: shardmap.EventTree, Tenant: tenant, Tree: "catalogue"},
		{Kind: shardmap.EventMap, Tenant: tenant, Tree: "catalogue", Epoch: 2},
		{Kind: shardmap.EventTree, Tenant: tenant, Tree: "catalogue"},
		{Kind: shardmap.EventTree, Tenant: tenant, Tree: "catalogue"},
	}
	for i, ch := range subs {
		for j, w := range want {
			got := nextEvent(t, ch, tenant)
			got.Carried = nil // the map a map event carries: shardmap's TestSubscribe
			if got != w {
				t.Errorf("subscriber %d, event %d = %+v, want %+v", i, j, got, w)
			}
		}
	}
	cancel()
	for _, ch := range subs {
		for range ch { // closed once ctx ends
		}
	}
}

// nextEvent returns the next event of tenant, skipping other tests' events.
func nextEvent(t *testing.T, ch <-chan shardmap.Event, tenant string) shardmap.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("event channel closed")
			}
			if ev.Tenant == tenant {
				return ev
			}
		case <-timeout:
			t.Fatal("no event within 10s")
		}
	}
}

// TestRedisStoreCache checks that a proxy's cache follows a swap made by
// another proxy through real Redis pub/sub alone (no refresh timer).
func TestRedisStoreCache(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, tenant := openStore(t)
	writer, _ := openStore(t)
	createTree(t, writer, tenant, "catalogue")

	c := shardmap.NewCache(s, time.Hour, slog.New(slog.NewTextHandler(t.Output(), nil)))
	v, err := c.View(ctx, tenant)
	if err != nil || v.Maps["catalogue"].Epoch != 1 {
		t.Fatalf("first view: %+v, %v", v, err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	swap := func() uint64 {
		m, err := writer.Map(ctx, tenant, "catalogue")
		if err != nil {
			t.Fatal(err)
		}
		if err := writer.SwapMap(ctx, m, m.Epoch); err != nil {
			t.Fatal(err)
		}
		return m.Epoch
	}
	// View never reads the store once loaded and the refresh is an hour, so
	// only an event can bring the swap in.
	seen := func(epoch uint64, within time.Duration) bool {
		for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if v, err := c.View(ctx, tenant); err == nil && v.Maps["catalogue"].Epoch >= epoch {
				return true
			}
		}
		return false
	}
	// Run subscribes asynchronously and misses what comes before: swap until
	// one arrives, then every later swap must.
	for i := 0; !seen(swap(), 200*time.Millisecond); i++ {
		if i == 50 {
			t.Fatal("the cache never saw a swap")
		}
	}
	for range 3 {
		if epoch := swap(); !seen(epoch, 5*time.Second) {
			t.Fatalf("the cache did not see epoch %d", epoch)
		}
	}
	v, err = c.View(ctx, tenant)
	if err != nil || v.Trees["catalogue"] == nil {
		t.Errorf("view lost the tree: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
