package migrator

import (
	"context"
	"log/slog"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TreeOpInterlocks answers the coordinator's interlock questions from the
// tree operations recorded in the store (shardmap.TreeOp): the
// specification's rules, as docs/DESIGN.md section 6a states them.
type TreeOpInterlocks struct {
	Store shardmap.TreeOps
	Log   *slog.Logger
}

var _ Interlocks = TreeOpInterlocks{}

// running reports whether a recorded operation matches. A store that cannot
// be read answers yes: a fold held or a reshard refused for a tick is
// retried, a donor released under a snapshot is not. The coordinator asks
// with a map's name, a colocation group's for its members, and an
// operation names the tree it was called on: every operation of the
// tenant is read, and match compares maps (TreeOp.OnMap, IntoMap).
func (i TreeOpInterlocks) running(ctx context.Context, tenant, tree string, match func(*shardmap.TreeOp) bool) bool {
	ops, err := i.Store.TreeOps(ctx, tenant, "")
	if err != nil {
		if i.Log != nil {
			i.Log.Warn("interlocks: tree operations not read; answering that one runs", "tree", tree, "tenant", tenant, "err", err)
		}
		return true
	}
	for _, op := range ops {
		if op.Phase != shardmap.OpFailed && match(op) {
			return true
		}
	}
	return false
}

// ResizeInFlight implements Interlocks: a resize of the tree (of its
// colocation group) is recorded.
func (i TreeOpInterlocks) ResizeInFlight(ctx context.Context, tenant, tree string) bool {
	return i.running(ctx, tenant, tree, func(op *shardmap.TreeOp) bool {
		return op.Kind == shardmap.OpResize && op.OnMap(tree)
	})
}

// SnapshotOrMergeRunning implements Interlocks: a snapshot of the tree, or
// a merge into it, is recorded; for a colocation group's map, of or into
// any member, since the group's folds retire every member's table. Those
// read the shards they recorded when they started. A merge from the tree
// does not count: it notices a source shard a fold retired and drains the
// source again (the specification's second rule).
func (i TreeOpInterlocks) SnapshotOrMergeRunning(ctx context.Context, tenant, tree string) bool {
	return i.running(ctx, tenant, tree, func(op *shardmap.TreeOp) bool {
		return op.Kind == shardmap.OpSnapshot && op.OnMap(tree) || op.Kind == shardmap.OpMerge && op.IntoMap(tree)
	})
}

// HoldFold implements Interlocks: the same operations hold a fold's final
// step and the release of its donor.
func (i TreeOpInterlocks) HoldFold(ctx context.Context, tenant, tree string) bool {
	return i.SnapshotOrMergeRunning(ctx, tenant, tree)
}

// HoldMoveRelease implements Interlocks: a snapshot of the tree (of any
// member of its colocation group) is recorded. It copies each shard from
// the node its pause found it on, and a move's release drops the table
// there: the copy would fail and the snapshot pause and copy again. A
// merge into the tree routes its rows again when a table is dropped under
// it, so a merge holds no move.
func (i TreeOpInterlocks) HoldMoveRelease(ctx context.Context, tenant, tree string) bool {
	return i.running(ctx, tenant, tree, func(op *shardmap.TreeOp) bool {
		return op.Kind == shardmap.OpSnapshot && op.OnMap(tree)
	})
}

// foldHoldPoll is how often a held fold asks its interlocks again.
const foldHoldPoll = 500 * time.Millisecond

// holdRetirement waits while the interlocks hold a migration that retires
// its source's table. A fold's (or a resize's, which retires its source as
// a fold does) final step is held: before its freeze (draining meanwhile,
// when sh is its stream) and before its release drops the donor. A
// snapshot or merge reads the shards it recorded when it started, and a
// fold that went on would retire one under it. A move is held before its
// release only (release), which drops the table on its old node.
func (r *Runner) holdRetirement(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, sh Stream, release bool) error {
	var holds func(ctx context.Context, tenant, tree string) bool
	why := "a snapshot of the tree or a merge into it runs"
	switch {
	case mig.Kind == shardmap.Fold || mig.Kind == shardmap.Resize:
		holds = r.interlocks.HoldFold
	case mig.Kind == shardmap.Move && release:
		holds, why = r.interlocks.HoldMoveRelease, "a snapshot of the tree runs"
	default:
		return nil
	}
	held := false
	for holds(ctx, mig.Tenant, mig.Tree) {
		if !held {
			r.log.Info(string(mig.Kind)+" held: "+why, "migration", mig.ID, "tree", mig.Tree, "phase", mig.Phase)
			held = true
		}
		if sh != nil {
			if err := r.drain(ctx, t, mig, sh); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(foldHoldPoll):
		}
	}
	if held {
		r.log.Info(string(mig.Kind)+" goes on: nothing holds it any more", "migration", mig.ID, "tree", mig.Tree)
	}
	return nil
}
