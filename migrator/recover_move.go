package migrator

import (
	"context"
	"fmt"
	"slices"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// A move keeps its shard's index, so while it runs the index has two
// ownership records: the source's, and the target's on the new node. The
// recovery tells them apart by the move's fence: a fenced move is finished
// (the shard ends on the target node, the source table goes); without a
// fence the source still owns the slots, and the target's record, which
// owns none, is a target table to drop.

// secondRecord is the second ownership record of one shard index.
type secondRecord struct {
	idx   int
	shard *recShard
}

// fencedMove returns the fenced move of shard idx of tree, if any.
func fencedMove(st *tenantState, tree string, idx int) (pgshard.Moving, bool) {
	for _, mv := range st.moving {
		if mv.Tree == tree && mv.Kind == string(shardmap.Move) && mv.Source == idx {
			return mv, true
		}
	}
	return pgshard.Moving{}, false
}

// resolveMove leaves one record of index sr.idx in shards, finishing or
// undoing the move that made the second. It reports the move's id when it
// finished one.
func (rc *recovery) resolveMove(ctx context.Context, t *shardmap.Tree, sr secondRecord, shards map[int]*recShard, st *tenantState, epoch uint64) (string, error) {
	first := shards[sr.idx]
	if mv, ok := fencedMove(st, t.Name, sr.idx); ok {
		tgt := first
		if sr.shard.node == mv.TargetNode {
			tgt = sr.shard
		}
		if tgt.node != mv.TargetNode {
			return "", fmt.Errorf("move %s of shard %d to %s: no ownership record on its target node", mv.Migration, sr.idx, mv.TargetNode)
		}
		if err := rc.finishMove(ctx, t, mv, tgt, st, epoch); err != nil {
			return "", fmt.Errorf("finish move %s: %w", mv.Migration, err)
		}
		shards[sr.idx] = tgt
		return mv.Migration, nil
	}
	owner, target := first, sr.shard
	if len(owner.slots) == 0 {
		owner, target = target, owner
	}
	if len(target.slots) > 0 {
		return "", fmt.Errorf("shard %d has ownership records with slots on nodes %s and %s", sr.idx, owner.node, target.node)
	}
	// A move that had not fenced: its stream's objects went with the
	// unfenced migrations; the target table owns nothing.
	st.dropLater(t, sr.idx, target.node)
	shards[sr.idx] = owner
	return "", nil
}

// finishMove carries a fenced move to its end, as finish does a split or
// a fold: unless the target's record holds the slots (the flip was
// written), the stream is drained and the target given them; then the
// stream's objects and the fence go, and the source table is noted for
// dropPending.
func (rc *recovery) finishMove(ctx context.Context, t *shardmap.Tree, mv pgshard.Moving, tgt *recShard, st *tenantState, epoch uint64) error {
	mig := movingMigration(t, mv)
	if err := rc.carry(ctx, t, mig, mv, tgt, st, epoch); err != nil {
		return err
	}
	st.dropLater(t, mv.Source, mv.SourceNode)
	return rc.cluster.DropSlotFence(ctx, mv.SourceNode, rc.runner.fence(t, mig, 0))
}

// refuseVerifyFailed stops the tenant's recovery when a fenced migration of
// one of its trees was held in verify_failed: finishing it would release
// the source's rows, the only good copy of the slots that differ.
func (rc *recovery) refuseVerifyFailed(ctx context.Context, tenant string, todo []pgshard.NodeTree, st *tenantState) error {
	marks, err := rc.cluster.ReadVerifyFailed(ctx, tenant)
	if err != nil {
		return err
	}
	for _, vf := range marks {
		fenced := slices.ContainsFunc(st.moving, func(mv pgshard.Moving) bool { return mv.Migration == vf.Migration })
		// A colocation group's migration is recorded under the group's name.
		rebuilt := slices.ContainsFunc(todo, func(nt pgshard.NodeTree) bool { return nt.Tree.Name == vf.Tree || nt.Tree.MapName() == vf.Tree })
		if !fenced || !rebuilt {
			continue // released since, or a tree Redis still has
		}
		return fmt.Errorf("migration %s of tree %s failed its verification before Redis lost its data (slots %s differ between source and target): "+
			"its source, shard %d on node %s, holds the good copy of those rows, and recover-map does not release it; "+
			"make the target's rows of those slots the source's by hand, then DELETE FROM %s.%s WHERE migration = '%s' on node %s and run recover-map again",
			vf.Migration, vf.Tree, vf.Slots, vf.Shard, vf.Node, shardmap.SchemaName(vf.Shard), pgshard.VerifyFailedTable, vf.Migration, vf.Node)
	}
	return nil
}
