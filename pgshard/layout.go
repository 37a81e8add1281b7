package pgshard

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// SetLayout makes l the layout of every shard of t created from now on: it
// sets the storage parameters on the template (so that a map rebuilt from
// the nodes, which reads the template, keeps them) and appends them to the
// tree's DDL log, marked with the resize's id, unless the log has them. The
// existing shards keep theirs: the resize rewrites each into a fresh table.
// It runs under the tree's DDL lock, so it does not interleave with tree
// DDL, and can run again after a crash. It returns the tree as stored.
func (c *Cluster) SetLayout(ctx context.Context, store shardmap.Store, t *shardmap.Tree, l btreeindex.Layout, resize string) (*shardmap.Tree, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	p, err := c.Admin(ctx, c.Catalog().Name, t.Tenant)
	if err != nil {
		return nil, err
	}
	var stored *shardmap.Tree
	conn, lockTx, err := beginTreeDDL(ctx, p, t.Name)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	defer func() { _ = lockTx.Rollback(context.WithoutCancel(ctx)) }() // a no-op once committed
	err = func(tx pgx.Tx) error {
		btrees, err := templateBtrees(ctx, tx, t.Name)
		if err != nil {
			return err
		}
		for _, s := range l.Statements(pgx.Identifier{"public", t.Name}.Sanitize(), quoteIdent("public"), btrees) {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("template: %s: %w", s, err)
			}
		}
		cur, err := store.Tree(ctx, t.Tenant, t.Name)
		if err != nil {
			return err
		}
		stored = cur
		if btreeindex.HasLogEntry(cur.DDL, resize) {
			return nil
		}
		next := *cur
		next.DDL = append(slices.Clone(cur.DDL), l.LogEntry(resize, btrees))
		// Before the commit, as tree DDL does: a failed registry write
		// leaves the template as it was.
		if err := store.SwapTree(ctx, &next, cur); err != nil {
			if errors.Is(err, shardmap.ErrConflict) {
				return sqlstate.New(sqlstate.SerializationFailure, "tree %s was changed by another session while its layout was recorded", t.Name)
			}
			return err
		}
		stored = &next
		return nil
	}(lockTx)
	if err == nil {
		err = lockTx.Commit(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("pgshard: set the layout of tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	return stored, nil
}

// templateBtrees lists the btree indexes of the template public.<table>,
// the primary key's among them: the index names every shard shares.
func templateBtrees(ctx context.Context, tx pgx.Tx, table string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT ic.relname::text FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
JOIN pg_catalog.pg_am am ON am.oid = ic.relam
WHERE i.indrelid = $1::regclass AND am.amname = 'btree'
ORDER BY 1`, pgx.Identifier{"public", table}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("btree indexes of template %s: %w", table, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
