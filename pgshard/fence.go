package pgshard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/shardmap"
)

// MigratorSetting, set to "on" in a transaction, lets the migrator's own
// cleanup of moved rows pass the slot fences.
const MigratorSetting = "lattice.migrator"

// SkipMovedSetting, set to "on" in a transaction by the proxy for an UPDATE
// or DELETE over every shard of a tree, makes a fence skip the rows of the
// fenced slots silently: the statement reaches them on their new owner. A
// write for one key still gets FenceCode.
const SkipMovedSetting = "lattice.skip_moved"

// fenceLockTimeout is how long one attempt to install a fence waits for the
// writers already inside the table. Writers of the table's other slots queue
// behind the attempt, so it is kept short and retried instead.
const fenceLockTimeout = 50 * time.Millisecond

// SlotFence rejects writes to some slots of a shard table with FenceCode:
// the slots moved (or are moving) to another shard.
type SlotFence struct {
	Migration string // names the trigger and its function
	Tree      *shardmap.Tree
	Shard     int      // the fenced shard table
	Slots     [][2]int // the fenced slots
	Target    int      // where they go, for the error detail
	Epoch     uint64
}

func (f SlotFence) trigger() string { return "lattice_fence_m_" + f.Migration }

func (f SlotFence) function() string {
	// One function per fenced table: several tables of a node may be fenced
	// under one name (an empty-tree re-pin), and each is dropped alone.
	return fenceSchema + "." + pgx.Identifier{fmt.Sprintf("fence_m_%s_%d", f.Migration, f.Shard)}.Sanitize() + "()"
}

// InstallSlotFence creates the fence on node. Creating the trigger waits for
// the transactions already writing to the table, so when it returns, no
// write to the fenced slots can commit on this shard any more: it is the
// barrier of a freeze. It retries short lock waits until ctx ends.
func (c *Cluster) InstallSlotFence(ctx context.Context, node string, f SlotFence) error {
	p, err := c.Admin(ctx, node, f.Tree.Tenant)
	if err != nil {
		return err
	}
	table := ShardTable(f.Tree, f.Shard)
	pred := func(rec string) string { return SlotPredicate(f.Tree, rec, f.Slots) }
	detail := fmt.Sprintf("moved to shard %d at epoch %d", f.Target, f.Epoch)
	body := `CREATE OR REPLACE FUNCTION ` + f.function() + ` RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
    IF current_setting('` + MigratorSetting + `', true) = 'on' THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF current_setting('` + SkipMovedSetting + `', true) = 'on'
        AND TG_OP IN ('UPDATE', 'DELETE') AND ` + pred("OLD") + ` THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'TRUNCATE'
        OR TG_OP IN ('INSERT', 'UPDATE') AND ` + pred("NEW") + `
        OR TG_OP IN ('UPDATE', 'DELETE') AND ` + pred("OLD") + ` THEN
        RAISE EXCEPTION USING ERRCODE = '` + FenceCode + `',
            MESSAGE = 'lattice: slot moved', DETAIL = ` + quoteLiteral(detail) + `;
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$fence$`
	stmts := []string{
		fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", fenceLockTimeout.Milliseconds()),
		fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, -1)", schemaLockClass),
		"CREATE SCHEMA IF NOT EXISTS " + fenceSchema,
		body,
		"DROP TRIGGER IF EXISTS " + quoteIdent(f.trigger()) + " ON " + table,
		"CREATE TRIGGER " + quoteIdent(f.trigger()) + " BEFORE INSERT OR UPDATE OR DELETE ON " + table +
			" FOR EACH ROW EXECUTE FUNCTION " + f.function(),
		"DROP TRIGGER IF EXISTS " + quoteIdent(f.trigger()+"_t") + " ON " + table,
		"CREATE TRIGGER " + quoteIdent(f.trigger()+"_t") + " BEFORE TRUNCATE ON " + table +
			" FOR EACH STATEMENT EXECUTE FUNCTION " + f.function(),
	}
	for {
		err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("pgshard: fence slots of shard %d on %s: %w", f.Shard, node, err)
			}
			return nil
		}
	}
}

// DropSlotFence removes a fence; a missing one is fine.
func (c *Cluster) DropSlotFence(ctx context.Context, node string, f SlotFence) error {
	p, err := c.Admin(ctx, node, f.Tree.Tenant)
	if err != nil {
		return err
	}
	table := ShardTable(f.Tree, f.Shard)
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
			return err
		}
		var stmts []string
		if exists {
			stmts = append(stmts, "DROP TRIGGER IF EXISTS "+quoteIdent(f.trigger())+" ON "+table,
				"DROP TRIGGER IF EXISTS "+quoteIdent(f.trigger()+"_t")+" ON "+table)
		}
		stmts = append(stmts, "DROP FUNCTION IF EXISTS "+f.function())
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgshard: drop fence of shard %d on %s: %w", f.Shard, node, err)
	}
	return nil
}
