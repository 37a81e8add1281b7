package pgshard

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// MigratorSetting, set to "on" in a transaction of the control role, lets
// the migrator's own cleanup of moved rows pass the slot fences.
const MigratorSetting = "lattice.migrator"

// MigratorBypass is the SQL condition under which a write is the
// migrator's own: MigratorSetting on, in a session that logged in as
// control, the node DSN's role. A tenant's role can set the setting (a
// function body may compute its name, out of the router's sight) but
// cannot log in as another role, and session_user, unlike current_user,
// stays the login role inside SECURITY DEFINER functions. The role is a
// literal: the condition runs for every row the migrator writes, and a
// name comparison costs nothing there. It is never NULL, so it serves in a
// trigger's WHEN clause too.
func MigratorBypass(control string) string {
	return "(current_setting('" + MigratorSetting + "', true) IS NOT DISTINCT FROM 'on' AND session_user = " + quoteLiteral(control) + ")"
}

// fenceLockTimeout is how long one attempt to install a fence waits for the
// writers already inside the table. Writers of the table's other slots queue
// behind the attempt, so it is kept short and retried instead.
const fenceLockTimeout = 50 * time.Millisecond

// SlotFence rejects writes to some slots of a shard table with sqlstate.SlotMoved:
// the slots moved (or are moving) to another shard.
type SlotFence struct {
	Migration string // names the trigger and its function
	Tree      *shardmap.Tree
	Shard     int      // the fenced shard table
	Slots     [][2]int // the fenced slots
	Target    int      // where they go, for the error detail
	Epoch     uint64
	// Handover, set for a migration's fence, keeps the shard's ownership
	// record true: arming takes the slots out of it and records where they
	// go (MovingTable), in the fence's own transaction.
	Handover *Handover
}

// Handover is what a migration's fence records besides the trigger.
type Handover struct {
	Kind       string // the migration's kind
	TargetNode string
	// GiveBack, on DropSlotFence, returns the slots to the ownership
	// record: a freeze rolled back. Otherwise the slots stay the target's.
	GiveBack bool
}

// MovingTable is the table in a shard schema that records the slots a
// migration's armed fence holds, from the fence's transaction to the one
// that drops it:
//
//	CREATE TABLE lattice_sNNNN.lattice_moving (
//	    migration   text NOT NULL,
//	    tree        text NOT NULL,      -- one row per table the migration fenced
//	    ...
//	    PRIMARY KEY (migration, tree)
//	    kind        text NOT NULL,
//	)
//
// A slot that no ownership record holds is in one of these rows. A
// colocation group's migration fences every member table of the shard,
// one row each (docs/DESIGN.md section 4.1).
const MovingTable = "lattice_moving"

func movingTableDDL(schema string) string {
	return "CREATE TABLE IF NOT EXISTS " + schema + "." + MovingTable + ` (
    migration   text NOT NULL,
    tree        text NOT NULL,
    kind        text NOT NULL,
    slots       int4multirange NOT NULL,
    target      int NOT NULL,
    target_node text NOT NULL,
    PRIMARY KEY (migration, tree)
)`
}

// movingTableUpgrade gives a MovingTable made before colocation groups
// moved (its primary key was the migration alone, so a group's second
// member table had no row) the key (migration, tree).
func movingTableUpgrade(schema string) string {
	table := quoteLiteral(schema + "." + MovingTable)
	return `DO $up$
DECLARE pk name;
BEGIN
    SELECT conname INTO pk FROM pg_catalog.pg_constraint
    WHERE conrelid = ` + table + `::regclass AND contype = 'p' AND array_length(conkey, 1) = 1;
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I, ADD PRIMARY KEY (migration, tree)', ` + table + `, pk);
    END IF;
END
$up$`
}

func (f SlotFence) trigger() string { return "lattice_fence_m_" + f.Migration }

// funcName is the fence's trigger function, without an argument list.
func (f SlotFence) funcName() string {
	// One function per fenced table: several tables of a node may be fenced
	// under one name (an empty-tree re-pin, a colocation group's members in
	// one shard schema), and each is dropped alone. Its body names the
	// table's key column, so a group's members need one each; the tree is
	// a hash so that the name fits 63 bytes.
	name := fmt.Sprintf("fence_m_%s_%d", f.Migration, f.Shard)
	if f.Tree.Group != "" {
		h := fnv.New32a()
		h.Write([]byte(f.Tree.Name))
		name += fmt.Sprintf("_%08x", h.Sum32())
	}
	return fenceSchema + "." + pgx.Identifier{name}.Sanitize()
}

func (f SlotFence) function() string { return f.funcName() + "()" }

// InstallSlotFence creates the fence on node: PrepareSlotFence, then
// ArmSlotFence.
func (c *Cluster) InstallSlotFence(ctx context.Context, node string, f SlotFence) error {
	if err := c.PrepareSlotFence(ctx, node, f); err != nil {
		return err
	}
	_, err := c.ArmSlotFence(ctx, node, f)
	return err
}

// PrepareSlotFence creates the fence's trigger function on node without
// attaching it. It takes no lock on the shard table, so the migrator runs it
// before a freeze and keeps it (and the node-wide advisory lock it takes)
// out of the write pause. It can run again.
func (c *Cluster) PrepareSlotFence(ctx context.Context, node string, f SlotFence) error {
	p, err := c.fencePool(ctx, node, f.Tree.Tenant)
	if err != nil {
		return err
	}
	pred := func(rec string) string { return btreeindex.SlotPredicate(f.Tree, rec, f.Slots) }
	// The epoch comes from the trigger's argument: it is only known once
	// the slots are frozen.
	detail := fmt.Sprintf("format('moved to shard %d at epoch %%s', TG_ARGV[0])", f.Target)
	body := `CREATE OR REPLACE FUNCTION ` + f.function() + ` RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
    IF ` + MigratorBypass(p.Config().ConnConfig.User) + ` THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'TRUNCATE'
        OR TG_OP IN ('INSERT', 'UPDATE') AND ` + pred("NEW") + `
        OR TG_OP IN ('UPDATE', 'DELETE') AND ` + pred("OLD") + ` THEN
        RAISE EXCEPTION USING ERRCODE = '` + sqlstate.SlotMoved + `',
            MESSAGE = 'lattice: slot moved', DETAIL = ` + detail + `;
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$fence$`
	// One simple-protocol query string runs as one implicit transaction.
	stmts := []string{
		// CREATE OR REPLACE FUNCTION and CREATE SCHEMA IF NOT EXISTS race
		// with themselves across sessions.
		fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, -1)", schemaLockClass),
		"CREATE SCHEMA IF NOT EXISTS " + fenceSchema,
		body,
	}
	if f.Handover != nil {
		// Out of the write pause, like the function.
		schema := quoteIdent(shardmap.SchemaName(f.Shard))
		stmts = append(stmts, movingTableDDL(schema), movingTableUpgrade(schema))
	}
	sql := strings.Join(stmts, ";\n")
	if _, err := p.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgshard: prepare fence of shard %d on %s: %w", f.Shard, node, err)
	}
	// The arm's connection opens now, before the pause. It is held only
	// while warmed: an arm of another migration, inside its pause, may
	// need it.
	ap, err := c.armPool(ctx, node, f.Tree.Tenant)
	if err != nil {
		return err
	}
	conn, err := ap.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgshard: prepare fence of shard %d on %s: %w", f.Shard, node, err)
	}
	defer conn.Release()
	c.warmArm(ctx, conn.Conn(), f)
	return nil
}

// warmArm loads the catalog caches an arm of f will read into the backend
// of conn, the arm pool's most recently used connection, which the arm
// most likely gets next. A backend's first arm reads pg_trigger, pg_proc,
// the multirange type and the tables' descriptors into its caches: 10 ms
// of CPU against 1.5 ms warm on a quiet machine, and inside the pause on
// a busy one the run queue multiplies it. So a connection's first prepare
// runs an arm's statements on a temporary table, and every prepare opens
// the tables the arm writes to, with locks that wait for no writer, all
// in one transaction that is rolled back. Its lock_timeout keeps a DDL
// statement on the shard from holding the prepare: a failure costs the
// arm its speed only.
func (c *Cluster) warmArm(ctx context.Context, conn *pgx.Conn, f SlotFence) {
	begin := time.Now()
	stmts := []string{"BEGIN", fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", fenceLockTimeout.Milliseconds())}
	_, warm := c.armWarm.Load(conn)
	if !warm {
		slots := quoteLiteral(multirange(f.Slots)) + "::int4multirange"
		stmts = append(stmts,
			"CREATE TEMP TABLE lattice_arm_warm (k int PRIMARY KEY, slots int4multirange, updated timestamptz)",
			"INSERT INTO lattice_arm_warm VALUES (1, "+slots+", now()) ON CONFLICT (k) DO NOTHING",
			"UPDATE lattice_arm_warm SET slots = slots - "+slots+", updated = now() WHERE k = 1",
			// After the writes: the fence's function reads the tree's key.
			"CREATE OR REPLACE TRIGGER lattice_arm_warm BEFORE INSERT OR UPDATE OR DELETE ON lattice_arm_warm FOR EACH ROW EXECUTE FUNCTION "+f.funcName()+"('0')",
			"CREATE OR REPLACE TRIGGER lattice_arm_warm_t BEFORE TRUNCATE ON lattice_arm_warm FOR EACH STATEMENT EXECUTE FUNCTION "+f.funcName()+"('0')",
			"SELECT pg_current_wal_lsn()::text")
		// Tried once per connection: one that cannot make a temporary
		// table would fail each time.
		c.armWarm.Store(conn, struct{}{})
	}
	schema := quoteIdent(shardmap.SchemaName(f.Shard))
	stmts = append(stmts, "SELECT FROM "+ShardTable(f.Tree, f.Shard)+" LIMIT 0", "SELECT FROM "+schema+"."+OwnerTable+" LIMIT 0")
	if f.Handover != nil {
		stmts = append(stmts, "SELECT FROM "+schema+"."+MovingTable+" LIMIT 0")
	}
	_, err := conn.PgConn().Exec(ctx, strings.Join(append(stmts, "ROLLBACK"), ";\n")).ReadAll()
	if err != nil {
		c.log.Debug("pgshard: arm connection not warmed", "shard", f.Shard, "first", !warm, "err", err)
		if conn.PgConn().TxStatus() != 'I' {
			// Stopped inside the transaction; the pool would close the
			// connection rather than hand it out in one.
			_, _ = conn.PgConn().Exec(ctx, "ROLLBACK").ReadAll()
		}
		return
	}
	c.log.Debug("pgshard: arm connection warmed", "shard", f.Shard, "first", !warm, "took", time.Since(begin))
}

// ArmSlotFence attaches a prepared fence to its shard table, in one round
// trip. Creating the triggers waits for the transactions already writing
// to the table, so when it returns, no write to the fenced slots can commit
// on this shard any more: it is the barrier of a freeze. It retries short
// lock waits until ctx ends.
//
// It returns the node's WAL position read under the fence's lock: every
// write to the fenced slots lies before it, and the fence's own commit
// (synchronous) has flushed the WAL past it, so a logical decoding stream
// can reach it at once rather than when the WAL writer next flushes.
func (c *Cluster) ArmSlotFence(ctx context.Context, node string, f SlotFence) (string, error) {
	return c.ArmSlotFences(ctx, node, []SlotFence{f})
}

// ArmSlotFences arms prepared fences of tables of one node in one
// transaction, as ArmSlotFence arms one: a colocation group's migration
// fences every member table of its source shard with one barrier and one
// WAL position (docs/DESIGN.md section 4.1).
func (c *Cluster) ArmSlotFences(ctx context.Context, node string, fs []SlotFence) (string, error) {
	if len(fs) == 0 {
		return "", errors.New("pgshard: no fence to arm")
	}
	p, err := c.armPool(ctx, node, fs[0].Tree.Tenant)
	if err != nil {
		return "", err
	}
	stmts := []string{
		fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", fenceLockTimeout.Milliseconds()),
		"SET LOCAL synchronous_commit = on",
	}
	for _, f := range fs {
		table := ShardTable(f.Tree, f.Shard)
		epoch := quoteLiteral(strconv.FormatUint(f.Epoch, 10))
		stmts = append(stmts,
			"CREATE OR REPLACE TRIGGER "+quoteIdent(f.trigger())+" BEFORE INSERT OR UPDATE OR DELETE ON "+table+
				" FOR EACH ROW EXECUTE FUNCTION "+f.funcName()+"("+epoch+")",
			"CREATE OR REPLACE TRIGGER "+quoteIdent(f.trigger()+"_t")+" BEFORE TRUNCATE ON "+table+
				" FOR EACH STATEMENT EXECUTE FUNCTION "+f.funcName()+"("+epoch+")")
		if f.Handover != nil {
			stmts = append(stmts, f.handoverSQL()...)
		}
	}
	sql := strings.Join(append(stmts, "SELECT pg_current_wal_lsn()::text"), ";\n")
	resent, lockWaits := false, 0
	var unanswered []uint32
	for {
		lsn, pid, broken, err := armOnce(ctx, p, sql)
		if broken {
			unanswered = append(unanswered, pid)
		}
		// A connection that broke while idle (never pinged) is closed by
		// the pool; the arm, which can run again, goes once more on
		// another.
		if broken && ctx.Err() == nil && !resent {
			resent = true
			continue
		}
		if !sqlstate.Is(err, sqlstate.LockNotAvailable) || ctx.Err() != nil {
			if err != nil {
				// The caller rolls the freeze back on this error: no arm
				// may commit after it.
				err = errors.Join(err, c.endArms(ctx, node, fs[0].Tree.Tenant, unanswered))
			}
			if err != nil && lockWaits > 0 && ctx.Err() != nil {
				return "", fmt.Errorf("pgshard: fence slots of shard %d on %s: transactions writing to the table held its lock through %d attempts of %s each, until the freeze's budget ended: %w",
					fs[0].Shard, node, lockWaits, fenceLockTimeout, err)
			}
			if err != nil {
				return "", fmt.Errorf("pgshard: fence slots of shard %d on %s: %w", fs[0].Shard, node, err)
			}
			return lsn, nil
		}
		lockWaits++
	}
}

// endArms ends the backends of arms whose connection was closed under
// them, and waits until they have exited. pgconn gives up a statement
// when its context ends by closing the connection, without a cancel, and
// a backend waiting for the table's lock notices that only when it next
// writes to the client: given the lock a moment later, it would commit
// the fence and hand the slots over after the freeze was rolled back, and
// the thawed slots' writes would meet the fence (LT001) with the source's
// ownership record short of them. Once the backend has exited, the arm
// has committed or never will, and the rollback's drop sees which.
func (c *Cluster) endArms(ctx context.Context, node, tenant string, pids []uint32) error {
	if len(pids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endArmTimeout)
	defer cancel()
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return fmt.Errorf("pgshard: end the fence's unanswered arm on %s: %w", node, err)
	}
	// pg_terminate_backend's own timeout waits for the exit; a pid that
	// has exited already is not in pg_stat_activity.
	var left int
	err = p.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT pg_terminate_backend(pid, $2))
FROM pg_catalog.pg_stat_activity WHERE pid = ANY ($1)`, pids, endArmTimeout.Milliseconds()/2).Scan(&left)
	if err == nil && left > 0 {
		err = errors.New("the backend did not exit")
	}
	if err != nil {
		return fmt.Errorf("pgshard: end the fence's unanswered arm on %s (pids %v): %w", node, pids, err)
	}
	return nil
}

// endArmTimeout bounds endArms, outside the freeze's budget, which has
// ended when it runs.
const endArmTimeout = 5 * time.Second

// handoverSQL takes the fenced slots out of the shard's ownership record
// and records where they go: from this transaction on the shard accepts no
// write for them, so the record says it does not own them. Arming again
// changes nothing.
func (f SlotFence) handoverSQL() []string {
	schema := quoteIdent(shardmap.SchemaName(f.Shard))
	slots := quoteLiteral(multirange(f.Slots)) + "::int4multirange"
	tree := quoteLiteral(f.Tree.Name)
	return []string{
		"INSERT INTO " + schema + "." + MovingTable + " (migration, tree, kind, slots, target, target_node) VALUES (" +
			quoteLiteral(f.Migration) + ", " + tree + ", " + quoteLiteral(f.Handover.Kind) + ", " + slots + ", " +
			strconv.Itoa(f.Target) + ", " + quoteLiteral(f.Handover.TargetNode) + ") ON CONFLICT (migration, tree) DO NOTHING",
		"UPDATE " + schema + "." + OwnerTable + " SET slots = slots - " + slots + ", updated = now() WHERE tree = " + tree,
	}
}

// armOnce runs the statements of ArmSlotFence as one simple query (one
// implicit transaction) and returns the value of the last one; broken says
// the error came with the connection's end, and pid names its backend,
// which may still be running the arm.
func armOnce(ctx context.Context, p *pgxpool.Pool, sql string) (lsn string, pid uint32, broken bool, err error) {
	conn, err := p.Acquire(ctx)
	if err != nil {
		return "", 0, false, err
	}
	defer conn.Release()
	pid = conn.Conn().PgConn().PID()
	res, err := conn.Conn().PgConn().Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", pid, conn.Conn().IsClosed(), err
	}
	if last := res[len(res)-1]; len(last.Rows) == 1 && len(last.Rows[0]) == 1 {
		return string(last.Rows[0][0]), pid, false, nil
	}
	return "", pid, false, errors.New("no WAL position in the reply")
}

// dropRetryMax caps the wait between attempts to drop a fence.
const dropRetryMax = time.Second

// dropLockTimeout is how long one attempt to drop a fence waits for the
// table's ACCESS EXCLUSIVE lock. The table serves its other slots, and
// every statement on it queues behind the waiting drop, so a point read
// is held at most this long by an attempt; the drop is not in a hurry.
const dropLockTimeout = 10 * time.Millisecond

// DropSlotFence removes a fence; a missing one is fine. Dropping a trigger
// takes the table's ACCESS EXCLUSIVE lock, which waits for every running
// statement on the shard, a long read included, and every later statement
// on the shard would queue behind that wait. So each attempt waits at most
// dropLockTimeout, and the attempts back off (up to dropRetryMax) to let
// the queued statements through, until ctx ends.
func (c *Cluster) DropSlotFence(ctx context.Context, node string, f SlotFence) error {
	p, err := c.Admin(ctx, node, f.Tree.Tenant)
	if err != nil {
		return err
	}
	err = RetryLockTimeouts(ctx, dropLockTimeout, dropRetryMax, func() error { return dropFenceOnce(ctx, p, f) })
	if err != nil {
		return fmt.Errorf("pgshard: drop fence of shard %d on %s: %w", f.Shard, node, err)
	}
	return nil
}

// RetryLockTimeouts runs attempt again while it fails for want of a lock
// (a lock_timeout, 55P03) and ctx lasts: at once when backoffMax is 0,
// else after a wait that starts at first and doubles up to backoffMax, to
// let the statements queued behind the attempt through. It returns the
// last attempt's error.
func RetryLockTimeouts(ctx context.Context, first, backoffMax time.Duration, attempt func() error) error {
	for wait := first; ; wait = min(2*wait, backoffMax) {
		err := attempt()
		if !sqlstate.Is(err, sqlstate.LockNotAvailable) || ctx.Err() != nil {
			return err
		}
		if backoffMax == 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// dropFenceOnce is one attempt of DropSlotFence: one transaction sent as
// one query string, so that the table's ACCESS EXCLUSIVE lock, which the
// triggers' drop takes, is held for no round trip to the proxy. The
// handover's rows go first, under no lock on the shard table; the function
// goes last, once nothing depends on it.
func dropFenceOnce(ctx context.Context, p *pgxpool.Pool, f SlotFence) error {
	conn, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	table := ShardTable(f.Tree, f.Shard)
	schema := quoteIdent(shardmap.SchemaName(f.Shard))
	var tableExists, movingExists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		table, schema+"."+MovingTable).Scan(&tableExists, &movingExists); err != nil {
		return err
	}
	stmts := []string{fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", dropLockTimeout.Milliseconds())}
	if f.Handover != nil && movingExists {
		stmts = append(stmts, dropHandoverSQL(f, schema))
	}
	if tableExists {
		stmts = append(stmts, "DROP TRIGGER IF EXISTS "+quoteIdent(f.trigger())+" ON "+table,
			"DROP TRIGGER IF EXISTS "+quoteIdent(f.trigger()+"_t")+" ON "+table)
	}
	stmts = append(stmts, "DROP FUNCTION IF EXISTS "+f.function())
	_, err = conn.Conn().PgConn().Exec(ctx, strings.Join(stmts, ";\n")).ReadAll()
	return err
}

// dropHandoverSQL deletes the fence's MovingTable row and, for a
// rolled-back freeze, gives its slots back to the ownership record. The row
// is what is given back, so a fence that was only prepared, or whose row a
// recovery already took, gives nothing. The fence's own table's row only:
// a colocation group's members are fenced and dropped table by table.
func dropHandoverSQL(f SlotFence, schema string) string {
	where := " WHERE migration = " + quoteLiteral(f.Migration) + " AND tree = " + quoteLiteral(f.Tree.Name)
	if !f.Handover.GiveBack {
		return "DELETE FROM " + schema + "." + MovingTable + where
	}
	return "WITH gone AS (DELETE FROM " + schema + "." + MovingTable + where + " RETURNING tree, slots)\n" +
		"UPDATE " + schema + "." + OwnerTable + " o SET slots = o.slots + gone.slots, updated = now() FROM gone WHERE o.tree = gone.tree"
}
