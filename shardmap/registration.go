package shardmap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// lapsed: it serves again once it has re-registered and re-read every map.
var ErrLeaseExpired = errors.New("shardmap: this proxy's registration lapsed; it serves again once it has re-read the shard maps")

// Registration keeps a proxy registered as live and acknowledges each
// tree's epoch once no statement planned on an older map is still running:
// the migrator's freeze and release wait on those acknowledgements.
type Registration struct {
	id        string
	coord     Coordination
	cache     *Cache
	ttl       time.Duration
	heartbeat time.Duration
	log       *slog.Logger

	liveUntil atomic.Int64 // unix nanoseconds; 0 until the first heartbeat

	mu    sync.Mutex
	inUse map[*View]int     // views statements are running on
	acked map[treeID]uint64 // last epoch acknowledged per tree
	poke  chan struct{}
}

type treeID struct{ tenant, tree string }

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
		inUse: map[*View]int{}, acked: map[treeID]uint64{}, poke: make(chan struct{}, 1)}
	cache.onChange = r.wake
	return r
}

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

// Acquire returns the tenant's current view for one statement, and the
// function to call when the statement is done with it.
func (r *Registration) Acquire(ctx context.Context, tenant string) (*View, func(), error) {
	if !r.Live() {
		return nil, nil, ErrLeaseExpired
	}
	if _, err := r.cache.View(ctx, tenant); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	// Loaded under the lock that acknowledging takes, so no epoch is
	// acknowledged between this load and the count below.
	v := r.cache.tenant(tenant).view.Load()
	r.inUse[v]++
	r.mu.Unlock()
	var once sync.Once
	return v, func() { once.Do(func() { r.release(v) }) }, nil
}

func (r *Registration) release(v *View) {
	r.mu.Lock()
	r.inUse[v]--
	last := r.inUse[v] == 0
	if last {
		delete(r.inUse, v)
	}
	r.mu.Unlock()
	if last {
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
			_ = r.coord.UnregisterProxy(uctx, r.id)
			cancel()
			return
		case <-hb.C:
			r.beat(ctx)
			r.loadResharding(ctx)
		case <-r.poke:
		}
		r.acknowledge(ctx)
	}
}

// beat renews the registration. After a lapse it first re-reads every
// tenant's maps: a map may have flipped while this proxy was not counted.
func (r *Registration) beat(ctx context.Context) {
	start := time.Now()
	lapsed := !r.Live()
	if err := r.coord.RegisterProxy(ctx, r.id, r.ttl); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("shardmap: proxy heartbeat failed", "proxy", r.id, "err", err)
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
	r.liveUntil.Store(start.Add(r.ttl - leaseMargin).UnixNano())
}

// loadResharding loads into the cache the tenants of running reshards that
// this proxy has not served yet, so that it acknowledges their epochs too:
// every freeze waits for every live proxy, idle ones included.
func (r *Registration) loadResharding(ctx context.Context) {
	rs, err := r.coord.Reshards(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("shardmap: listing running reshards failed", "err", err)
		}
		return
	}
	for _, x := range rs {
		if _, err := r.cache.View(ctx, x.Tenant); err != nil && ctx.Err() == nil {
			r.log.Warn("shardmap: loading a resharding tenant failed", "tenant", x.Tenant, "err", err)
		}
	}
}

// acknowledge sends, for every tree whose cached epoch moved, the epoch
// once no statement runs on a view with an older map of that tree.
func (r *Registration) acknowledge(ctx context.Context) {
	type ack struct {
		id    treeID
		epoch uint64
	}
	var acks []ack
	r.mu.Lock()
	r.cache.tenants.Range(func(k, val any) bool {
		v := val.(*tenantCache).view.Load()
		if v == nil {
			return true
		}
		for name, m := range v.Maps {
			id := treeID{v.Tenant, name}
			if r.acked[id] >= m.Epoch || r.olderInUse(name, m.Epoch) {
				continue
			}
			acks = append(acks, ack{id, m.Epoch})
		}
		return true
	})
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

// olderInUse reports whether a running statement planned on a map of tree
// older than epoch. Called with mu held.
func (r *Registration) olderInUse(tree string, epoch uint64) bool {
	for v := range r.inUse {
		if m := v.Maps[tree]; m != nil && m.Epoch < epoch {
			return true
		}
	}
	return false
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
