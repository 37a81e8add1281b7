package migrator

import (
	"context"
	"sync"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// reservations caches, per tree, the epoch ceiling and high-water mark the
// catalog node records (pgshard.TreesTable), so that a map write costs a
// catalog write only once per pgshard.EpochBlock epochs and once per new
// shard index.
type reservations struct {
	mu    sync.Mutex
	trees map[[2]string]reserved
}

type reserved struct {
	created   time.Time // the tree's; a tree created again starts over
	ceiling   uint64
	highWater int
}

// reserve makes sure the catalog node's record allows next to be written
// with epoch: a map the store never held above the recorded ceiling is
// what lets `lattice recover-map` give a rebuilt map a higher epoch than
// any a proxy has seen. Every map write of the migrator comes through here.
func (r *Runner) reserve(ctx context.Context, next *shardmap.Map, epoch uint64) error {
	key := [2]string{next.Tenant, next.Tree}
	r.reserved.mu.Lock()
	got, ok := r.reserved.trees[key]
	r.reserved.mu.Unlock()
	if ok && epoch <= got.ceiling && next.HighWater <= got.highWater {
		return nil
	}
	t, err := r.store.Tree(ctx, next.Tenant, next.Tree)
	if err != nil {
		return err
	}
	ceiling, high, err := r.cluster.ReserveMap(ctx, t, epoch, next.HighWater)
	if err != nil {
		return err
	}
	r.reserved.mu.Lock()
	if r.reserved.trees == nil {
		r.reserved.trees = make(map[[2]string]reserved)
	}
	r.reserved.trees[key] = reserved{created: t.Created, ceiling: ceiling, highWater: high}
	r.reserved.mu.Unlock()
	return nil
}

// forgetReserved drops what reserve cached for an earlier tree of t's name
// (dropped and created again, its record starts over). Whatever writes
// maps calls it with the registry entry it works on; a tree is not dropped
// while it is resharded, so the entry holds for the whole run.
func (r *Runner) forgetReserved(t *shardmap.Tree) {
	key := [2]string{t.Tenant, t.Name}
	r.reserved.mu.Lock()
	if got, ok := r.reserved.trees[key]; ok && !got.created.Equal(t.Created) {
		delete(r.reserved.trees, key)
	}
	r.reserved.mu.Unlock()
}
