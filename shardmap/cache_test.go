package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lossyStore loses every event, as if each publish were missed.
type lossyStore struct{ Store }

func (lossyStore) Subscribe(ctx context.Context) (<-chan Event, error) {
	ch := make(chan Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

// subscribedStore reports when Subscribe has returned, so a test publishes
// only once the cache is listening.
type subscribedStore struct {
	Store
	subscribed chan struct{}
}

func (s subscribedStore) Subscribe(ctx context.Context) (<-chan Event, error) {
	ch, err := s.Store.Subscribe(ctx)
	close(s.subscribed)
	return ch, err
}

func newTestCache(t *testing.T, s Store, refresh time.Duration) *Cache {
	return NewCache(s, refresh, slog.New(slog.NewTextHandler(t.Output(), nil)))
}

// runCache runs c until the test ends and checks that Run returns nil.
func runCache(t *testing.T, c *Cache) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// runSubscribedCache runs a cache over s and returns once it is subscribed.
func runSubscribedCache(t *testing.T, s Store, refresh time.Duration) *Cache {
	ss := subscribedStore{Store: s, subscribed: make(chan struct{})}
	c := newTestCache(t, ss, refresh)
	runCache(t, c)
	select {
	case <-ss.subscribed:
	case <-time.After(5 * time.Second):
		t.Fatal("cache did not subscribe")
	}
	return c
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func view(t *testing.T, c *Cache, tenant string) *View {
	t.Helper()
	v, err := c.View(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func swap(t *testing.T, s Store, tenant, tree string) uint64 {
	t.Helper()
	ctx := context.Background()
	m, err := s.Map(ctx, tenant, tree)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SwapMap(ctx, m, m.Epoch); err != nil {
		t.Fatal(err)
	}
	return m.Epoch
}

func epochOf(v *View, tree string) uint64 {
	if m := v.Maps[tree]; m != nil {
		return m.Epoch
	}
	return 0
}

func TestCacheFollowsEvents(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	tr, _ := mustCreate(t, s, "app", "catalogue")
	mustCreate(t, s, "other", "catalogue")
	// An hour-long refresh: only events can bring changes in.
	c := runSubscribedCache(t, s, time.Hour)

	v1 := view(t, c, "app")
	if epochOf(v1, "catalogue") != 1 || v1.Trees["catalogue"] == nil || v1.TreesVersion == 0 {
		t.Fatalf("first view: %+v", v1)
	}

	swap(t, s, "app", "catalogue")
	eventually(t, "the swap", func() bool { return epochOf(view(t, c, "app"), "catalogue") == 2 })
	v2 := view(t, c, "app")
	if v2.TreesVersion != v1.TreesVersion {
		t.Errorf("a map change moved TreesVersion %d -> %d", v1.TreesVersion, v2.TreesVersion)
	}
	if epochOf(v1, "catalogue") != 1 {
		t.Errorf("an earlier view changed")
	}

	steps := []struct {
		name   string
		change func() error
		done   func(*View) bool
	}{
		{"create", func() error {
			tr, m := testTree("app", "accounts")
			return s.CreateTree(ctx, tr, m)
		}, func(v *View) bool { return v.Trees["accounts"] != nil && v.Maps["accounts"] != nil }},
		{"update", func() error {
			next := *tr
			next.DDL = append(slices.Clone(tr.DDL), "CREATE INDEX ON {{table}} (title)")
			return s.SwapTree(ctx, &next, tr)
		}, func(v *View) bool { return len(v.Trees["catalogue"].DDL) == 2 }},
		{"delete", func() error { return s.DeleteTree(ctx, "app", "accounts") },
			func(v *View) bool { return v.Trees["accounts"] == nil && v.Maps["accounts"] == nil }},
	}
	for _, st := range steps {
		before := view(t, c, "app").TreesVersion
		if err := st.change(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		eventually(t, st.name, func() bool { return st.done(view(t, c, "app")) })
		if view(t, c, "app").TreesVersion == before {
			t.Errorf("%s did not move TreesVersion", st.name)
		}
	}

	// Events of a tenant this cache never served do not load it.
	swap(t, s, "other", "catalogue")
	mustCreate(t, s, "third", "x")
	swap(t, s, "app", "catalogue") // a marker: once seen, the events before it were handled
	eventually(t, "the marker", func() bool { return epochOf(view(t, c, "app"), "catalogue") == 3 })
	for _, tenant := range []string{"other", "third"} {
		if _, ok := c.tenants.Load(tenant); ok {
			t.Errorf("tenant %s was loaded by an event", tenant)
		}
	}
}

func TestCacheRefreshTimer(t *testing.T) {
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	c := newTestCache(t, lossyStore{s}, 20*time.Millisecond)
	runCache(t, c)
	view(t, c, "app")

	swap(t, s, "app", "catalogue")
	mustCreate(t, s, "app", "accounts")
	eventually(t, "the timer to pick up the swap and the new tree", func() bool {
		v := view(t, c, "app")
		return epochOf(v, "catalogue") == 2 && v.Trees["accounts"] != nil
	})
}

func TestCacheNeverGoesBackwards(t *testing.T) {
	ctx := context.Background()
	s, mr := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	swap(t, s, "app", "catalogue")
	swap(t, s, "app", "catalogue")
	c := newTestCache(t, s, time.Hour)
	cached := view(t, c, "app").Maps["catalogue"]
	if cached.Epoch != 3 {
		t.Fatalf("epoch %d, want 3", cached.Epoch)
	}

	// The store now answers with an older map, as a lagging replica would.
	old := NewIdentityMap("app", "catalogue", DefaultSlotCount, 2, []string{"n1"})
	oj, _ := json.Marshal(old)
	mr.HSet(s.mapKey("app", "catalogue"), "epoch", "1", "map", string(oj))

	if _, err := c.Refresh(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	c.handle(ctx, Event{Kind: EventMap, Tenant: "app", Tree: "catalogue", Epoch: 4})
	if _, err := c.Wait(ctx, "app", "catalogue", 3); err != nil {
		t.Fatal(err)
	}
	if got := view(t, c, "app").Maps["catalogue"]; got != cached {
		t.Fatalf("the cached map was replaced by epoch %d", got.Epoch)
	}

	// A dropped and re-created tree starts over at a low epoch; that is not
	// going backwards.
	version := view(t, c, "app").TreesVersion
	if err := s.DeleteTree(ctx, "app", "catalogue"); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, "app", "catalogue")
	v, err := c.Refresh(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if epochOf(v, "catalogue") != 1 || v.TreesVersion == version {
		t.Fatalf("after re-creation: epoch %d, TreesVersion %d (was %d)", epochOf(v, "catalogue"), v.TreesVersion, version)
	}
}

func TestCacheWait(t *testing.T) {
	tests := []struct {
		name    string
		run     bool // with Run the wake-up comes from an event, without from Wait's own polling
		refresh time.Duration
	}{
		{"event", true, time.Hour},
		{"polling", false, 10 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := newTestStore(t)
			mustCreate(t, s, "app", "catalogue")
			var c *Cache
			if tc.run {
				c = runSubscribedCache(t, s, tc.refresh)
			} else {
				c = newTestCache(t, s, tc.refresh)
			}

			if v, err := c.Wait(ctx, "app", "catalogue", 1); err != nil || epochOf(v, "catalogue") != 1 {
				t.Fatalf("Wait for a reached epoch: %v", err)
			}

			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if _, err := c.Wait(short, "app", "catalogue", 9); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait past its deadline: %v", err)
			}

			type result struct {
				v   *View
				err error
			}
			got := make(chan result, 2)
			go func() {
				v, err := c.Wait(ctx, "app", "catalogue", 3)
				got <- result{v, err}
			}()
			go func() { // a tree that does not exist yet
				v, err := c.Wait(ctx, "app", "later", 1)
				got <- result{v, err}
			}()
			time.Sleep(30 * time.Millisecond) // let both block first
			swap(t, s, "app", "catalogue")
			swap(t, s, "app", "catalogue")
			mustCreate(t, s, "app", "later")
			for range 2 {
				select {
				case r := <-got:
					if r.err != nil {
						t.Fatal(r.err)
					}
					if epochOf(r.v, "catalogue") < 3 && epochOf(r.v, "later") < 1 {
						t.Fatalf("Wait returned a view short of its epoch")
					}
				case <-time.After(5 * time.Second):
					t.Fatal("Wait did not return")
				}
			}
		})
	}
}

// countingStore counts full tenant reads; the first one blocks until released.
type countingStore struct {
	Store
	calls   atomic.Int32
	started chan struct{}
	release chan struct{}
}

func (s *countingStore) Trees(ctx context.Context, tenant string) ([]*Tree, error) {
	if s.calls.Add(1) == 1 {
		close(s.started)
		<-s.release
	}
	return s.Store.Trees(ctx, tenant)
}

func TestCacheRefreshCoalesces(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	cs := &countingStore{Store: s, started: make(chan struct{}), release: make(chan struct{})}
	c := newTestCache(t, cs, time.Hour)

	var wg sync.WaitGroup
	wg.Go(func() { c.Refresh(ctx, "app") })
	<-cs.started
	// These callers arrive while a read is under way that may have missed
	// what they want to see: they need one more read, and share it.
	for range 10 {
		wg.Go(func() {
			if _, err := c.Refresh(ctx, "app"); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	close(cs.release)
	wg.Wait()
	if n := cs.calls.Load(); n != 2 {
		t.Errorf("%d reads of the tenant, want 2", n)
	}
}

// TestCacheConcurrentReaders is meant for -race: readers never see a view
// change under them or a map go backwards while writers swap.
func TestCacheConcurrentReaders(t *testing.T) {
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	c := runSubscribedCache(t, s, 5*time.Millisecond)
	view(t, c, "app")

	const swaps = 30
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			var last uint64
			for {
				v, err := c.View(context.Background(), "app")
				if err != nil {
					t.Error(err)
					return
				}
				m := v.Maps["catalogue"]
				if m.Epoch < last {
					t.Errorf("epoch went from %d to %d", last, m.Epoch)
				}
				last = m.Epoch
				if len(m.Slots) != DefaultSlotCount || v.Trees["catalogue"] == nil {
					t.Errorf("incomplete view at epoch %d", m.Epoch)
				}
				if last == swaps+1 {
					return
				}
				select {
				case <-done:
					return
				case <-time.After(100 * time.Microsecond): // spinning readers would starve the writer on a small machine
				}
			}
		})
	}
	for range swaps {
		swap(t, s, "app", "catalogue")
	}
	if _, err := c.Wait(context.Background(), "app", "catalogue", swaps+1); err != nil {
		t.Fatal(err)
	}
	close(done)
	wg.Wait()
}

// TestCacheCarriedMap: a map event's carried map is installed without a
// read of the store only into a view of the tree it was written for, and
// only when it is the event's; otherwise the cache reads the store.
func TestCacheCarriedMap(t *testing.T) {
	tests := []struct {
		name      string
		created   func(tree time.Time) time.Time
		mapEpoch  uint64
		wantEpoch uint64 // the store holds epoch 1
	}{
		{"the same tree", func(c time.Time) time.Time { return c }, 2, 2},
		{"the tree dropped and created again", func(c time.Time) time.Time { return c.Add(-time.Hour) }, 2, 1},
		{"a map not the event's", func(c time.Time) time.Time { return c }, 5, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := newTestStore(t)
			tr, m := mustCreate(t, s, "app", "catalogue")
			c := newTestCache(t, s, time.Hour)
			if got := epochOf(view(t, c, "app"), "catalogue"); got != 1 {
				t.Fatalf("epoch %d, want 1", got)
			}
			carried := *m
			carried.Epoch = tc.mapEpoch
			mj, _ := json.Marshal(&carried)
			c.handle(ctx, Event{Kind: EventMap, Tenant: "app", Tree: "catalogue", Epoch: 2,
				Carried: &CarriedMap{Map: mj, Created: tc.created(tr.Created)}})
			if got := epochOf(view(t, c, "app"), "catalogue"); got != tc.wantEpoch {
				t.Errorf("cached epoch %d, want %d", got, tc.wantEpoch)
			}
		})
	}
}

// stalledStore blocks every full tenant read after the first until
// released, as a store slow to answer a refresh.
type stalledStore struct {
	Store
	calls   atomic.Int32
	stalled chan struct{} // closed when a read blocks
	release chan struct{}
}

func (s *stalledStore) Trees(ctx context.Context, tenant string) ([]*Tree, error) {
	if s.calls.Add(1) == 2 {
		close(s.stalled)
	}
	if s.calls.Load() > 1 {
		<-s.release
	}
	return s.Store.Trees(ctx, tenant)
}

// TestCacheEventDuringRefresh: a map event is installed while a refresh's
// reads are stalled, so a proxy acknowledges a freeze's map without
// waiting for them.
func TestCacheEventDuringRefresh(t *testing.T) {
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	ss := &stalledStore{Store: s, stalled: make(chan struct{}), release: make(chan struct{})}
	defer close(ss.release)
	c := runSubscribedCache(t, ss, 10*time.Millisecond)
	before := epochOf(view(t, c, "app"), "catalogue")
	select {
	case <-ss.stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("no refresh began")
	}
	want := swap(t, s, "app", "catalogue")
	deadline := time.Now().Add(2 * time.Second)
	for epochOf(view(t, c, "app"), "catalogue") != want {
		if time.Now().After(deadline) {
			t.Fatalf("epoch %d, want %d (from %d): the map event waited for the stalled refresh", epochOf(view(t, c, "app"), "catalogue"), want, before)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mapCountingStore counts map reads.
type mapCountingStore struct {
	Store
	maps atomic.Int32
}

func (s *mapCountingStore) Map(ctx context.Context, tenant, tree string) (*Map, error) {
	s.maps.Add(1)
	return s.Store.Map(ctx, tenant, tree)
}

// TestCacheRefreshReadsChangedMaps: a refresh reads only the maps whose
// stored epoch passed the cached one, and installs those.
func TestCacheRefreshReadsChangedMaps(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	for _, name := range []string{"a", "b", "c"} {
		mustCreate(t, s, "app", name)
	}
	ms := &mapCountingStore{Store: s}
	c := newTestCache(t, ms, time.Hour)
	first := view(t, c, "app")
	if n := ms.maps.Load(); n != 3 {
		t.Fatalf("first load read %d maps, want 3", n)
	}

	ms.maps.Store(0)
	v, err := c.Refresh(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if n := ms.maps.Load(); n != 0 {
		t.Errorf("a refresh with no map changed read %d maps, want 0", n)
	}
	for _, name := range []string{"a", "b", "c"} {
		if v.Maps[name] != first.Maps[name] {
			t.Errorf("map %s replaced though unchanged", name)
		}
	}

	swap(t, s, "app", "b")
	ms.maps.Store(0)
	if v, err = c.Refresh(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if n := ms.maps.Load(); n != 1 {
		t.Errorf("a refresh after one map changed read %d maps, want 1", n)
	}
	if epochOf(v, "b") != 2 || v.Maps["a"] != first.Maps["a"] || v.Maps["c"] != first.Maps["c"] {
		t.Errorf("after b's swap: epochs a %d b %d c %d, want 1 2 1 with a and c kept", epochOf(v, "a"), epochOf(v, "b"), epochOf(v, "c"))
	}
}
