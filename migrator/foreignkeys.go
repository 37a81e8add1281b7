package migrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Foreign keys between the members of a colocation group (docs/DESIGN.md
// section 4.1, "Foreign keys"): a member's DDL log may add a foreign key to
// another member's table in the same shard schema, so that table must exist
// before the member's is built, and the migrator's own writes must not be
// checked row by row against a shard that is only partly copied.

// createMembers creates shard idx of every member of u on node, a
// referenced member before the members referencing it (its DDL log names
// the other's table).
func (r *Runner) createMembers(ctx context.Context, u unit, idx int, node string, epoch uint64) error {
	return inReferenceOrder(u.trees, sqlstate.UndefinedTable, func(t *shardmap.Tree) error {
		return r.cluster.CreateShard(ctx, t, idx, node, nil, epoch)
	})
}

// dropMembers drops shard idx of every member of u on node, the members
// referencing another before it.
func (r *Runner) dropMembers(ctx context.Context, u unit, idx int, node string) error {
	return inReferenceOrder(u.trees, sqlstate.DependentObjectsStillExist, func(t *shardmap.Tree) error {
		return r.cluster.DropShard(ctx, t, idx, node)
	})
}

// inReferenceOrder runs fn, one transaction, for every tree, in an order
// the foreign keys between them allow. Trees are tried in name order; one
// that fails with code (a table it references is not built yet, or a table
// referencing it is not dropped yet) is tried again after the others,
// until a round gets none further: then the trees reference each other in
// a cycle, and that error is returned.
func inReferenceOrder(trees []*shardmap.Tree, code string, fn func(t *shardmap.Tree) error) error {
	pending := trees
	for len(pending) > 0 {
		var later []*shardmap.Tree
		var blocked error
		for _, t := range pending {
			err := fn(t)
			switch {
			case err == nil:
			case sqlstate.Is(err, code) && len(pending) > 1:
				later, blocked = append(later, t), err
			default:
				return err
			}
		}
		if len(later) == len(pending) {
			return blocked
		}
		pending = later
	}
	return nil
}

// errForeignKeysNeedReplica is a shadow copy's refusal to write member
// tables with foreign keys without replica mode.
var errForeignKeysNeedReplica = errors.New("migrator: the target's tables have foreign keys, and the control role may not SET session_replication_role " +
	"(GRANT SET ON PARAMETER session_replication_role TO the control role)")

// replicaForForeignKeys puts the shadow's target session in replica mode
// when a target table has a foreign key. The copy writes a child's rows
// before or after its parent's, and the stream applies row changes one by
// one (a cascaded delete arrives as the rows it deleted), so a constraint
// checked per row would fail on a state that is consistent at every
// commit of the source; replica mode, as PostgreSQL's own subscriber uses,
// skips the foreign keys' triggers. It is a session setting of the
// shadow's own connection. Without the privilege the shadow stops with an
// error before it writes anything: the reshard waits, no row is lost.
func replicaForForeignKeys(ctx context.Context, c *pgx.Conn, tables []string) error {
	var fks, may bool
	err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE contype = 'f' AND conrelid = ANY ($1::regclass[])),
		has_parameter_privilege('session_replication_role', 'SET')`, tables).Scan(&fks, &may)
	switch {
	case err != nil:
		return fmt.Errorf("migrator: foreign keys of the target tables: %w", err)
	case !fks:
		return nil
	case !may:
		return errForeignKeysNeedReplica
	}
	if _, err := c.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		return fmt.Errorf("migrator: replica mode for foreign keys: %w", err)
	}
	return nil
}

// shadowTables lists the target tables of a shadow copy.
func shadowTables(sp ShadowSpec) []string {
	var out []string
	for _, t := range sp.trees() {
		out = append(out, pgshard.ShardTable(t, sp.Target))
	}
	return out
}
