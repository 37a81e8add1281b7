package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// The functions of moves' verification, beside those of functions.go.
func init() {
	signatures["lattice_verify"] = []pgproto3.FieldDescription{
		field("shard", pgtype.Int4OID), field("node", pgtype.TextOID), field("slot", pgtype.Int4OID),
		field("rows", pgtype.Int8OID), field("owner", pgtype.Int4OID), field("status", pgtype.TextOID),
	}
	signatures["lattice_repair_migration"] = []pgproto3.FieldDescription{field("lattice_repair_migration", pgtype.TextOID)}
	argNames["lattice_verify"] = []string{"tree", "repair"}
	argNames["lattice_repair_migration"] = []string{"migration"}
}

// Status of a (shard, slot) in lattice_verify.
const (
	VerifyOwned    = "owned"    // the shard owns the slot
	VerifyExpected = "expected" // a migration in flight moves the slot from or to the shard
	VerifyStray    = "stray"    // rows the map does not account for
	VerifyRemoved  = "removed"  // stray rows that had a copy on the owner, deleted by repair => true
)

// maxStrayRepair bounds the stray rows one lattice_verify(repair => true)
// reads and deletes.
const maxStrayRepair = 100000

// callVerify runs the functions of this file; ok false for other names.
func (f *Functions) callVerify(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	switch name {
	case "lattice_verify":
		a, err := bindArgs(name, args, named, argNames[name]...)
		if err != nil {
			return nil, true, err
		}
		tree, err := required(a, "tree")
		if err != nil {
			return nil, true, err
		}
		repair, err := optionalBool(a, "repair")
		if err != nil {
			return nil, true, err
		}
		rows, err := f.VerifyTree(ctx, tenant, foldName(tree), repair)
		return rows, true, err
	case "lattice_repair_migration":
		a, err := bindArgs(name, args, named, argNames[name]...)
		if err != nil {
			return nil, true, err
		}
		id, err := required(a, "migration")
		if err != nil {
			return nil, true, err
		}
		msg, err := f.RepairMigration(ctx, tenant, id)
		if err != nil {
			return nil, true, err
		}
		return [][]any{{msg}}, true, nil
	}
	return nil, false, nil
}

func optionalBool(a map[string]*string, name string) (bool, error) {
	v := a[name]
	if v == nil {
		return false, nil
	}
	switch strings.ToLower(strings.TrimSpace(*v)) {
	case "t", "true", "on", "yes", "1":
		return true, nil
	case "f", "false", "off", "no", "0":
		return false, nil
	}
	return false, sqlstate.New(sqlstate.InvalidParameterValue, "argument %s must be a boolean, got %q", name, *v)
}

// RepairMigration is lattice_repair_migration: the tenant's migration id in
// verify_failed is repaired (Runner.Repair).
func (f *Functions) RepairMigration(ctx context.Context, tenant, id string) (string, error) {
	trees, err := f.store.Trees(ctx, tenant)
	if err != nil {
		return "", err
	}
	for _, t := range trees {
		migs, err := f.store.Migrations(ctx, tenant, t.MapName())
		if err != nil {
			return "", err
		}
		for _, mig := range migs {
			if mig.ID != id {
				continue
			}
			msg, err := f.coord.runner.Repair(ctx, mig)
			if f.cache != nil {
				// The repair froze and thawed slots.
				if _, rerr := f.cache.Refresh(ctx, tenant); rerr != nil && err == nil {
					err = rerr
				}
			}
			return msg, err
		}
	}
	e := sqlstate.New(sqlstate.UndefinedObject, "migration %q does not exist", id)
	e.Hint = "lattice_reshard_status(tree) names a migration whose verification failed"
	return "", e
}

// VerifyTree is lattice_verify: each shard's rows per slot, and whether
// the map accounts for them. With repair, stray rows whose key the slot's
// owner also holds are deleted (at most maxStrayRepair a call).
func (f *Functions) VerifyTree(ctx context.Context, tenant, tree string, repair bool) ([][]any, error) {
	t, err := f.store.Tree(ctx, tenant, tree)
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", tree)
	}
	if err != nil {
		return nil, err
	}
	m, err := f.store.Map(ctx, tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	migs, err := f.store.Migrations(ctx, tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	expected := map[int][][2]int{} // shard -> slots a migration in flight may leave or bring there
	for _, mig := range inFlight(migs) {
		expected[mig.Source] = append(expected[mig.Source], mig.Slots...)
		expected[mig.Target] = append(expected[mig.Target], mig.Slots...)
	}
	idx := make([]int, 0, len(m.Shards))
	for i, sh := range m.Shards {
		// A retired donor's table is gone once its fold released it.
		if sh.State != shardmap.ShardRetired || len(expected[i]) > 0 {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	timeout := f.coord.runner.opts.VerifyTimeout
	var rows [][]any
	budget := maxStrayRepair
	for _, i := range idx {
		sh := m.Shards[i]
		counts, err := f.slotCounts(ctx, t, i, sh.Node, timeout)
		if err != nil {
			return nil, err
		}
		for _, c := range counts {
			owner := m.Slots[c.slot]
			status := VerifyOwned
			switch {
			case owner == i:
			case inRanges(c.slot, expected[i]):
				status = VerifyExpected
			default:
				status = VerifyStray
				if repair && budget > 0 {
					n, err := f.removeStrays(ctx, t, i, sh.Node, owner, m.Shards[owner].Node, c.slot, min(budget, int(c.rows)))
					if err != nil {
						return nil, err
					}
					budget -= n
					if n > 0 {
						rows = append(rows, []any{int32(i), sh.Node, int32(c.slot), int64(n), int32(owner), VerifyRemoved})
					}
					c.rows -= int64(n)
				}
			}
			if c.rows > 0 {
				rows = append(rows, []any{int32(i), sh.Node, int32(c.slot), c.rows, int32(owner), status})
			}
		}
	}
	return rows, nil
}

func inRanges(slot int, rg [][2]int) bool {
	return slices.ContainsFunc(rg, func(r [2]int) bool { return slot >= r[0] && slot <= r[1] })
}

type slotCount struct {
	slot int
	rows int64
}

// readTx runs fn in a read-only transaction on node bounded by timeout.
func (f *Functions) readTx(ctx context.Context, node, tenant string, timeout int64, write bool, fn func(pgx.Tx) error) error {
	p, err := f.cluster.Admin(ctx, node, tenant)
	if err != nil {
		return err
	}
	mode := pgx.ReadOnly
	if write {
		mode = pgx.ReadWrite
	}
	return pgx.BeginTxFunc(ctx, p, pgx.TxOptions{AccessMode: mode}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", timeout)); err != nil {
			return err
		}
		return fn(tx)
	})
}

// slotCounts counts a shard's rows per slot.
func (f *Functions) slotCounts(ctx context.Context, t *shardmap.Tree, idx int, node string, timeout time.Duration) ([]slotCount, error) {
	var out []slotCount
	err := f.readTx(ctx, node, t.Tenant, timeout.Milliseconds(), false, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, fmt.Sprintf("SELECT %s AS slot, count(*) FROM %s x GROUP BY 1 ORDER BY 1",
			btreeindex.SlotExpr(t, "x"), pgshard.ShardTable(t, idx)))
		if err != nil {
			return err
		}
		for rows.Next() {
			var c slotCount
			if err := rows.Scan(&c.slot, &c.rows); err != nil {
				return err
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("lattice_verify: shard %d on %s: %w", idx, node, err)
	}
	return out, nil
}

// removeStrays deletes up to limit rows of slot from shard idx whose key
// the owner holds too, and returns how many it deleted. A stray without a
// copy is left for the operator: it may be the only copy of a write.
func (f *Functions) removeStrays(ctx context.Context, t *shardmap.Tree, idx int, node string, owner int, ownerNode string, slot, limit int) (int, error) {
	timeout := f.coord.runner.opts.VerifyTimeout.Milliseconds()
	pred := btreeindex.SlotPredicate(t, "x", [][2]int{{slot, slot}})
	var keys []string
	err := f.readTx(ctx, node, t.Tenant, timeout, false, func(tx pgx.Tx) error {
		key, err := txKeyExpr(ctx, tx, pgshard.ShardTable(t, idx))
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, fmt.Sprintf("SELECT %s FROM %s x WHERE %s LIMIT %d", key, pgshard.ShardTable(t, idx), pred, limit))
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil || len(keys) == 0 {
		return 0, err
	}
	var copied []string
	err = f.readTx(ctx, ownerNode, t.Tenant, timeout, false, func(tx pgx.Tx) error {
		key, err := txKeyExpr(ctx, tx, pgshard.ShardTable(t, owner))
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, fmt.Sprintf("SELECT %s FROM %s x WHERE %s AND %s = ANY($1)", key, pgshard.ShardTable(t, owner), pred, key), keys)
		if err != nil {
			return err
		}
		copied, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil || len(copied) == 0 {
		return 0, err
	}
	var n int
	err = f.readTx(ctx, node, t.Tenant, timeout, true, func(tx pgx.Tx) error {
		// The stray's slot may be fenced on this shard.
		if _, err := tx.Exec(ctx, "SET LOCAL "+pgshard.MigratorSetting+" = 'on'"); err != nil {
			return err
		}
		key, err := txKeyExpr(ctx, tx, pgshard.ShardTable(t, idx))
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s x WHERE %s AND %s = ANY($1)", pgshard.ShardTable(t, idx), pred, key), copied)
		n = int(tag.RowsAffected())
		return err
	})
	return n, err
}

// txKeyExpr is keyExpr in a transaction.
func txKeyExpr(ctx context.Context, tx pgx.Tx, table string) (string, error) {
	return keyExpr(ctx, tx.Conn(), table)
}
