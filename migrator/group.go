package migrator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// A migration moves the slots of a map, and a map is a colocation group's
// (docs/DESIGN.md section 4.1) or one tree's. So every migration moves
// every table of its map at once: one publication over the member tables
// of the source shard, one replication slot and exported snapshot, a COPY
// per table in one target transaction, a fence on every member table armed
// in one transaction, one freeze and one flip (the map is shared), and the
// release of every table. Its record, the reshard intent and the lease are
// the map's (Migration.Tree is the map name).

// unit is what one migration moves: the trees that share a map.
type unit struct {
	// lead is a member, for what the members share: the tenant, the slot
	// count, the key type and the map name (MapName).
	lead *shardmap.Tree
	// trees are every member, lead included, sorted by name.
	trees []*shardmap.Tree
}

// name is the map's name: the group's, or the tree's when it is alone.
func (u unit) name() string { return u.lead.MapName() }

// names lists the member trees, for logs.
func (u unit) names() string {
	out := make([]string, len(u.trees))
	for i, t := range u.trees {
		out[i] = t.Name
	}
	return strings.Join(out, ",")
}

// each runs fn for every member, stopping at the first error.
func (u unit) each(fn func(t *shardmap.Tree) error) error {
	for _, t := range u.trees {
		if err := fn(t); err != nil {
			return err
		}
	}
	return nil
}

// unitOf reads the trees of map name (a group's or a tree's) from the
// registry. A group's members cannot change while it has an intent (a
// member joins only without one, shardmap.ErrGroupBusy, and DDL, DROP
// included, is refused while it is resharded), so a run reads them once.
func (r *Runner) unitOf(ctx context.Context, tenant, name string) (unit, error) {
	return unitFrom(ctx, r.store, tenant, name)
}

func unitFrom(ctx context.Context, store shardmap.Store, tenant, name string) (unit, error) {
	t, err := store.Tree(ctx, tenant, name)
	if err == nil && t.Group == "" {
		return unit{lead: t, trees: []*shardmap.Tree{t}}, nil
	}
	trees, err := store.Trees(ctx, tenant)
	if err != nil {
		return unit{}, err
	}
	var u unit
	for _, m := range trees {
		if m.MapName() == name {
			u.trees = append(u.trees, m)
		}
	}
	if len(u.trees) == 0 {
		return unit{}, fmt.Errorf("migrator: no tree of %s uses map %s: %w", tenant, name, shardmap.ErrNotFound)
	}
	slices.SortFunc(u.trees, func(a, b *shardmap.Tree) int { return strings.Compare(a.Name, b.Name) })
	u.lead = u.trees[0]
	for _, m := range u.trees {
		if m.Name == name {
			u.lead = m // the tree the group is named after, while it lives
		}
	}
	return u, nil
}

// fences are the migration's fences, one per member table of its source
// shard.
func (r *Runner) fences(u unit, mig *shardmap.Migration, epoch uint64) []pgshard.SlotFence {
	out := make([]pgshard.SlotFence, len(u.trees))
	for i, t := range u.trees {
		out[i] = r.fence(t, mig, epoch)
	}
	return out
}

// dropFenceTables drops the fence of every member table; give back, for a
// freeze rolled back, returns each table's slots to its ownership record.
func (r *Runner) dropFenceTables(ctx context.Context, u unit, mig *shardmap.Migration, giveBack bool) error {
	for _, f := range r.fences(u, mig, 0) {
		f.Handover.GiveBack = giveBack
		if err := r.cluster.DropSlotFence(ctx, mig.SourceNode, f); err != nil {
			return err
		}
	}
	return nil
}

// treeSizes is ShardSizes of t's map: summed over the members of its
// colocation group.
func (r *Runner) treeSizes(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]pgshard.ShardSize, error) {
	if t.Group == "" {
		return r.cluster.ShardSizes(ctx, t, m)
	}
	u, err := r.unitOf(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	return r.sizes(ctx, u, m)
}

// sizes is what a plan weighs the shards of u by: each shard's rows and
// bytes summed over the member tables, since a migration moves them all.
func (r *Runner) sizes(ctx context.Context, u unit, m *shardmap.Map) (map[int]pgshard.ShardSize, error) {
	out := map[int]pgshard.ShardSize{}
	err := u.each(func(t *shardmap.Tree) error {
		got, err := r.cluster.ShardSizes(ctx, t, m)
		for idx, sz := range got {
			o := out[idx]
			o.Rows, o.Bytes = o.Rows+sz.Rows, o.Bytes+sz.Bytes
			out[idx] = o
		}
		return err
	})
	return out, err
}

// rowCounts is TreeRowCount summed over the member tables.
func (r *Runner) rowCounts(ctx context.Context, u unit, m *shardmap.Map) (map[int]int64, error) {
	out := map[int]int64{}
	err := u.each(func(t *shardmap.Tree) error {
		got, err := r.cluster.TreeRowCount(ctx, t, m)
		for idx, n := range got {
			out[idx] += n
		}
		return err
	})
	return out, err
}
