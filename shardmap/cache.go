package shardmap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRefresh is how often a Cache re-reads every loaded tenant in case
// an event was lost.
const DefaultRefresh = time.Second

// View is an immutable snapshot of one tenant's trees and maps. Readers must
// not modify it or anything it points to.
type View struct {
	Tenant string
	// TreesVersion changes only when the set or the definitions of the
	// tenant's trees change, not when a map does: a key for cached routing
	// plans. Versions are unique across the tenants of one Cache.
	TreesVersion uint64
	Trees        map[string]*Tree // by name; every tree here has a map in Maps
	Maps         map[string]*Map  // by tree name
	// References are the tenant's reference tables by name (reference.go).
	References map[string]*Reference
	// Missing is set when the nodes hold trees of the tenant that the
	// store has lost (ErrMapsMissing): the view has none, and must not be
	// served.
	Missing bool

	next chan struct{} // closed when a newer view of the tenant replaces this one
}

// Cache keeps a View per tenant in memory so that the query path never
// touches the store. It follows the store's events (Run), re-reads on a
// timer in case an event was lost, and never replaces a map with one of a
// lower epoch (unless the tree was dropped and created again).
type Cache struct {
	store    Store
	refresh  time.Duration
	log      *slog.Logger
	tenants  sync.Map      // tenant name -> *tenantCache
	versions atomic.Uint64 // source of TreesVersion
	// onChange, set by NewRegistration before the cache is used, is told
	// (without blocking) whenever a new view is installed.
	onChange func()
	nodes    NodeTrees // set by CheckNodes; nil checks nothing
	// countLoad, set by CountLoad before the cache is used, gives every
	// cached tree its load counters.
	countLoad bool
}

func (c *Cache) changed() {
	if c.onChange != nil {
		c.onChange()
	}
}

type tenantCache struct {
	view atomic.Pointer[View] // nil until the first successful load
	mu   sync.Mutex           // serializes view replacement
	// loadMu serializes full loads. It is not mu: a load's store reads
	// take round trips, and a map an event carries is installed under mu
	// meanwhile, so a freeze's acknowledgement does not wait for them.
	loadMu sync.Mutex
	begun  atomic.Uint64 // full loads begun; written under loadMu
	// lastOK is the number (begun at its start) of the last full load that
	// succeeded; guarded by loadMu.
	lastOK uint64
}

// NewCache returns a cache over s. refresh <= 0 means DefaultRefresh; a nil
// log means slog.Default().
func NewCache(s Store, refresh time.Duration, log *slog.Logger) *Cache {
	if refresh <= 0 {
		refresh = DefaultRefresh
	}
	if log == nil {
		log = slog.Default()
	}
	return &Cache{store: s, refresh: refresh, log: log}
}

// Run follows the store's events and re-reads every loaded tenant each
// refresh interval until ctx ends, then returns nil. It fails only if it
// cannot subscribe at all; after that the subscription reconnects by itself.
//
// A tick's re-read runs beside the events, one at a time: its reads take
// round trips, and a map event (a freeze's, which every proxy must
// acknowledge inside the write pause) must not wait for them.
func (c *Cache) Run(ctx context.Context) error {
	var ticking sync.WaitGroup
	var busy atomic.Bool
	defer ticking.Wait()
	return follow(ctx, c.store, c.refresh, "cache", func(ev Event) { c.handle(ctx, ev) }, func() {
		if !busy.CompareAndSwap(false, true) {
			return // the last tick's re-read still runs
		}
		ticking.Add(1)
		go func() {
			defer ticking.Done()
			defer busy.Store(false)
			c.refreshLoaded(ctx)
		}()
	})
}

// refreshLoaded re-reads every tenant the cache has loaded.
func (c *Cache) refreshLoaded(ctx context.Context) {
	c.tenants.Range(func(k, v any) bool {
		tc := v.(*tenantCache)
		if tc.view.Load() == nil {
			return true // never loaded: the next View call loads it
		}
		if _, err := c.load(ctx, k.(string), tc); err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "shardmap: cache refresh failed", "tenant", k, "err", err)
		}
		return ctx.Err() == nil
	})
}

func (c *Cache) handle(ctx context.Context, ev Event) {
	v, ok := c.tenants.Load(ev.Tenant)
	if !ok {
		return // a tenant this proxy has not served
	}
	tc := v.(*tenantCache)
	cur := tc.view.Load()
	if cur == nil {
		return
	}
	var err error
	switch ev.Kind {
	case EventMap: // ev.Tree is the map's name: a colocation group's for its members
		if m := cur.Maps[cur.memberOf(ev.Tree)]; m != nil && m.Epoch >= ev.Epoch {
			return
		}
		if c.installCarried(ctx, tc, ev) {
			return
		}
		err = c.loadMap(ctx, ev.Tenant, tc, ev.Tree)
	case EventIntent: // for coordinators; no view changes
		return
	default: // tree events, and kinds newer than this code: re-read it all
		_, err = c.load(ctx, ev.Tenant, tc)
	}
	if err != nil && ctx.Err() == nil {
		c.log.WarnContext(ctx, "shardmap: cache update after event failed",
			"kind", ev.Kind, "tenant", ev.Tenant, "tree", ev.Tree, "epoch", ev.Epoch, "err", err)
	}
}

// View returns the tenant's current snapshot. The first call for a tenant
// reads the store; later calls are an atomic load.
func (c *Cache) View(ctx context.Context, tenant string) (*View, error) {
	tc := c.tenant(tenant)
	if v := tc.view.Load(); v != nil {
		return v, nil
	}
	return c.load(ctx, tenant, tc)
}

// Current returns the tenant's snapshot as cached, nil before its first
// read; it never reads the store.
func (c *Cache) Current(tenant string) *View { return c.tenant(tenant).view.Load() }

// Refresh re-reads the tenant from the store, for a caller that has seen
// proof of a stale view (a stale-routing error). Concurrent calls share
// one read, as long as it began after they were made.
func (c *Cache) Refresh(ctx context.Context, tenant string) (*View, error) {
	return c.load(ctx, tenant, c.tenant(tenant))
}

// Wait blocks until the cached map of tree has reached minEpoch and returns
// the view that has it. It reads the map from the store at once and then
// every refresh interval, so it does not depend on Run or on events.
func (c *Cache) Wait(ctx context.Context, tenant, tree string, minEpoch uint64) (*View, error) {
	tc := c.tenant(tenant)
	if _, err := c.View(ctx, tenant); err != nil {
		return nil, err
	}
	poll := time.NewTicker(c.refresh)
	defer poll.Stop()
	fetch := true
	for {
		v := tc.view.Load()
		if m := v.Maps[tree]; m != nil && m.Epoch >= minEpoch {
			return v, nil
		}
		if fetch {
			fetch = false
			name := tree
			if t := v.Trees[tree]; t != nil {
				name = t.MapName()
			}
			if err := c.loadMap(ctx, tenant, tc, name); err != nil && ctx.Err() == nil {
				c.log.WarnContext(ctx, "shardmap: cache read while waiting failed",
					"tenant", tenant, "tree", tree, "epoch", minEpoch, "err", err)
			}
			continue
		}
		select {
		case <-v.next:
		case <-poll.C:
			fetch = true
		case <-ctx.Done():
			return nil, fmt.Errorf("shardmap: wait for %s/%s epoch %d: %w", tenant, tree, minEpoch, ctx.Err())
		}
	}
}

// WaitReference waits until the cached entry of tenant's reference table
// name has reached minEpoch or is gone, and returns the view that has it.
// The registry's event wakes it; it also reads the store itself at every
// refresh interval.
func (c *Cache) WaitReference(ctx context.Context, tenant, name string, minEpoch uint64) (*View, error) {
	tc := c.tenant(tenant)
	v, err := c.View(ctx, tenant)
	if err != nil {
		return nil, err
	}
	poll := time.NewTicker(c.refresh)
	defer poll.Stop()
	for {
		if r := v.References[name]; r == nil || r.Epoch >= minEpoch {
			return v, nil
		}
		select {
		case <-v.next:
		case <-poll.C:
			if _, err := c.load(ctx, tenant, tc); err != nil && ctx.Err() == nil {
				c.log.WarnContext(ctx, "shardmap: cache read while waiting failed", "tenant", tenant, "reference", name, "err", err)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("shardmap: wait for reference table %s/%s epoch %d: %w", tenant, name, minEpoch, ctx.Err())
		}
		v = tc.view.Load()
	}
}

func (c *Cache) tenant(name string) *tenantCache {
	if v, ok := c.tenants.Load(name); ok {
		return v.(*tenantCache)
	}
	v, _ := c.tenants.LoadOrStore(name, new(tenantCache))
	return v.(*tenantCache)
}

// load re-reads all of a tenant. A caller that waited for the lock while a
// load that began after its call succeeded takes that result: a burst of
// Refresh calls after one stale-routing error costs one read.
func (c *Cache) load(ctx context.Context, tenant string, tc *tenantCache) (*View, error) {
	seen := tc.begun.Load()
	tc.loadMu.Lock()
	defer tc.loadMu.Unlock()
	if tc.lastOK > seen {
		return tc.view.Load(), nil
	}
	seq := tc.begun.Add(1)

	trees, ms, lost, err := c.readTrees(ctx, tenant, tc.view.Load())
	if err != nil {
		return nil, err
	}

	refs, err := c.loadReferences(ctx, tenant)
	if err != nil {
		return nil, err
	}

	tc.mu.Lock()
	old := tc.view.Load()
	c.attachCounters(old, trees, ms)
	v := &View{Tenant: tenant, Trees: trees, Maps: ms, References: refs, Missing: lost, next: make(chan struct{})}
	if lost && (old == nil || !old.Missing) {
		c.log.ErrorContext(ctx, "shardmap: the store lists no tree of the tenant, but the catalog node holds tree templates: its maps were lost; refusing its statements until `lattice recover-map` rebuilds them", "tenant", tenant)
	}
	if old != nil && old.Missing == lost && sameTrees(old.Trees, trees) && sameReferences(old.References, refs) {
		v.TreesVersion = old.TreesVersion
	} else {
		v.TreesVersion = c.versions.Add(1)
	}
	if old != nil {
		for name, m := range ms {
			om := old.Maps[name]
			if om != nil && om.Epoch >= m.Epoch && old.Trees[name].Created.Equal(trees[name].Created) &&
				old.Trees[name].MapName() == trees[name].MapName() {
				ms[name] = om // the store answered with an older map (a replica, a race): keep ours
			}
		}
	}
	tc.replace(old, v)
	tc.mu.Unlock()
	tc.lastOK = seq
	c.changed()
	return v, nil
}

// readTrees reads a tenant's trees and their maps. A tree listed whose map
// is then not found was dropped since the list was read, or the store lost
// everything in between (a FLUSHALL, a failover to an empty replica): the
// list is read again, so that a loss is seen as one (an empty list while
// the nodes hold templates) instead of as a drop, which would send the
// tree's statements to its empty template on the catalog node. A tree still
// listed without a map on the second read is left out, as a drop leaves it.
//
// A map that old, the view being replaced, holds at an epoch no lower than
// the stored one is kept without being read: load would keep it over what
// the read returned anyway, and the maps' epochs, read in one round trip,
// are a few bytes where a map is tens of kilobytes of JSON. So a refresh
// of a tenant whose maps did not change reads no map.
func (c *Cache) readTrees(ctx context.Context, tenant string, old *View) (map[string]*Tree, map[string]*Map, bool, error) {
	for attempt := 0; ; attempt++ {
		list, err := c.store.Trees(ctx, tenant)
		if err != nil {
			return nil, nil, false, err
		}
		list, lost, err := c.missing(ctx, tenant, list)
		if err != nil {
			return nil, nil, false, err
		}
		epochs, err := c.storedEpochs(ctx, tenant, old, list)
		if err != nil {
			return nil, nil, false, err
		}
		trees := make(map[string]*Tree, len(list))
		ms := make(map[string]*Map, len(list))
		shared := make(map[string]*Map) // by map name: one read per colocation group
		unmapped := false
		for _, t := range list {
			if om := keptMap(old, t, epochs); om != nil {
				trees[t.Name], ms[t.Name] = t, om
				continue
			}
			m, ok := shared[t.MapName()]
			if !ok {
				m, err = c.store.Map(ctx, tenant, t.MapName())
				if errors.Is(err, ErrNotFound) {
					unmapped = true
					continue
				}
				if err != nil {
					return nil, nil, false, err
				}
				shared[t.MapName()] = m
			}
			trees[t.Name], ms[t.Name] = t, memberMap(m, t.Name)
		}
		if !unmapped || attempt > 0 {
			return trees, ms, lost, nil
		}
	}
}

// storedEpochs reads the stored epochs of the maps of list that old holds
// too; nil when old holds none.
func (c *Cache) storedEpochs(ctx context.Context, tenant string, old *View, list []*Tree) (map[string]uint64, error) {
	if old == nil {
		return nil, nil
	}
	var names []string
	seen := map[string]bool{}
	for _, t := range list {
		if old.Maps[t.Name] != nil && !seen[t.MapName()] {
			seen[t.MapName()] = true
			names = append(names, t.MapName())
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	return c.store.MapEpochs(ctx, tenant, names)
}

// keptMap is old's map of t if load would keep it over the stored one: the
// same tree (not one dropped and created again, whose epochs start over),
// under the same map name, at an epoch no lower than the stored one. nil
// means the map must be read.
func keptMap(old *View, t *Tree, epochs map[string]uint64) *Map {
	if old == nil {
		return nil
	}
	ot, om := old.Trees[t.Name], old.Maps[t.Name]
	stored, ok := epochs[t.MapName()]
	if ot == nil || om == nil || !ok || !ot.Created.Equal(t.Created) || ot.MapName() != t.MapName() || om.Epoch < stored {
		return nil
	}
	return om
}

// loadMap re-reads the map stored under name (a tree's, or a colocation
// group's) and installs it for every tree that shares it, if its epoch is
// higher: a view never holds two members of a group at different epochs.
func (c *Cache) loadMap(ctx context.Context, tenant string, tc *tenantCache, name string) error {
	m, err := c.store.Map(ctx, tenant, name)
	if errors.Is(err, ErrNotFound) {
		_, err = c.load(ctx, tenant, tc) // dropped: the tree list changed too
		return err
	}
	if err != nil {
		return err
	}
	tc.mu.Lock()
	old := tc.view.Load()
	var tree string
	if old != nil {
		tree = old.memberOf(name)
	}
	if tree == "" {
		tc.mu.Unlock()
		_, err = c.load(ctx, tenant, tc) // a tree this view does not know yet
		return err
	}
	defer tc.mu.Unlock()
	if old.Maps[tree].Epoch >= m.Epoch {
		return nil
	}
	c.installMap(tc, old, tree, m)
	return nil
}

// installMap replaces old, the tenant's current view, by one with m as its
// tree's map. Called with mu held.
func (c *Cache) installMap(tc *tenantCache, old *View, tree string, m *Map) {
	v := *old
	v.Maps = maps.Clone(old.Maps)
	for _, member := range old.Members(tree) {
		v.Maps[member] = memberMap(m, member)
	}
	v.next = make(chan struct{})
	tc.replace(old, &v)
	c.changed()
}

// replace publishes v and wakes the waiters on old. Called with mu held.
func (tc *tenantCache) replace(old, v *View) {
	tc.view.Store(v)
	if old != nil {
		close(old.next)
	}
}

// sameTrees compares definitions by their JSON, which covers every field
// and compares times by value rather than by location pointer.
func sameTrees(a, b map[string]*Tree) bool {
	if len(a) != len(b) {
		return false
	}
	for name, t := range a {
		u, ok := b[name]
		if !ok {
			return false
		}
		tj, _ := json.Marshal(t) // a Tree always encodes
		uj, _ := json.Marshal(u)
		if !bytes.Equal(tj, uj) {
			return false
		}
	}
	return true
}

// memberMap is m as tree's entry of a view: a colocation group's map
// carries the group's name, which may be no tree's, while a view's entry
// names its tree. The slices are shared; a view's maps are never changed.
func memberMap(m *Map, tree string) *Map {
	if m.Tree == tree {
		return m
	}
	c := *m
	c.Tree = tree
	return &c
}

// memberOf is a tree of the view whose map is stored under name, "" if none.
func (v *View) memberOf(name string) string {
	if t := v.Trees[name]; t != nil && t.MapName() == name {
		return name
	}
	for tn, t := range v.Trees {
		if t.MapName() == name {
			return tn
		}
	}
	return ""
}
