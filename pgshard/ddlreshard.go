package pgshard

import (
	"context"
	"errors"
	"fmt"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// DDLStore is the store tree DDL works with: the registry and maps, and the
// reshard records that keep DDL off a tree whose slots are moving.
type DDLStore interface {
	shardmap.Store
	Reshard(ctx context.Context, tenant, tree string) (*shardmap.Reshard, error)
	Migrations(ctx context.Context, tenant, tree string) ([]*shardmap.Migration, error)
	TreeOps(ctx context.Context, tenant, tree string) ([]*shardmap.TreeOp, error)
}

var ddlOpTags = map[DDLOp]string{
	DDLAlter:       "ALTER TABLE",
	DDLCreateIndex: "CREATE INDEX",
	DDLDropIndex:   "DROP INDEX",
	DDLTruncate:    "TRUNCATE",
	DDLDropTable:   "DROP TABLE",
	DDLMaintain:    "CLUSTER ... USING", // the only maintenance that is logged, and so checked
}

// refuseDuringReshard refuses DDL on a tree while a reshard of it runs. A
// migration's target table replays the tree's DDL log when it is created
// and its stream carries rows, not DDL, so a change made during the copy
// would leave the target differing from its source; a TRUNCATE would stop
// the stream.
func refuseDuringReshard(ctx context.Context, store DDLStore, d TreeDDL) error {
	busy, until := "", "lattice_reshard_complete"
	name := d.Tree // a colocation group's intents and migrations are under its name
	if t, err := store.Tree(ctx, d.Tenant, d.Tree); err == nil {
		name = t.MapName()
	}
	r, err := store.Reshard(ctx, d.Tenant, name)
	switch {
	case err == nil && r.Kind != shardmap.IntentReshard:
		busy, until = fmt.Sprintf("a %s (operation %s) is running", r.Kind, r.OpID), "lattice_rebalance_complete"
	case err == nil:
		busy = fmt.Sprintf("a reshard to %d shards (operation %s) is running", r.Target, r.OpID)
	case !errors.Is(err, shardmap.ErrNotFound):
		return err
	default:
		migs, err := store.Migrations(ctx, d.Tenant, name)
		if err != nil {
			return err
		}
		for _, m := range migs {
			if m.Phase != shardmap.PhaseDone {
				busy = fmt.Sprintf("migration %s (%s of shard %d) is in phase %s", m.ID, m.Kind, m.Source, m.Phase)
				break
			}
		}
	}
	if busy == "" {
		return refuseDuringSnapshot(ctx, store, d)
	}
	return &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
		Message: fmt.Sprintf("%s on tree %s is not allowed while the tree is being resharded", ddlOpTags[d.Op], quoted(d.Tree)),
		Detail:  busy + ".",
		Hint:    fmt.Sprintf("Wait until SELECT %s(%s) returns true, then run the statement again.", until, quoteLiteral(d.Tree))}
}

// refuseDuringSnapshot refuses DDL on a tree while a snapshot copies it.
// The copy reads each shard under a snapshot exported at the pause, and a
// TRUNCATE or a rewriting ALTER TABLE committed since is not MVCC-safe:
// the shards not yet copied would read as empty, and the new tree would
// silently lack their rows. A dropped column would be copied as NULLs.
// DDL that passed this check before the snapshot was recorded holds its
// shards' locks until it commits, so the pause's fences wait for it.
func refuseDuringSnapshot(ctx context.Context, store DDLStore, d TreeDDL) error {
	ops, err := store.TreeOps(ctx, d.Tenant, d.Tree)
	if err != nil {
		return err
	}
	for _, op := range ops {
		if op.Kind != shardmap.OpSnapshot || op.Tree != d.Tree {
			continue
		}
		return &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
			Message: fmt.Sprintf("%s on tree %s is not allowed while a snapshot of it is being taken", ddlOpTags[d.Op], quoted(d.Tree)),
			Detail:  fmt.Sprintf("Snapshot %s into %s is in phase %s.", op.ID, quoted(op.Target), op.Phase),
			Hint:    fmt.Sprintf("Wait until SELECT lattice_snapshot_complete(%s) returns true, then run the statement again.", quoteLiteral(op.Target))}
	}
	return nil
}
