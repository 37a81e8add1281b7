package pgshard

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// VerifyFailedTable is the table in a source's shard schema that records a
// migration held in verify_failed, from the failed comparison until its
// repair passes:
//
//	CREATE TABLE lattice_sNNNN.lattice_verify_failed (
//	    migration text PRIMARY KEY,
//	    tree      text NOT NULL,
//	    slots     int4multirange NOT NULL, -- the slots that differ
//	    at        timestamptz NOT NULL
//	)
//
// Redis holds the migration's phase; this row is what `lattice
// recover-map` finds of it once Redis lost its data, so that it does not
// release a move whose source holds the only good copy of some rows.
const VerifyFailedTable = "lattice_verify_failed"

// VerifyFailed is one VerifyFailedTable row.
type VerifyFailed struct {
	Migration, Tree string
	Node            string
	Shard           int
	Slots           string // the differing slots, as a multirange literal
}

// MarkVerifyFailed records on node that migration, whose source is shard
// idx of t there, failed its verification in slots.
func (c *Cluster) MarkVerifyFailed(ctx context.Context, t *shardmap.Tree, node string, idx int, migration string, slots [][2]int) error {
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	schema := quoteIdent(shardmap.SchemaName(idx))
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.`+VerifyFailedTable+` (
    migration text PRIMARY KEY,
    tree      text NOT NULL,
    slots     int4multirange NOT NULL,
    at        timestamptz NOT NULL
)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.`+VerifyFailedTable+` (migration, tree, slots, at)
VALUES ($1, $2, $3::int4multirange, now()) ON CONFLICT (migration) DO UPDATE SET slots = excluded.slots, at = now()`,
			migration, t.Name, multirange(slots))
		return err
	})
	if err != nil {
		return fmt.Errorf("pgshard: record that migration %s failed its verification on %s: %w", migration, node, err)
	}
	return nil
}

// ClearVerifyFailed removes MarkVerifyFailed's row, and the table once it
// is empty.
func (c *Cluster) ClearVerifyFailed(ctx context.Context, t *shardmap.Tree, node string, idx int, migration string) error {
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	table := quoteIdent(shardmap.SchemaName(idx)) + "." + VerifyFailedTable
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE migration = $1`, migration); err != nil {
			return err
		}
		var others bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+`)`).Scan(&others); err != nil || others {
			return err
		}
		_, err := tx.Exec(ctx, `DROP TABLE `+table)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgshard: clear migration %s's failed verification on %s: %w", migration, node, err)
	}
	return nil
}

// ReadVerifyFailed reads every VerifyFailedTable row of tenant on every
// node.
func (c *Cluster) ReadVerifyFailed(ctx context.Context, tenant string) ([]VerifyFailed, error) {
	names := c.NodeNames()
	per := make([][]VerifyFailed, len(names))
	err := forEachNode(ctx, names, func(ctx context.Context, node string) error {
		p, err := c.Admin(ctx, node, tenant)
		if err != nil {
			return err
		}
		schemas, err := shardSchemasWith(ctx, p.Query, VerifyFailedTable)
		if sqlstate.Is(err, sqlstate.InvalidCatalogName) { // no such database
			return nil
		}
		if err != nil {
			return fmt.Errorf("pgshard: node %s: %w", node, err)
		}
		for idx, schema := range schemas {
			rows, err := p.Query(ctx, `SELECT migration, tree, slots::text FROM `+quoteIdent(schema)+`.`+VerifyFailedTable+` ORDER BY 1`)
			if err != nil {
				return fmt.Errorf("pgshard: node %s: read %s.%s: %w", node, schema, VerifyFailedTable, err)
			}
			for rows.Next() {
				vf := VerifyFailed{Node: node, Shard: idx}
				if err := rows.Scan(&vf.Migration, &vf.Tree, &vf.Slots); err != nil {
					rows.Close()
					return err
				}
				per[indexOf(names, node)] = append(per[indexOf(names, node)], vf)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []VerifyFailed
	for _, l := range per {
		out = append(out, l...)
	}
	return out, nil
}
