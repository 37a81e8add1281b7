package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func newTestStore(t *testing.T) (*RedisStore, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	s := NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
	t.Cleanup(func() { s.Close() })
	return s, mr
}

func testTree(tenant, name string) (*Tree, *Map) {
	t := &Tree{
		Tenant: tenant, Name: name, KeyColumn: "sku", KeyType: KeyText,
		Columns: []string{"sku", "title"}, SlotCount: DefaultSlotCount, ShardCount: 4,
		DDL: []string{"CREATE TABLE {{table}} (sku text PRIMARY KEY, title text)"},
	}
	return t, NewIdentityMap(tenant, name, DefaultSlotCount, 4, []string{"n1", "n2"})
}

func mustCreate(t *testing.T, s Store, tenant, name string) (*Tree, *Map) {
	t.Helper()
	tr, m := testTree(tenant, name)
	if err := s.CreateTree(context.Background(), tr, m); err != nil {
		t.Fatalf("CreateTree %s/%s: %v", tenant, name, err)
	}
	return tr, m
}

func TestCreateTree(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	// A tenant name with hash-tag characters must not leak into another's keys.
	for _, tenant := range []string{"app", "odd}{%tenant"} {
		mustCreate(t, s, tenant, "catalogue")
		mustCreate(t, s, tenant, "accounts")
	}

	tests := []struct {
		name   string
		tree   func() (*Tree, *Map)
		target error
	}{
		{"again", func() (*Tree, *Map) { return testTree("app", "catalogue") }, ErrExists},
		{"same name other tenant", func() (*Tree, *Map) { return testTree("other", "catalogue") }, nil},
		{"map of another tree", func() (*Tree, *Map) {
			tr, _ := testTree("app", "orders")
			_, m := testTree("app", "catalogue")
			return tr, m
		}, errors.New("any")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, m := tc.tree()
			err := s.CreateTree(ctx, tr, m)
			switch {
			case tc.target == nil && err != nil:
				t.Fatalf("CreateTree: %v", err)
			case tc.target != nil && err == nil:
				t.Fatalf("CreateTree succeeded, want an error")
			case errors.Is(tc.target, ErrExists) && !errors.Is(err, ErrExists):
				t.Fatalf("CreateTree: %v, want ErrExists", err)
			}
		})
	}

	for _, tenant := range []string{"app", "odd}{%tenant"} {
		trees, err := s.Trees(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if len(trees) != 2 || trees[0].Name != "accounts" || trees[1].Name != "catalogue" {
			t.Fatalf("Trees(%q) = %v, want accounts, catalogue", tenant, trees)
		}
		if trees[0].Created.IsZero() {
			t.Errorf("Created was not set")
		}
	}
	if _, err := s.Tree(ctx, "app", "orders"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Tree(orders) after a refused create: %v, want ErrNotFound", err)
	}
	got, err := s.Tree(ctx, "app", "catalogue")
	if err != nil || got.KeyColumn != "sku" || len(got.DDL) != 1 {
		t.Fatalf("Tree = %+v, %v", got, err)
	}
	m, err := s.Map(ctx, "app", "catalogue")
	if err != nil || m.Epoch != 1 || len(m.Slots) != DefaultSlotCount || m.Owner(4095).Index != 3 {
		t.Fatalf("Map = epoch %d, %d slots, %v", m.Epoch, len(m.Slots), err)
	}
	if _, err := s.Map(ctx, "app", "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Map(nope): %v, want ErrNotFound", err)
	}
}

func TestSwapDeleteTree(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	tr, m := mustCreate(t, s, "app", "catalogue")

	next := *tr
	next.ShardCount = 16
	next.DDL = append(slices.Clone(tr.DDL), "CREATE INDEX ON {{table}} (title)")
	if err := s.SwapTree(ctx, &next, tr); err != nil {
		t.Fatal(err)
	}
	got, err := s.Tree(ctx, "app", "catalogue")
	if err != nil || got.ShardCount != 16 || len(got.DDL) != 2 {
		t.Fatalf("after swap: %+v, %v", got, err)
	}
	if cur, _ := s.Map(ctx, "app", "catalogue"); cur.Epoch != 1 {
		t.Errorf("SwapTree changed the map epoch to %d", cur.Epoch)
	}

	if err := s.DeleteTree(ctx, "app", "catalogue"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTree(ctx, "app", "catalogue"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second DeleteTree: %v, want ErrNotFound", err)
	}
	if _, err := s.Tree(ctx, "app", "catalogue"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Tree after delete: %v", err)
	}
	if _, err := s.Map(ctx, "app", "catalogue"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Map after delete: %v", err)
	}
	if err := s.SwapMap(ctx, m, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("SwapMap after delete: %v, want ErrNotFound", err)
	}
	if trees, err := s.Trees(ctx, "app"); err != nil || len(trees) != 0 {
		t.Errorf("Trees after delete: %v, %v", trees, err)
	}
	// The name is free again.
	mustCreate(t, s, "app", "catalogue")
}

func TestSwapMap(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")

	tests := []struct {
		name      string
		expected  uint64
		wantErr   error
		wantEpoch uint64 // stored afterwards
	}{
		{"current epoch", 1, nil, 2},
		{"stale epoch", 1, ErrConflict, 2},
		{"future epoch", 7, ErrConflict, 2},
		{"next", 2, nil, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := s.Map(ctx, "app", "catalogue")
			if err != nil {
				t.Fatal(err)
			}
			before := m.Epoch
			m.Slots[0] = 3
			err = s.SwapMap(ctx, m, tc.expected)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("SwapMap: %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && m.Epoch != tc.expected+1 {
				t.Errorf("m.Epoch = %d after a swap, want %d", m.Epoch, tc.expected+1)
			}
			if tc.wantErr != nil && m.Epoch != before {
				t.Errorf("m.Epoch changed to %d by a failed swap", m.Epoch)
			}
			got, err := s.Map(ctx, "app", "catalogue")
			if err != nil || got.Epoch != tc.wantEpoch {
				t.Fatalf("stored epoch %d, %v; want %d", got.Epoch, err, tc.wantEpoch)
			}
			if tc.wantErr == nil && got.Slots[0] != 3 {
				t.Errorf("the swapped map was not stored")
			}
		})
	}
}

// testConcurrentSwaps has N goroutines each make K read-modify-swap changes,
// retrying on ErrConflict; every success must be counted exactly once.
func testConcurrentSwaps(t *testing.T, s Store, tenant string) {
	ctx := context.Background()
	mustCreate(t, s, tenant, "catalogue")
	const workers, perWorker = 6, 10
	var swaps, conflicts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for range perWorker {
				for {
					m, err := s.Map(ctx, tenant, "catalogue")
					if err != nil {
						errs <- err
						return
					}
					m.Slots[w]++ // each worker counts its own successes in the map too
					err = s.SwapMap(ctx, m, m.Epoch)
					if errors.Is(err, ErrConflict) {
						conflicts.Add(1)
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					swaps.Add(1)
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	m, err := s.Map(ctx, tenant, "catalogue")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Epoch, uint64(1+swaps.Load()); got != want || swaps.Load() != workers*perWorker {
		t.Fatalf("epoch %d after %d swaps, want %d and %d swaps", got, swaps.Load(), want, workers*perWorker)
	}
	for w := range workers {
		if m.Slots[w] != perWorker { // identity map: the first slots start on shard 0
			t.Errorf("slot %d = %d, want %d: a swap was lost", w, m.Slots[w], perWorker)
		}
	}
	t.Logf("%d swaps, %d conflicts", swaps.Load(), conflicts.Load())
}

func TestSwapMapConcurrent(t *testing.T) {
	s, _ := newTestStore(t)
	testConcurrentSwaps(t, s, "app")
}

func recv(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("event channel closed")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return Event{}
}

func TestSubscribe(t *testing.T) {
	s, mr := newTestStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}

	tr, m := mustCreate(t, s, "app", "catalogue")
	if err := s.SwapMap(ctx, m, 1); err != nil {
		t.Fatal(err)
	}
	next := *tr
	next.ShardCount = 8
	if err := s.SwapTree(ctx, &next, tr); err != nil {
		t.Fatal(err)
	}
	if err := s.SwapMap(ctx, m, 1); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale swap: %v", err) // must publish nothing
	}
	// Garbage on the channel is skipped, not delivered or fatal.
	mr.Publish("test:events", "not json")
	if err := s.DeleteTree(ctx, "app", "catalogue"); err != nil {
		t.Fatal(err)
	}

	want := []Event{
		{Kind: EventTree, Tenant: "app", Tree: "catalogue"},
		{Kind: EventMap, Tenant: "app", Tree: "catalogue", Epoch: 2},
		{Kind: EventTree, Tenant: "app", Tree: "catalogue"},
		{Kind: EventTree, Tenant: "app", Tree: "catalogue"},
	}
	for i, w := range want {
		got := recv(t, events)
		if got.Kind == EventMap {
			// The map event carries the map written, for the tree as created.
			var cm Map
			if c := got.Carried; c == nil || json.Unmarshal(c.Map, &cm) != nil || cm.Epoch != 2 || !c.Created.Equal(tr.Created) {
				t.Errorf("event %d carries %+v, want the map of epoch 2 and the tree's creation time", i, got.Carried)
			}
			got.Carried = nil
		}
		if got != w {
			t.Errorf("event %d = %+v, want %+v", i, got, w)
		}
	}

	cancel()
	for range events { // must be closed once ctx ends
	}
}

func TestOpenRedisURLs(t *testing.T) {
	tests := []struct {
		url    string
		mode   string // "" for an error
		goURL  string // what go-redis parses
		client string // Go type of the client
	}{
		{"redis://localhost:6379/2", modeSingle, "redis://localhost:6379/2", "*redis.Client"},
		{"rediss://user:pw@localhost:6380", modeSingle, "rediss://user:pw@localhost:6380", "*redis.Client"},
		{"redis-sentinel://s1:26379,s2:26379,s3:26379/mymaster", modeSentinel,
			"redis://s1:26379?addr=s2%3A26379&addr=s3%3A26379&master_name=mymaster", "*redis.Client"},
		{"rediss-sentinel://su:sp@s1:26379/mymaster/3?password=secret", modeSentinel,
			"rediss://su:sp@s1:26379/3?master_name=mymaster&password=secret", "*redis.Client"},
		{"redis-cluster://c1:7000,c2:7001?pool_size=5", modeCluster,
			"redis://c1:7000?addr=c2%3A7001&pool_size=5", "*redis.ClusterClient"},
		{"redis-sentinel://s1:26379", "", "", ""},
		{"redis-sentinel://s1:26379/a/1/x", "", "", ""},
		{"memcache://localhost", "", "", ""},
		{"localhost:6379", "", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			mode, u, err := goRedisURL(tc.url)
			if tc.mode == "" {
				if err == nil {
					t.Fatalf("goRedisURL = %s %s, want an error", mode, u)
				}
				return
			}
			if err != nil || mode != tc.mode || u != tc.goURL {
				t.Fatalf("goRedisURL = %s %s %v, want %s %s", mode, u, err, tc.mode, tc.goURL)
			}
			c, err := newUniversalClient(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := fmt.Sprintf("%T", c); got != tc.client {
				t.Errorf("client %s, want %s", got, tc.client)
			}
		})
	}
	if _, err := newUniversalClient("redis://localhost:6379/2?bogus=1"); err == nil {
		t.Errorf("an unknown option was accepted")
	}
}

func TestUnavailableMarksOnlyRedisOutOfReach(t *testing.T) {
	s, mr := newTestStore(t)
	ctx := context.Background()
	if err := s.client.Set(ctx, "test:str", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A request Redis rejects is not an outage.
	if err := s.client.HGet(ctx, "test:str", "f").Err(); err == nil || Unavailable(err) {
		t.Fatalf("WRONGTYPE: %v, Unavailable = %v", err, Unavailable(err))
	}
	mr.Close()
	if _, err := s.Trees(ctx, "t"); !Unavailable(err) {
		t.Fatalf("with Redis gone, a command: %v, want an UnavailableError", err)
	}
	if _, err := s.Lagging(ctx, "t", "x", 1); !Unavailable(err) {
		t.Fatalf("with Redis gone, a pipeline: %v, want an UnavailableError", err)
	}
}

// TestOpenRedisRedactsPassword: a malformed URL's error must not quote its
// password, which would then reach the log.
func TestOpenRedisRedactsPassword(t *testing.T) {
	for _, u := range []string{
		"redis://:s3cret@localhost:6379/0%zz",
		"redis://user:s3cret@local host:6379/0",
		"redis-sentinel://:s3cret@s1:26379,s2:26379/m%zz",
		"redis://:s3cret@localhost:6379/0?bogus=1",
		"redis://:s3cret@127.0.0.1:1/0",
	} {
		_, err := OpenRedis(t.Context(), u)
		if err == nil {
			t.Fatalf("OpenRedis(%s) succeeded", u)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("OpenRedis error quotes the password: %v", err)
		}
	}
}

// TestMapReadsIndependent: a map read is the caller's to change (the
// store keeps its decoded maps), and a change stored by another process
// is seen at once.
func TestMapReadsIndependent(t *testing.T) {
	ctx := context.Background()
	s, mr := newTestStore(t)
	other := NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
	t.Cleanup(func() { other.Close() })
	tr, _ := mustCreate(t, s, "app", "catalogue")

	stored := func() *Map {
		t.Helper()
		m := new(Map)
		if err := json.Unmarshal([]byte(mr.HGet(s.mapKey("app", "catalogue"), "map")), m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	read := func(st *RedisStore) *Map {
		t.Helper()
		m, err := st.Map(ctx, "app", "catalogue")
		if err != nil {
			t.Fatal(err)
		}
		if want := stored(); !reflect.DeepEqual(m, want) {
			t.Fatalf("Map returned a map other than the stored one: epoch %d, slot 0 on %d, shard 0 %+v, frozen %v; stored: %d, %d, %+v, %v",
				m.Epoch, m.Slots[0], m.Shards[0], m.Frozen, want.Epoch, want.Slots[0], want.Shards[0], want.Frozen)
		}
		return m
	}

	for range 2 { // the first read decodes, the second finds it kept
		m := read(s)
		m.Slots[0], m.Shards[0] = 3, Shard{Index: 0, Node: "elsewhere"}
		m.Frozen = append(m.Frozen, [2]int{0, 9})
		read(s) // the change above was the caller's alone
	}

	m := read(s)
	m.Slots[1] = 2
	if err := s.SwapMap(ctx, m, m.Epoch); err != nil {
		t.Fatal(err)
	}
	m.Slots[1] = 1 // after the swap: not what is stored
	if got := read(s); got.Slots[1] != 2 || got.Epoch != 2 {
		t.Fatalf("after a swap: slot 1 on %d at epoch %d, want 2 at 2", got.Slots[1], got.Epoch)
	}

	m = read(other)
	m.Slots[2] = 1
	if err := other.SwapMap(ctx, m, m.Epoch); err != nil {
		t.Fatal(err)
	}
	if got := read(s); got.Slots[2] != 1 || got.Epoch != 3 {
		t.Fatalf("another store's swap not seen: slot 2 on %d at epoch %d", got.Slots[2], got.Epoch)
	}

	if err := other.DeleteTree(ctx, tr.Tenant, tr.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Map(ctx, "app", "catalogue"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Map of a dropped tree: %v, want ErrNotFound", err)
	}
}

// TestDecodedMapsBounded: the store keeps at most maxDecodedMaps maps, and
// a map it let go is decoded again.
func TestDecodedMapsBounded(t *testing.T) {
	var d decodedMaps
	m := NewIdentityMap("app", "t", 16, 2, []string{"n1"})
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxDecodedMaps + 10 {
		if _, err := d.decode(fmt.Sprint("k", i), string(raw)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(d.byKey); n != maxDecodedMaps {
		t.Fatalf("%d maps kept, want %d", n, maxDecodedMaps)
	}
	for i := range maxDecodedMaps + 10 {
		got, err := d.decode(fmt.Sprint("k", i), string(raw))
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("map %d after the bound: %v", i, err)
		}
	}
}
