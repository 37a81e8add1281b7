package shardmap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Registration defaults: a proxy heartbeats every second and counts as
// live for five, so a freeze waits at most that long for a proxy that died.
const (
	DefaultLeaseTTL  = 5 * time.Second
	DefaultHeartbeat = time.Second
	// leaseMargin is taken off the proxy's own idea of its lease, so it
	// stops serving before the store counts it as gone, even with the
	// store's clock a little ahead.
	leaseMargin = 500 * time.Millisecond
)

// ErrLeaseExpired is returned by Acquire while the proxy's registration has
// lapsed and it cannot serve from its cached maps either: it serves again
// once it has re-registered and re-read every map.
var ErrLeaseExpired = errors.New("shardmap: this proxy's registration lapsed; it serves again once it has re-read the shard maps")

// Presence tells whether the proxy has been seen on the nodes without a
// break since a given time (pgshard.Presence). A coordinator that finds a
// proxy on the nodes but not live in the store counts it as lagging, so
// such a proxy may serve from its cached maps through a lapse.
type Presence interface {
	HeldSince(t time.Time) bool
}

// Registration keeps a proxy registered as live, and as serving each tenant
// it has routed a statement for, and acknowledges each tree's epoch once no
// statement planned on an older map is still running: the migrator's freeze
// and release wait on the acknowledgements of the proxies that serve the
// tree's tenant. A proxy that never routed for a tenant is not waited for:
// it has no map of the tenant that could be stale.
type Registration struct {
	id        string
	coord     Coordination
	cache     *Cache
	ttl       time.Duration
	heartbeat time.Duration
	log       *slog.Logger

	liveUntil atomic.Int64 // unix nanoseconds; 0 until the first heartbeat
	presence  Presence     // nil: no serving through a lapse
	cached    atomic.Bool  // serving from the cached maps through a lapse

	mu    sync.Mutex
	inUse map[*View]int // views statements are running on, every map of them
	// slotsInUse are the statements narrowed to one slot of one tree
	// (Narrow): they hold up an epoch only where that slot's routing
	// changed, so a freeze does not wait for point statements elsewhere.
	slotsInUse map[slotUse]int
	acked      map[treeID]uint64 // last epoch acknowledged per tree
	// served holds the tenants registered as served: false while the
	// first registration and map read are under way, true once done.
	served map[string]bool
	poke   chan struct{}
}

type treeID struct{ tenant, tree string }

// slotUse is a statement's use of one slot of a view's map of tree.
type slotUse struct {
	v    *View
	tree string
	slot int
}

// NewRegistration returns a registration of proxy id over cache. Zero
// durations take the defaults; log may be nil.
func NewRegistration(id string, coord Coordination, cache *Cache, ttl, heartbeat time.Duration, log *slog.Logger) *Registration {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if heartbeat <= 0 {
		heartbeat = DefaultHeartbeat
	}
	if log == nil {
		log = slog.Default()
	}
	r := &Registration{id: id, coord: coord, cache: cache, ttl: ttl, heartbeat: heartbeat, log: log,
		inUse: map[*View]int{}, slotsInUse: map[slotUse]int{}, acked: map[treeID]uint64{}, served: map[string]bool{}, poke: make(chan struct{}, 1)}
	cache.onChange = r.wake
	return r
}

// ServeThroughLapses lets the proxy serve from its cached maps while its
// registration has lapsed, for as long as p has held it on the nodes since
// before the lapse. Call it before Run.
func (r *Registration) ServeThroughLapses(p Presence) { r.presence = p }

// ID is the proxy's name in the registry.
func (r *Registration) ID() string { return r.id }

func (r *Registration) wake() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Live reports whether the proxy's lease holds.
func (r *Registration) Live() bool { return time.Now().UnixNano() < r.liveUntil.Load() }

// Cached reports whether the proxy's lease has lapsed and it serves from
// its cached maps.
func (r *Registration) Cached() bool { return !r.Live() && r.servesCached() }

// servesCached reports whether the presence on the nodes has held since
// before the store could count the registration as expired: then every
// coordinator counts this proxy as lagging behind any newer epoch, and no
// map it has cached can be overtaken.
func (r *Registration) servesCached() bool {
	ok := r.presence != nil && r.presence.HeldSince(time.Unix(0, r.liveUntil.Load()))
	if r.cached.Swap(ok) != ok {
		if ok {
			r.log.Warn("shardmap: registration lapsed; serving from the cached maps, which no reshard can overtake while this proxy holds its sessions on the nodes", "proxy", r.id)
		} else {
			r.log.Warn("shardmap: registration lapsed and the sessions on the nodes are not all held; refusing statements until the maps are read again", "proxy", r.id)
		}
	}
	return ok
}

// Acquire returns the tenant's current view for one statement, and the
// function to call when the statement is done with it.
func (r *Registration) Acquire(ctx context.Context, tenant string) (*View, func(), error) {
	v, err := r.Hold(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return v, func() { once.Do(func() { r.Release(v) }) }, nil
}

// Hold is Acquire for a caller that keeps count itself: it gives the view
// back with exactly one Release. It allocates nothing, for the statement
// path of the proxy.
func (r *Registration) Hold(ctx context.Context, tenant string) (*View, error) {
	if !r.Live() {
		return r.acquireCached(tenant)
	}
	if err := r.serve(ctx, tenant); err != nil {
		return nil, err
	}
	if _, err := r.cache.View(ctx, tenant); err != nil {
		return nil, err
	}
	return r.take(r.cache.tenant(tenant))
}

// acquireCached is Hold through a lapse: the cached view of a tenant
// already served, without touching the store.
func (r *Registration) acquireCached(tenant string) (*View, error) {
	r.mu.Lock()
	served := r.served[tenant]
	r.mu.Unlock()
	if !served || !r.servesCached() {
		return nil, ErrLeaseExpired
	}
	return r.take(r.cache.tenant(tenant))
}

// take counts the tenant's current view as in use by a statement.
func (r *Registration) take(tc *tenantCache) (*View, error) {
	r.mu.Lock()
	// Loaded under the lock that acknowledging takes, so no epoch is
	// acknowledged between this load and the count below.
	v := tc.view.Load()
	if v == nil {
		r.mu.Unlock()
		return nil, ErrLeaseExpired
	}
	r.inUse[v]++
	r.mu.Unlock()
	return v, nil
}

// serve registers the proxy as serving tenant before its first statement
// for it, then reads the tenant's maps afresh. A freeze stores its map
// before it reads the registry: if it read the registry before this
// registration, the read that follows sees its map; if after, it waits for
// this proxy's acknowledgement. Either way no statement routes by a map
// older than a freeze without the freeze knowing.
func (r *Registration) serve(ctx context.Context, tenant string) error {
	r.mu.Lock()
	done, known := r.served[tenant]
	if !known {
		r.served[tenant] = false // renewed by the heartbeat from now on
	}
	r.mu.Unlock()
	if done {
		return nil
	}
	if err := r.coord.ServeTenants(ctx, r.id, time.Now().Add(r.ttl), tenant); err != nil {
		return err
	}
	if _, err := r.cache.Refresh(ctx, tenant); err != nil {
		return err
	}
	r.mu.Lock()
	r.served[tenant] = true
	r.mu.Unlock()
	return nil
}

// tenants lists the tenants registered as served, done or under way.
func (r *Registration) tenants() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.served))
}

// Release ends one Hold of v.
func (r *Registration) Release(v *View) {
	r.mu.Lock()
	last := drop(r.inUse, v)
	r.mu.Unlock()
	if last {
		r.wakeForOld(v)
	}
}

// Narrow turns one Hold of v into a hold of one slot of tree's map in v:
// the caller knows its statement routes by that slot alone. From then on
// the statement holds up the acknowledgement of a newer epoch only if the
// slot routes differently under it (slotMoved). Give it back with
// ReleaseSlot, not Release.
func (r *Registration) Narrow(v *View, tree string, slot int) {
	r.mu.Lock()
	drop(r.inUse, v)
	r.slotsInUse[slotUse{v, tree, slot}]++
	r.mu.Unlock()
	// The whole hold may have been what an acknowledgement waited for.
	r.wakeForOld(v)
}

// ReleaseSlot ends one narrowed hold of slot of tree's map in v.
func (r *Registration) ReleaseSlot(v *View, tree string, slot int) {
	r.mu.Lock()
	last := drop(r.slotsInUse, slotUse{v, tree, slot})
	r.mu.Unlock()
	if last {
		r.wakeForOld(v)
	}
}

// drop takes one count of k off counts, and reports whether it was the last.
func drop[K comparable](counts map[K]int, k K) bool {
	counts[k]--
	if counts[k] > 0 {
		return false
	}
	delete(counts, k)
	return true
}

// wakeForOld wakes the acknowledger once a hold of v ended, if v is no
// longer the tenant's current view: only the end of a statement on an
// older view can let an epoch be acknowledged; the current view's maps are
// the newest. Waking the acknowledger for it would cost a goroutine
// hand-off per statement. A view replaced after this check wakes the
// acknowledger itself (Cache.changed), which then sees the count.
func (r *Registration) wakeForOld(v *View) {
	if r.cache.tenant(v.Tenant).view.Load() != v {
		r.wake()
	}
}

// Run heartbeats and acknowledges until ctx ends, then unregisters.
func (r *Registration) Run(ctx context.Context) {
	hb := time.NewTicker(r.heartbeat)
	defer hb.Stop()
	r.beat(ctx)
	for {
		select {
		case <-ctx.Done():
			uctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = r.coord.UnregisterProxy(uctx, r.id, r.tenants()...)
			cancel()
			return
		case <-hb.C:
			r.beat(ctx)
		case <-r.poke:
		}
		r.acknowledge(ctx)
	}
}

// beat renews the registration for every tenant served, then the
// registration as live, to the same time (Coordination.ServeTenants): the
// proxy serves on only if both were renewed. After a lapse it then re-reads
// every tenant's maps: a map may have flipped while this proxy was not
// counted.
func (r *Registration) beat(ctx context.Context) {
	start := time.Now()
	until := start.Add(r.ttl)
	lapsed := !r.Live()
	err := r.coord.ServeTenants(ctx, r.id, until, r.tenants()...)
	if err == nil {
		err = r.coord.RegisterProxy(ctx, r.id, until)
	}
	// A renewal that began before the lapse can succeed after it (Redis
	// answered late): the maps are re-read all the same.
	lapsed = lapsed || !r.Live()
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("shardmap: proxy heartbeat failed", "proxy", r.id, "err", err)
		}
		if !r.Live() {
			r.servesCached() // logs the change to or from serving from the cache
		}
		return
	}
	if lapsed {
		if err := r.cache.refreshAll(ctx); err != nil {
			r.log.Warn("shardmap: re-reading maps after a lapsed registration failed", "err", err)
			return
		}
		r.mu.Lock()
		clear(r.acked) // the store may have lost them with the registration
		r.mu.Unlock()
	}
	r.liveUntil.Store(until.Add(-leaseMargin).UnixNano())
	r.cached.Store(false)
}

// acknowledge sends, for every tree whose cached epoch moved, the epoch
// once no statement runs on a view with an older map of that tree. A
// colocation group's members share one map and one set of acks under the
// group's name; each member is also acknowledged under its own name as
// soon as this proxy routes by it, which is what the creation of a tree
// waits for (a tree alone is acknowledged so under its map's name). A
// reference table's entry is acknowledged the same way, under
// ReferenceAckName, once no statement planned on an older entry runs.
func (r *Registration) acknowledge(ctx context.Context) {
	type ack struct {
		id    treeID
		epoch uint64
	}
	var acks []ack
	queued := map[treeID]bool{}
	seen := map[treeID]bool{}
	consider := func(id treeID, epoch uint64, olderInUse func() bool) {
		seen[id] = true
		if r.acked[id] > epoch {
			// The map was dropped and made again (its epochs start
			// over) and the drop took its acknowledgements along.
			delete(r.acked, id)
		}
		if queued[id] || r.acked[id] >= epoch || olderInUse() {
			return
		}
		queued[id] = true
		acks = append(acks, ack{id, epoch})
	}
	r.mu.Lock()
	r.cache.tenants.Range(func(k, val any) bool {
		v := val.(*tenantCache).view.Load()
		if v == nil {
			return true
		}
		for name, m := range v.Maps {
			group := v.Trees[name].MapName()
			consider(treeID{v.Tenant, group}, m.Epoch, func() bool { return r.olderInUse(group, m) })
			if group != name {
				// No statement holds a map by a member's name, so
				// nothing running holds this one up.
				consider(treeID{v.Tenant, name}, m.Epoch, func() bool { return false })
			}
		}
		for name, ref := range v.References {
			consider(treeID{v.Tenant, ReferenceAckName(name)}, ref.Epoch, func() bool { return r.olderReferenceInUse(name, ref.Epoch) })
		}
		return true
	})
	// A dropped map's acknowledgements went with it; one made again under
	// its name starts from epoch 1 and must be acknowledged from there.
	for id := range r.acked {
		if !seen[id] {
			delete(r.acked, id)
		}
	}
	r.mu.Unlock()
	for _, a := range acks {
		if err := r.coord.AckEpoch(ctx, a.id.tenant, a.id.tree, r.id, a.epoch); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("shardmap: acknowledging an epoch failed", "tree", a.id.tree, "epoch", a.epoch, "err", err)
			}
			continue
		}
		r.mu.Lock()
		r.acked[a.id] = max(r.acked[a.id], a.epoch)
		r.mu.Unlock()
	}
}

// olderInUse reports whether a running statement was planned on a map
// stored under name (a tree's, or its colocation group's) older than cur
// and may route differently under cur: any such statement holding the
// whole view, and one narrowed to a slot whose routing cur changed.
// Called with mu held.
func (r *Registration) olderInUse(name string, cur *Map) bool {
	for v := range r.inUse {
		if m := v.Maps[v.memberOf(name)]; m != nil && m.Epoch < cur.Epoch {
			return true
		}
	}
	for u := range r.slotsInUse {
		t, m := u.v.Trees[u.tree], u.v.Maps[u.tree]
		if t != nil && m != nil && t.MapName() == name && m.Epoch < cur.Epoch && slotMoved(m, cur, u.slot) {
			return true
		}
	}
	return false
}

// olderReferenceInUse reports whether a running statement was planned on
// an entry of reference table name older than epoch: a write planned so
// carries the copies of that entry. Called with mu held.
func (r *Registration) olderReferenceInUse(name string, epoch uint64) bool {
	for v := range r.inUse {
		if ref := v.References[name]; ref != nil && ref.Epoch < epoch {
			return true
		}
	}
	return false
}

// slotMoved reports whether a statement on slot routes differently under
// cur than under old: another owner, or the owner's node, state or
// mixedness changed, or the slot froze or thawed. A slot marked about to
// freeze counts too: the mark routes nothing differently, but its
// acknowledgement is how the migrator learns that no statement planned
// before it still runs there.
func slotMoved(old, cur *Map, slot int) bool {
	if len(old.Slots) != len(cur.Slots) || slot < 0 || slot >= len(cur.Slots) {
		return true
	}
	return old.Slots[slot] != cur.Slots[slot] || old.Owner(slot) != cur.Owner(slot) || old.IsFrozen(slot) != cur.IsFrozen(slot) ||
		old.IsFreezing(slot) != cur.IsFreezing(slot)
}

// refreshAll re-reads every tenant the cache has loaded.
func (c *Cache) refreshAll(ctx context.Context) error {
	var err error
	c.tenants.Range(func(k, v any) bool {
		tc := v.(*tenantCache)
		if tc.view.Load() == nil {
			return true
		}
		if _, e := c.load(ctx, k.(string), tc); e != nil {
			err = fmt.Errorf("tenant %s: %w", k, e)
			return false
		}
		return true
	})
	return err
}
