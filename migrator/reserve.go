package migrator

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// reservations caches, per map, the lowest epoch ceiling and high-water
// mark the catalog node records (pgshard.TreesTable) for the map's trees,
// so that a map write costs a catalog write only once per
// pgshard.EpochBlock epochs and once per new shard index.
type reservations struct {
	mu   sync.Mutex
	maps map[[2]string]reserved
}

type reserved struct {
	ceiling   uint64
	highWater int
	// created is the creation time of the lone tree the map belongs to
	// (zero for a colocation group's map): the record's incarnation.
	created time.Time
}

// reserve makes sure the catalog node's records allow next to be written
// with epoch: a map the store never held above the recorded ceiling is
// what lets `lattice recover-map` give a rebuilt map a higher epoch than
// any a proxy has seen. A colocation group's map is reserved in the record
// of every member, so that the group keeps its ceiling whichever members
// are dropped later. Every map write of the migrator comes through here.
func (r *Runner) reserve(ctx context.Context, next *shardmap.Map, epoch uint64) error {
	key := [2]string{next.Tenant, next.Tree}
	r.reserved.mu.Lock()
	got, ok := r.reserved.maps[key]
	r.reserved.mu.Unlock()
	if ok && epoch <= got.ceiling && next.HighWater <= got.highWater {
		return nil
	}
	u, err := unitFrom(ctx, r.store, next.Tenant, next.Tree)
	if err != nil {
		return err
	}
	res := reserved{ceiling: math.MaxUint64, highWater: math.MaxInt}
	for _, t := range u.trees {
		ceiling, high, err := r.cluster.ReserveMap(ctx, t, epoch, next.HighWater)
		if err != nil {
			return err
		}
		res.ceiling, res.highWater = min(res.ceiling, ceiling), min(res.highWater, high)
	}
	if len(u.trees) == 1 && u.trees[0].Group == "" {
		res.created = u.trees[0].Created
	}
	r.reserved.mu.Lock()
	if r.reserved.maps == nil {
		r.reserved.maps = make(map[[2]string]reserved)
	}
	r.reserved.maps[key] = res
	r.reserved.mu.Unlock()
	return nil
}

// forgetReserved drops what reserve cached for t's map, unless it was
// cached for this very tree. Whatever writes maps calls it as it starts,
// with the registry entry it works on: the tree may have been dropped and
// created again (its record starts over), or its group may have a member
// that joined since (its record is reserved from then on). Neither happens
// while a migration runs (a tree is not dropped while it is resharded, and
// no member joins a group with an intent), so what is cached then holds for
// the whole run.
//
// A lone tree's record lives as long as the tree, and only grows, so what
// was cached for the same tree (same creation time) still holds and is
// kept: a reshard starts dozens of splits of one tree, and each start
// dropped the cache, so the next map write of any of them, often a freeze's
// or a flip's inside a write pause, waited for an upsert on the catalog
// node (make bench's point-select run: flips of 350-440 ms).
func (r *Runner) forgetReserved(t *shardmap.Tree) {
	key := [2]string{t.Tenant, t.MapName()}
	r.reserved.mu.Lock()
	defer r.reserved.mu.Unlock()
	if got, ok := r.reserved.maps[key]; ok && t.Group == "" && !got.created.IsZero() && got.created.Equal(t.Created) {
		return
	}
	delete(r.reserved.maps, key)
}
