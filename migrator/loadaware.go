package migrator

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/lattice-db/lattice/autonomic"
	"github.com/lattice-db/lattice/shardmap"
)

// SetLoad gives the coordinator the tree's write rates: a grow then
// splits the hottest eligible shards first, each at its load midpoint,
// and falls back to the largest slot owners when a tree has no load data.
func (c *Coordinator) SetLoad(l autonomic.LoadSource) { c.load = l }

// slotWrites is u's writes per slot, nil without a load source, without
// data for u, or when it wrote nothing (a split by slot count is then as
// good as any).
func (c *Coordinator) slotWrites(ctx context.Context, u unit) []float64 {
	if c.load == nil {
		return nil
	}
	key := u.lead.Tenant + "/" + u.name()
	c.seenMu.Lock()
	seen, ok := c.seen[key]
	c.seenMu.Unlock()
	if ok && time.Since(seen.at) < writesFresh {
		return seen.w
	}
	w := c.readSlotWrites(ctx, u)
	c.seenMu.Lock()
	if c.seen == nil {
		c.seen = map[string]seenWrites{}
	}
	for k, s := range c.seen { // a tree whose grow ended is not read again
		if time.Since(s.at) >= writesFresh {
			delete(c.seen, k)
		}
	}
	c.seen[key] = seenWrites{at: time.Now(), w: w}
	c.seenMu.Unlock()
	return w
}

// writesFresh is how long a grow's plan reuses a unit's writes per slot.
// A grow ticks at every migration's end, many times a second in a wide
// one, and each read took six buckets of every slot's counts from Redis (4%
// of a race-built proxy's CPU while it grew under load); the signal itself
// moves in buckets of shardmap.LoadBucket.
const writesFresh = time.Second

type seenWrites struct {
	at time.Time
	w  []float64
}

func (c *Coordinator) readSlotWrites(ctx context.Context, u unit) []float64 {
	w, err := unitWrites(ctx, c.load, u)
	if err != nil {
		c.log.Warn("coordinator: load data", "tree", u.name(), "tenant", u.lead.Tenant, "err", err)
		return nil
	}
	for _, x := range w {
		if x > 0 {
			return w
		}
	}
	return nil
}

// unitWrites sums the writes per slot of u's trees: a tree's load is kept
// under its own name, and a colocation group's members share one map, so
// a slot's load is its rows in every member. nil when no member has data.
func unitWrites(ctx context.Context, load autonomic.LoadSource, u unit) ([]float64, error) {
	var sum []float64
	for _, t := range u.trees {
		w, err := load.SlotWrites(ctx, t.Tenant, t.Name)
		if err != nil {
			return nil, err
		}
		if w == nil {
			continue
		}
		if sum == nil {
			sum = make([]float64, len(w))
		}
		for slot := range min(len(w), len(sum)) {
			sum[slot] += w[slot]
		}
	}
	return sum, nil
}

// splitSourcesByLoad is splitSources, the hottest first when writes are
// known (ties, cold shards among them, in splitSources' order).
func splitSourcesByLoad(m *shardmap.Map, flying []*shardmap.Migration, writes []float64) []int {
	src := splitSources(m, flying)
	if writes == nil {
		return src
	}
	load := autonomic.ShardWrites(m, writes)
	slices.SortStableFunc(src, func(a, b int) int { return cmp.Compare(load[b], load[a]) })
	return src
}

// growSplit starts a grow's split of src: at its load midpoint when
// writes are known, else of the upper half of its slots.
func (c *Coordinator) growSplit(ctx context.Context, t *shardmap.Tree, m *shardmap.Map, src int, writes []float64) (*shardmap.Migration, error) {
	if writes != nil {
		if from, ok := autonomic.Midpoint(m, src, writes); ok {
			c.log.Info("coordinator: a grow splits a shard at its load midpoint", "tree", t.MapName(), "tenant", t.Tenant,
				"shard", src, "from_slot", from, "writes_per_second", autonomic.ShardWrites(m, writes)[src])
			return c.runner.startSplit(ctx, t, src, splitAt{from: from})
		}
	}
	return c.runner.StartSplit(ctx, t, src)
}

// healing reports a fold healing started that has not finished.
func healing(flying []*shardmap.Migration) bool {
	return slices.ContainsFunc(flying, func(m *shardmap.Migration) bool {
		return m.Kind == shardmap.Fold && m.Origin == shardmap.OriginAutoheal
	})
}
