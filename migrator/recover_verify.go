package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// proveMoving compares every fenced migration of the trees to rebuild from
// its target's write log (5.5) before a recovery writes any tree: Redis
// lost the migration's record, and with it any comparison the coordinator
// made, and the recovery is about to release the source. A migration whose
// stream is left is drained first, so that a target that was never flipped
// holds every write the fence let through. A mismatch is recorded on the
// source's node, which refuses this recovery and the next ones
// (refuseVerifyFailed) until an operator makes the rows agree: the source
// holds the good copy.
func (rc *recovery) proveMoving(ctx context.Context, todo []pgshard.NodeTree, st *tenantState) error {
	drained := map[string]bool{}
	for _, mv := range st.moving {
		i := slices.IndexFunc(todo, func(nt pgshard.NodeTree) bool { return nt.Tree.Name == mv.Tree })
		if i < 0 {
			continue // a tree Redis still has
		}
		t := todo[i].Tree
		mig := movingMigration(t, mv)
		if hasObject(st, mv.Migration, "slot") && !drained[mv.Migration] {
			if err := rc.drain(ctx, t, mig, st); err != nil {
				return fmt.Errorf("migration %s of tree %s: %w", mv.Migration, t.Name, err)
			}
			drained[mv.Migration] = true
		}
		if err := rc.proveFenced(ctx, t, mig); err != nil {
			return fmt.Errorf("migration %s of tree %s: %w", mv.Migration, t.Name, err)
		}
	}
	return nil
}

// proveFenced compares one fenced migration's table; on a match its write
// log goes. A migration without a log (frozen with verification off, or
// by an older build) is finished as before, with a warning.
func (rc *recovery) proveFenced(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration) error {
	ts := []*shardmap.Tree{t}
	cmp, err := rc.nodes.OpenWriteLog(ctx, ts, mig, rc.runner.opts.VerifyTimeout)
	if err != nil {
		return err
	}
	defer cmp.Close()
	v, err := cmp.Compare(ctx)
	switch {
	case errors.Is(err, errNoWriteLog):
		rc.log.Warn("recover-map: migration finished unverified: its target holds no write log", "migration", mig.ID, "tree", t.Name)
		return nil
	case err != nil:
		return fmt.Errorf("compare its slots: %w", err)
	case len(v.Differ) > 0:
		if err := rc.nodes.MarkVerifyFailed(ctx, t, mig.SourceNode, mig.Source, mig.ID, slotRanges(diffSlots(v))); err != nil {
			return err
		}
		return fmt.Errorf("slots %s differ between its source (shard %d on %s) and its target (shard %d on %s) as of the flip: "+
			"recover-map does not release the source, which keeps its rows; make the target's rows of those slots the source's by hand, "+
			"then DELETE FROM %s.%s WHERE migration = '%s' on node %s and run recover-map again",
			formatSlots(v.Differ), mig.Source, mig.SourceNode, mig.Target, mig.TargetNode,
			shardmap.SchemaName(mig.Source), pgshard.VerifyFailedTable, mig.ID, mig.SourceNode)
	}
	rc.log.Info("recover-map: migration verified from its target's write log", "migration", mig.ID, "tree", t.Name, "rows", v.Rows)
	return rc.nodes.DropWriteLog(ctx, ts, mig)
}
