package migrator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// A move is the split's pipeline with one difference: the target is the
// same shard index on another node. The map has one entry per index, so the
// target table, being filled, is in no map (it owns nothing and no proxy
// reads it, as a pending split target); the flip changes the entry's node
// and thaws the slots, and the release drops the source table. Keeping the
// index keeps the schema name, so nothing that names a shard (ownership
// records, lattice_shards, events) changes but its node.

// checkMove says why shard idx of t cannot move to node in map m, as the
// client should hear it: nil when it can. draining lists the nodes being
// drained, flying the tree's migrations in flight.
func (r *Runner) checkMove(t *shardmap.Tree, m *shardmap.Map, idx int, node string, draining []string, flying []*shardmap.Migration) error {
	if !slices.Contains(r.cluster.NodeNames(), node) {
		e := sqlstate.New(sqlstate.UndefinedObject, "node %q does not exist", node)
		e.Hint = "The nodes are " + strings.Join(r.cluster.NodeNames(), ", ") + "."
		return e
	}
	sh, ok := m.Shards[idx]
	if !ok {
		e := sqlstate.New(sqlstate.InvalidParameterValue, "tree %s has no shard %d", t.Name, idx)
		e.Hint = fmt.Sprintf("SELECT * FROM lattice_shards('%s') lists its shards.", t.Name)
		return e
	}
	if sh.State != shardmap.ShardActive {
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "shard %d of %s is %s: only active shards move", idx, t.Name, sh.State)
		e.Hint = fmt.Sprintf("Move an active shard; SELECT * FROM lattice_shards('%s') shows each shard's state.", t.Name)
		return e
	}
	if sh.Node == node {
		e := sqlstate.New(sqlstate.InvalidParameterValue, "shard %d of %s is already on node %s", idx, t.Name, node)
		e.Hint = "Name another node to move it to."
		return e
	}
	if slices.Contains(draining, node) {
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s is being drained: no shard moves onto it", node)
		e.Hint = "Move the shard to a node that is not drained."
		return e
	}
	for _, o := range flying {
		if o.Source == idx || o.Target == idx {
			e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "shard %d of %s is part of migration %s (%s, phase %s)", idx, t.Name, o.ID, o.Kind, o.Phase)
			e.Hint = "Wait for that migration to end, then move the shard."
			return e
		}
	}
	if sh.Mixed {
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "shard %d of %s still holds rows of slots it no longer owns", idx, t.Name)
		e.Hint = "Wait for the release of the migration that moved them, then move the shard."
		return e
	}
	if len(m.SlotRanges(idx)) == 0 {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "shard %d of %s owns no slots", idx, t.Name)
	}
	return nil
}

// StartMove records a move of shard idx of t to node and returns the
// record; Run carries it out. Nothing changes when it returns an error.
func (r *Runner) StartMove(ctx context.Context, t *shardmap.Tree, idx int, node string) (*shardmap.Migration, error) {
	m, err := r.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	migs, err := r.store.Migrations(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	draining, err := r.store.DrainingNodes(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.checkMove(t, m, idx, node, draining, inFlight(migs)); err != nil {
		return nil, err
	}
	mig := &shardmap.Migration{ID: newID(), Tenant: t.Tenant, Tree: t.MapName(), Kind: shardmap.Move,
		Source: idx, SourceNode: m.Shards[idx].Node, Target: idx, TargetNode: node,
		Slots: m.SlotRanges(idx), Phase: shardmap.PhasePrepare, Created: time.Now().UTC()}
	if err := r.store.PutMigration(ctx, mig); err != nil {
		return nil, err
	}
	return mig, nil
}

// prepareMove creates the target tables on the target node (replaying
// each tree's DDL log), owning no slot: one per member of the map.
func (r *Runner) prepareMove(ctx context.Context, u unit, mig *shardmap.Migration) error {
	m, err := r.store.Map(ctx, mig.Tenant, u.name())
	if err != nil {
		return err
	}
	u, err = r.afterTreeDDL(ctx, u)
	if err != nil {
		return err
	}
	if err := r.createMembers(ctx, u, mig.Target, mig.TargetNode, m.Epoch); err != nil {
		return err
	}
	r.crash("prepare")
	return nil
}

// flipMove points the shard's map entry at the target node. The slots
// already name the index, and the freeze's caller has thawed them.
func flipMove(m *shardmap.Map, mig *shardmap.Migration) {
	sh := m.Shards[mig.Source]
	sh.Node = mig.TargetNode
	m.Shards[mig.Source] = sh
}

// movedFlipped reports whether the map already has the shard on the target
// node (a flip whose phase change was lost in a crash).
func movedFlipped(m *shardmap.Map, mig *shardmap.Migration) bool {
	return m.Shards[mig.Source].Node == mig.TargetNode
}

// releaseMove drops the source table (and its schema, once no tree has a
// shard in it) and the fence's function, after the stream, slot and
// publication are gone and every proxy routes by the flipped map. A map
// that still has the shard on the source (it cannot, after a flip) keeps
// the table.
func (r *Runner) releaseMove(ctx context.Context, u unit, m *shardmap.Map, mig *shardmap.Migration) error {
	if !movedFlipped(m, mig) {
		r.log.Warn("moved shard is still on its source node; keeping its table", "migration", mig.ID, "shard", mig.Source, "node", mig.SourceNode)
	} else if err := r.dropMembers(ctx, u, mig.Source, mig.SourceNode); err != nil {
		return err
	}
	return r.dropFences(ctx, u, mig, false)
}
