package pgshard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// TreesTable, in each tenant's database on the catalog node, records for
// every tree what its template does not show, so that `lattice recover-map`
// can rebuild the registry entry and a map whose epoch is above every epoch
// the tree's map ever had:
//
//	CREATE TABLE lattice_meta.trees (
//	    tree          text PRIMARY KEY,
//	    key_column    text NOT NULL,
//	    slot_count    int NOT NULL,
//	    created       timestamptz NOT NULL,  -- the registry entry's Created
//	    epoch_ceiling bigint NOT NULL,       -- no map of the tree was written with a higher epoch
//	    high_water    int NOT NULL,          -- no shard index at or above it was handed out
//	    colocation_group text                -- the tree's group when it joined one (colocate_with)
//	)
//
// A tree that a colocate_with named first has no group in its row: the
// group is named after it, and a member's row names it (ReadTrees).
//
// The row is written in the catalog transaction that fences the template
// and deleted in the one that drops it, so it exists exactly while the
// template is a tree's. The migrator raises the ceiling before it writes a
// map above it (ReserveMap).
const TreesTable = fenceSchema + ".trees"

// EpochBlock is how far above a map write's epoch ReserveMap raises the
// ceiling, so that one catalog write covers many map writes.
const EpochBlock = 1024

func treesTableDDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + TreesTable + ` (
    tree          text PRIMARY KEY,
    key_column    text NOT NULL,
    slot_count    int NOT NULL,
    created       timestamptz NOT NULL,
    epoch_ceiling bigint NOT NULL,
    high_water    int NOT NULL
);
ALTER TABLE ` + TreesTable + ` ADD COLUMN IF NOT EXISTS colocation_group text`
}

// TreeRecord is one row of TreesTable.
type TreeRecord struct {
	Tree         string
	KeyColumn    string
	SlotCount    int
	Created      time.Time
	EpochCeiling uint64
	HighWater    int
	Group        string // "" when the row names none
}

// recordTree writes t's row inside the catalog transaction that fences its
// template (a tree created again replaces the row of the one dropped).
func recordTree(ctx context.Context, tx pgx.Tx, t *shardmap.Tree, m *shardmap.Map) error {
	ceiling, err := epochParam(m.Epoch + EpochBlock)
	if err != nil {
		return err
	}
	// CREATE TABLE IF NOT EXISTS races with itself: fenceTemplate took the
	// schema lock of this transaction already.
	if _, err := tx.Exec(ctx, treesTableDDL()); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+TreesTable+` (tree, key_column, slot_count, created, epoch_ceiling, high_water, colocation_group)
VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''))
ON CONFLICT (tree) DO UPDATE SET key_column = excluded.key_column, slot_count = excluded.slot_count,
    created = excluded.created, epoch_ceiling = excluded.epoch_ceiling, high_water = excluded.high_water,
    colocation_group = excluded.colocation_group`,
		t.Name, t.KeyColumn, t.SlotCount, t.Created, ceiling, m.HighWater, t.Group)
	return err
}

// forgetTree deletes t's row inside the catalog transaction that drops its
// template.
func forgetTree(ctx context.Context, tx pgx.Tx, t *shardmap.Tree) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, TreesTable).Scan(&exists); err != nil || !exists {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM `+TreesTable+` WHERE tree = $1`, t.Name)
	return err
}

// ReserveMap raises t's ceiling on the catalog node to epoch+EpochBlock and
// its high-water mark to highWater, unless they are there already, and
// returns the stored pair. A map of epoch and high-water mark may be
// written once it returns. A tree created before the record existed gets
// its row here.
func (c *Cluster) ReserveMap(ctx context.Context, t *shardmap.Tree, epoch uint64, highWater int) (ceiling uint64, high int, err error) {
	want, err := epochParam(epoch + EpochBlock)
	if err != nil {
		return 0, 0, err
	}
	p, err := c.Admin(ctx, c.Catalog().Name, t.Tenant)
	if err != nil {
		return 0, 0, err
	}
	q := `INSERT INTO ` + TreesTable + ` AS r (tree, key_column, slot_count, created, epoch_ceiling, high_water)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tree) DO UPDATE SET epoch_ceiling = greatest(r.epoch_ceiling, excluded.epoch_ceiling),
    high_water = greatest(r.high_water, excluded.high_water)
RETURNING epoch_ceiling, high_water`
	var ce int64
	for attempt := 0; ; attempt++ {
		err = p.QueryRow(ctx, q, t.Name, t.KeyColumn, t.SlotCount, t.Created, want, highWater).Scan(&ce, &high)
		if attempt > 0 || !sqlstate.Is(err, sqlstate.UndefinedTable) && !sqlstate.Is(err, sqlstate.InvalidSchemaName) {
			break
		}
		err = ensureTreesTable(ctx, p)
		if err != nil {
			break
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("pgshard: reserve map epoch %d of %s/%s on the catalog node: %w", epoch, t.Tenant, t.Name, err)
	}
	return uint64(ce), high, nil
}

// ensureTreesTable creates TreesTable for a tenant whose trees predate it.
func ensureTreesTable(ctx context.Context, p *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, -1)", schemaLockClass)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+fenceSchema); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, treesTableDDL())
		return err
	})
}

// HasTrees reports whether the catalog node holds the fenced template of
// some tree of tenant: the nodes' word that the tenant has trees, for a
// proxy whose store lists none (its maps were lost). A tenant without a
// database on the catalog node has none.
//
// DROP TABLE of a tree unregisters it before its nodes commit, so a
// template seen here may be one being dropped: each is locked (waiting for
// that drop to end) before it counts, or the last tree's drop would make
// the tenant's other sessions see lost maps.
func (c *Cluster) HasTrees(ctx context.Context, tenant string) (bool, error) {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return false, err
	}
	rows, err := p.Query(ctx, `SELECT DISTINCT c.relname::text FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE t.tgname = $1 AND n.nspname = 'public' LIMIT 16`, fenceTrigger)
	var names []string
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if sqlstate.Is(err, sqlstate.InvalidCatalogName) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pgshard: look for trees of %s on the catalog node: %w", tenant, err)
	}
	for _, name := range names {
		held, err := templateHeld(ctx, p, name)
		if err != nil {
			return false, fmt.Errorf("pgshard: look for trees of %s on the catalog node: %w", tenant, err)
		}
		if held {
			return true, nil
		}
	}
	return false, nil
}

// templateHeld locks public.name, which waits out a DROP in progress, and
// reports whether it still exists.
func templateHeld(ctx context.Context, p *pgxpool.Pool, name string) (bool, error) {
	held := false
	err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{"public", name}.Sanitize()+" IN ACCESS SHARE MODE")
		if sqlstate.Is(err, sqlstate.UndefinedTable) {
			return nil
		}
		held = err == nil
		return err
	})
	return held, err
}

// errNoRecord is returned by ClaimSlots for a shard without an ownership
// record.
var errNoRecord = errors.New("no ownership record")

// ClaimSlots adds slots to the ownership record of shard idx of t on node
// and raises its epoch to epoch: the migrator's record that a flipped
// migration's target owns them, written before the release removes
// anything.
func (c *Cluster) ClaimSlots(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error {
	ep, err := epochParam(epoch)
	if err != nil {
		return err
	}
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	tag, err := p.Exec(ctx, `UPDATE `+quoteIdent(shardmap.SchemaName(idx))+`.`+OwnerTable+`
SET slots = slots + $2::int4multirange, epoch = greatest(epoch, $3), updated = now() WHERE tree = $1`,
		t.Name, multirange(slots), ep)
	if err == nil && tag.RowsAffected() == 0 {
		err = errNoRecord
	}
	if err != nil {
		return fmt.Errorf("pgshard: claim slots for shard %d of %s/%s on %s: %w", idx, t.Tenant, t.Name, node, err)
	}
	return nil
}
