package migrator

import (
	"context"
	"slices"

	"github.com/lattice-db/lattice/shardmap"
)

// placement returns where a grow puts a new shard of t: on the node holding
// the fewest bytes of the tree (fewestBytes), read from the nodes once, so
// the returned function can run inside a map update.
func (r *Runner) placement(ctx context.Context, t *shardmap.Tree) (func(m *shardmap.Map) string, error) {
	m, err := r.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	sizes, err := r.treeSizes(ctx, t, m)
	if err != nil {
		return nil, err
	}
	bytes := make(map[int]int64, len(sizes))
	for idx, sz := range sizes {
		bytes[idx] = sz.Bytes
	}
	nodes, err := r.activeNodes(ctx)
	if err != nil {
		return nil, err
	}
	return func(m *shardmap.Map) string { return fewestBytes(m, bytes, nodes) }, nil
}

// activeNodes are the nodes shards may be placed on: every node but those
// being drained (all of them if every node is).
func (r *Runner) activeNodes(ctx context.Context) ([]string, error) {
	draining, err := r.store.DrainingNodes(ctx)
	if err != nil {
		return nil, err
	}
	all := r.cluster.NodeNames()
	active := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return slices.Contains(draining, n) })
	if len(active) == 0 {
		return all, nil
	}
	return active, nil
}

// fewestBytes picks, among nodes, the one holding the fewest bytes of the
// tree; on a tie the fewest slots, then the first in order. A pending
// shard (a split target being filled, whose size says little yet) counts
// as half the mean size of the tree's owning shards, which is what a split
// brings it, so that the splits of one tick spread over the nodes.
func fewestBytes(m *shardmap.Map, bytes map[int]int64, nodes []string) string {
	counts := m.SlotCounts()
	var total int64
	for idx := range counts {
		total += bytes[idx]
	}
	pendingWeight := int64(0)
	if len(counts) > 0 {
		pendingWeight = total / int64(len(counts)) / 2
	}
	load, slots := map[string]int64{}, map[string]int{}
	for idx, sh := range m.Shards {
		switch {
		case sh.State == shardmap.ShardPending:
			load[sh.Node] += max(bytes[idx], pendingWeight)
		case counts[idx] > 0:
			load[sh.Node] += bytes[idx]
			slots[sh.Node] += counts[idx]
		}
	}
	best := ""
	for _, n := range nodes {
		if best == "" || load[n] < load[best] || load[n] == load[best] && slots[n] < slots[best] {
			best = n
		}
	}
	return best
}
