package migrator

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// releaseRowsPerBlock is what a block range is sized by when the table's
// statistics cannot tell how many rows a block holds (never analyzed):
// about the rows of 80 bytes the benchmarks use.
const releaseRowsPerBlock = 64

// DeleteSlots deletes the rows of slots from a shard table, sweeping the
// table once in block ranges of about batch rows, each range one short
// transaction that passes the fence (`DELETE … WHERE ctid >= '(lo,0)' AND
// ctid < '(hi,0)' AND <slots>`, a TID range scan).
//
// The rows of the released slots no longer change (the fence refuses every
// write to them but the migrator's), so every one of them lies in the
// blocks the table had when the sweep began; the sweep still goes on past
// blocks added meanwhile until it reaches the table's end. The predicate
// names only the released slots, so no row the shard still owns is
// touched. A crash mid-sweep leaves some ranges done; the release runs the
// sweep again from the first block, which deletes the rest.
//
// It replaced `DELETE … WHERE ctid = ANY (ARRAY (SELECT ctid … LIMIT n))`,
// whose every batch scanned the table from its start again, past the rows
// the earlier batches had deleted.
//
// Each range runs with session_replication_role = replica when the control
// role may set it (a superuser, or GRANT SET ON PARAMETER): the fence's
// BEFORE row trigger then does not fire for these deletes at all. Firing it
// cost more than the delete itself, about 1.2 µs a row of the 80-byte rows
// of make bench, even when it returns at once on the migrator setting,
// because a BEFORE DELETE row trigger makes PostgreSQL fetch and lock each
// old row for it first (a WHEN clause on the trigger saves nothing: it is
// evaluated after that fetch). SET LOCAL ends with the range's
// transaction, so no other statement on the pooled connection, and no other
// session, runs without the fence. Trees have no triggers of their own
// (CREATE TRIGGER on a tree is refused), so the fence's is the only one
// skipped. Without the privilege the fence lets the deletes past on the
// migrator setting, as before.
func (c clusterNodes) DeleteSlots(ctx context.Context, t *shardmap.Tree, node string, shard int, slots [][2]int, batch int) error {
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	table := pgshard.ShardTable(t, shard)
	pred := btreeindex.SlotPredicate(t, "", slots)
	var blocks, perBatch int64
	var replica bool
	if err := p.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int8,
		CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN greatest(1, ($2 * c.relpages / c.reltuples)::int8) ELSE greatest(1, $2 / $3) END,
		has_parameter_privilege('session_replication_role', 'SET')
		FROM pg_class c WHERE c.oid = $1::regclass`, table, batch, releaseRowsPerBlock).Scan(&blocks, &perBatch, &replica); err != nil {
		return fmt.Errorf("migrator: release moved rows of shard %d: size: %w", shard, err)
	}
	settings := releaseSettings(replica)
	for lo := int64(0); ; lo += perBatch {
		if lo >= blocks {
			// Blocks added since the size was read hold none of the
			// released rows, but the sweep is cheap there and leaves no
			// doubt: it ends at the table's end as it is now.
			if err := p.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int8`, table).Scan(&blocks); err != nil {
				return fmt.Errorf("migrator: release moved rows of shard %d: size: %w", shard, err)
			}
			if lo >= blocks {
				return nil
			}
		}
		// One simple query, one implicit transaction: a round trip a range.
		q := fmt.Sprintf("%s; DELETE FROM %s WHERE ctid >= '(%d,0)' AND ctid < '(%d,0)' AND %s", settings, table, lo, lo+perBatch, pred)
		if _, err := p.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("migrator: release moved rows of shard %d: %w", shard, err)
		}
		if lo == 0 && perBatch < blocks {
			crashPoint("sweep")
		}
	}
}

// releaseSettings is what one range of the release sets for its own
// transaction: the migrator setting the fence lets past, and, when the role
// may, replica mode, in which the fence's trigger does not fire at all. It
// goes in the range's simple query, before its DELETE.
func releaseSettings(replica bool) string {
	s := "SET LOCAL " + pgshard.MigratorSetting + " = 'on'"
	if replica {
		s += "; SET LOCAL session_replication_role = replica"
	}
	return s
}
