package pgshard

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// checkForeignKey refuses a foreign key of tree t's template (t's own, or
// another table's referencing t) that shard-by-shard constraints could not
// enforce: one between t and a tree of another colocation group or an
// ordinary table, or from a reference table to t. The router refuses
// these forms before they run (router/foreignkey.go, which also checks the
// paired keys and the actions); this catches what only the catalog knows.
func checkForeignKey(ctx context.Context, store shardmap.Store, t *shardmap.Tree, con constraintInfo) error {
	other := con.To
	if !con.Outgoing {
		other = con.From
	}
	ot, err := store.Tree(ctx, t.Tenant, other)
	switch {
	case err == nil && ot.MapName() == t.MapName():
		return nil
	case err != nil && !errors.Is(err, shardmap.ErrNotFound):
		return fmt.Errorf("pgshard: foreign key %s: %w", quoted(con.Name), err)
	}
	if rs, ok := store.(shardmap.ReferenceStore); ok && con.Outgoing && err != nil {
		refs, err := rs.References(ctx, t.Tenant)
		if err != nil {
			return fmt.Errorf("pgshard: foreign key %s: %w", quoted(con.Name), err)
		}
		if slices.ContainsFunc(refs, func(r *shardmap.Reference) bool { return r.Name == other }) {
			return nil
		}
	}
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: fmt.Sprintf("foreign key %s from %s to %s cannot be enforced across shards", quoted(con.Name), quoted(con.From), quoted(con.To)),
		Hint:    "A tree may reference a tree of its colocation group (on both shard keys) or a reference table; drop the foreign key: ALTER TABLE " + con.FromSQL + " DROP CONSTRAINT " + quoteIdent(con.Name)}
}

// refuseReferenceCycle refuses foreign keys by which t's template reaches
// itself through other tables: a reshard builds a group's shard tables in
// an order their foreign keys allow (migrator/foreignkeys.go), and a cycle
// allows none. A table referencing itself is no cycle.
func refuseReferenceCycle(ctx context.Context, tx pgx.Tx, t *shardmap.Tree) error {
	var cycle bool
	err := tx.QueryRow(ctx, `WITH RECURSIVE reach (rel) AS (
    SELECT confrelid FROM pg_catalog.pg_constraint WHERE contype = 'f' AND conrelid = $1::regclass AND confrelid <> conrelid
  UNION
    SELECT c.confrelid FROM pg_catalog.pg_constraint c JOIN reach ON c.conrelid = reach.rel WHERE c.contype = 'f' AND c.confrelid <> c.conrelid
) SELECT EXISTS (SELECT 1 FROM reach WHERE rel = $1::regclass)`, pgx.Identifier{"public", t.Name}.Sanitize()).Scan(&cycle)
	switch {
	case err != nil:
		return fmt.Errorf("pgshard: foreign keys of %s: %w", quoted(t.Name), err)
	case cycle:
		return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
			Message: fmt.Sprintf("the foreign keys of tree %s would make a cycle back to it", quoted(t.Name)),
			Detail:  "A reshard builds each shard's tables in an order their foreign keys allow; a cycle allows none.",
			Hint:    "Keep one direction of the relationship as a foreign key, and the other in the application."}
	}
	return nil
}
