package migrator

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// The write log of a move's target (docs/DESIGN.md 5.5) keeps, for each key
// of the moving slots that a client writes on the target from the flip
// until the release, the row as it was before that first write (or that
// there was none). The target's rows as of the flip are then the rows it
// holds now, with each logged key's row replaced by its logged image; a
// run that lost the freeze's snapshots in a crash compares those with the
// source's fenced rows, which have not changed since the fence.
//
// One table, function and AFTER ROW trigger per target table:
//
//	CREATE TABLE lattice_sNNNN.lattice_written_m_<id>[_<tree hash>] (
//	    key     text PRIMARY KEY,  -- ROW(<primary key>)::text
//	    slot    int NOT NULL,
//	    existed bool NOT NULL,     -- the key had a row at the flip
//	    old     text               -- that row, as the text of its row type
//	)
//
// The row is kept as text, not as the table's row type, so that nothing
// depends on the target table's type: dropping the table (an abandoned
// resize, a recovery) stays a plain DROP TABLE. The text is written and
// read back under the same settings (rowTextSettings), so it round-trips.
//
// An AFTER trigger, so that an upsert that updates logs the row it
// updated, not an insert. The stream's and the repair's writes set
// pgshard.MigratorSetting as the control role (pgshard.MigratorBypass) and
// are not logged: the stream only writes before the flip, and a repair
// writes the source's rows. A tenant's write that sets it is logged.

// writeLogLockTimeout bounds each attempt to attach the trigger, which
// waits for the writers inside the target table (a fold survivor has
// clients); attempts repeat until ctx ends. Dropping it, at the release,
// waits for the readers too, which queue behind the attempt: each waits
// at most writeLogDropLockTimeout, and the attempts back off up to
// dropBackoffMax.
const (
	writeLogLockTimeout     = 50 * time.Millisecond
	writeLogDropLockTimeout = 10 * time.Millisecond
	dropBackoffMax          = time.Second
)

// errNoWriteLog: the target holds no write log for the move (verification
// was off when it froze, or an older build froze it).
var errNoWriteLog = errors.New("the target holds no write log of the move")

// writeLogName names the log table, its function and its trigger.
func writeLogName(t *shardmap.Tree, mig *shardmap.Migration) string {
	name := "lattice_written_m_" + mig.ID
	if t.Group != "" {
		h := fnv.New32a()
		h.Write([]byte(t.Name))
		name += fmt.Sprintf("_%08x", h.Sum32())
	}
	return name
}

func writeLogTable(t *shardmap.Tree, mig *shardmap.Migration) string {
	return pgx.Identifier{shardmap.SchemaName(mig.Target), writeLogName(t, mig)}.Sanitize()
}

// recordKey is the key text of record rec: what keyExpr gives for a row.
func recordKey(rec string, pkey []string) string {
	q := make([]string, len(pkey))
	for i, k := range pkey {
		q[i] = rec + "." + pgx.Identifier{k}.Sanitize()
	}
	return "ROW(" + strings.Join(q, ", ") + ")::text"
}

// writeLogSQL creates t's log on the target: the table, and the trigger
// function, whose SET clauses fix the key's and the row's text as the
// comparison's transaction does (SECURITY DEFINER: the client's role may
// not write the log).
func writeLogSQL(t *shardmap.Tree, mig *shardmap.Migration, pkey []string) []string {
	log := writeLogTable(t, mig)
	fn := pgx.Identifier{shardmap.SchemaName(mig.Target), writeLogName(t, mig)}.Sanitize()
	logRow := func(rec, existed, old string) string {
		return "INSERT INTO " + log + " (key, slot, existed, old) VALUES (" + recordKey(rec, pkey) + ", " +
			btreeindex.SlotExpr(t, rec) + ", " + existed + ", " + old + ") ON CONFLICT (key) DO NOTHING;"
	}
	pred := func(rec string) string { return btreeindex.SlotPredicate(t, rec, mig.Slots) }
	return []string{
		"CREATE TABLE IF NOT EXISTS " + log + " (key text PRIMARY KEY, slot int NOT NULL, existed bool NOT NULL, old text)",
		`CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog ` + settingsSQL(true) + ` AS $w$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND ` + pred("OLD") + ` THEN
        ` + logRow("OLD", "true", "OLD::text") + `
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND ` + pred("NEW") + ` THEN
        ` + logRow("NEW", "false", "NULL") + `
    END IF;
    RETURN NULL;
END
$w$`,
	}
}

// PrepareWriteLog implements VerifyNodes: before the pause, so that the
// log is there when the flip lets clients write the target.
func (c clusterNodes) PrepareWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error {
	conn, err := c.targetConn(ctx, ts, mig)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, t := range ts {
		table := pgshard.ShardTable(t, mig.Target)
		var attached bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)",
			table, writeLogName(t, mig)).Scan(&attached); err != nil {
			return fmt.Errorf("migrator: write log of %s: %w", table, err)
		}
		if attached {
			continue // an earlier freeze of the move made it
		}
		_, pkey, err := tableColumns(ctx, conn.Conn(), table)
		if err != nil {
			return err
		}
		stmts := append(writeLogSQL(t, mig, pkey),
			"CREATE OR REPLACE TRIGGER "+pgx.Identifier{writeLogName(t, mig)}.Sanitize()+" AFTER INSERT OR UPDATE OR DELETE ON "+table+
				" FOR EACH ROW WHEN (NOT "+pgshard.MigratorBypass(conn.Conn().Config().User)+") EXECUTE FUNCTION "+
				pgx.Identifier{shardmap.SchemaName(mig.Target), writeLogName(t, mig)}.Sanitize()+"()")
		if err := execLocked(ctx, conn.Conn(), writeLogLockTimeout, 0, stmts); err != nil {
			return fmt.Errorf("migrator: write log of %s on %s: %w", table, mig.TargetNode, err)
		}
	}
	return nil
}

// DropWriteLog implements VerifyNodes: the release's, once the move is
// verified; missing pieces are fine. The trigger goes alone, in a
// transaction of its own: its drop takes the target table's ACCESS
// EXCLUSIVE lock, and the table serves clients since the flip, whose
// statements queue behind the lock; the function and the log table follow
// under no lock on the shard table.
func (c clusterNodes) DropWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error {
	conn, err := c.targetConn(ctx, ts, mig)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, t := range ts {
		table := pgshard.ShardTable(t, mig.Target)
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
			return err
		}
		if exists {
			drop := []string{"DROP TRIGGER IF EXISTS " + pgx.Identifier{writeLogName(t, mig)}.Sanitize() + " ON " + table}
			if err := execLocked(ctx, conn.Conn(), writeLogDropLockTimeout, dropBackoffMax, drop); err != nil {
				return fmt.Errorf("migrator: drop write log of %s on %s: %w", table, mig.TargetNode, err)
			}
		}
		rest := []string{
			"DROP FUNCTION IF EXISTS " + pgx.Identifier{shardmap.SchemaName(mig.Target), writeLogName(t, mig)}.Sanitize() + "()",
			"DROP TABLE IF EXISTS " + writeLogTable(t, mig)}
		if err := execLocked(ctx, conn.Conn(), writeLogLockTimeout, 0, rest); err != nil {
			return fmt.Errorf("migrator: drop write log of %s on %s: %w", table, mig.TargetNode, err)
		}
	}
	return nil
}

// execLocked runs stmts in one transaction, sent as one query string, with
// lock_timeout timeout, again while the lock is not granted in time
// (pgshard.RetryLockTimeouts: at once when backoffMax is 0, else backing
// off from timeout up to backoffMax).
func execLocked(ctx context.Context, c *pgx.Conn, timeout, backoffMax time.Duration, stmts []string) error {
	sql := fmt.Sprintf("SET LOCAL lock_timeout = '%dms';\n", timeout.Milliseconds()) + strings.Join(stmts, ";\n")
	return pgshard.RetryLockTimeouts(ctx, timeout, backoffMax, func() error {
		_, err := c.PgConn().Exec(ctx, sql).ReadAll()
		return err
	})
}

// loggedComparison compares a move as of its flip without the freeze's
// snapshots: the source's moving rows as they are (fenced since before the
// flip), the target's rebuilt from its write log, each side in one
// REPEATABLE READ transaction, so the target's rows and log agree.
type loggedComparison struct {
	nodes   clusterNodes
	trees   []*shardmap.Tree
	mig     *shardmap.Migration
	timeout time.Duration
}

// OpenWriteLog implements VerifyNodes.
func (c clusterNodes) OpenWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, timeout time.Duration) (Comparison, error) {
	return &loggedComparison{nodes: c, trees: ts, mig: mig, timeout: timeout}, nil
}

// flipImage is the target's rows of t as of the flip: those no client
// wrote since, and the logged image of each key that had a row.
func flipImage(t *shardmap.Tree, mig *shardmap.Migration, pkey []string) string {
	table, log := pgshard.ShardTable(t, mig.Target), writeLogTable(t, mig)
	return "(SELECT x.* FROM " + table + " x WHERE NOT EXISTS (SELECT FROM " + log + " w WHERE w.key = " + recordKey("x", pkey) + ")" +
		" UNION ALL SELECT (w.old::" + table + ").* FROM " + log + " w WHERE w.existed)"
}

func (l *loggedComparison) Compare(ctx context.Context) (*shardmap.Verification, error) {
	tenant := l.trees[0].Tenant
	src, err := l.nodes.connectTenant(ctx, l.mig.SourceNode, tenant)
	if err != nil {
		return nil, err
	}
	defer src.Close(context.Background())
	tgt, err := l.nodes.connectTenant(ctx, l.mig.TargetNode, tenant)
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.Background())
	for _, c := range []*pgx.Conn{src, tgt} {
		if err := beginCompare(ctx, c, "", l.timeout); err != nil {
			return nil, err
		}
	}
	v, err := compareAsOfFlip(ctx, src, tgt, l.trees, l.mig)
	if err != nil {
		return nil, err
	}
	v.FromLog = true
	return v, nil
}

// flipSide is the target side of t's comparison on tgt, whose transaction
// sees both the table and its write log: the rows as of the flip.
func flipSide(ctx context.Context, tgt *pgx.Conn, t *shardmap.Tree, mig *shardmap.Migration) (side, error) {
	table := pgshard.ShardTable(t, mig.Target)
	var logged bool
	if err := tgt.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", writeLogTable(t, mig)).Scan(&logged); err != nil {
		return side{}, err
	}
	if !logged {
		return side{}, fmt.Errorf("migrator: %s: %w", table, errNoWriteLog)
	}
	// Under the same snapshot, an empty log means no client wrote the
	// moving slots since the flip: the rows as of the flip are the table's,
	// read without probing the log for every row.
	var written bool
	if err := tgt.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+writeLogTable(t, mig)+")").Scan(&written); err != nil {
		return side{}, err
	}
	if !written {
		return side{conn: tgt, table: table}, nil
	}
	_, pkey, err := tableColumns(ctx, tgt, table)
	if err != nil {
		return side{}, err
	}
	return side{conn: tgt, table: table, from: flipImage(t, mig, pkey)}, nil
}

// WrittenSince lists the logged keys of slots: every key a client wrote
// since the flip, once the slots are frozen.
func (l *loggedComparison) WrittenSince(ctx context.Context, slots []int) ([]shardmap.RowDiff, error) {
	return l.nodes.loggedKeys(ctx, l.trees, l.mig, slots)
}

// loggedKeys lists the keys of slots in the target's write logs of ts.
func (c clusterNodes) loggedKeys(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, slots []int) ([]shardmap.RowDiff, error) {
	tgt, err := c.connectTenant(ctx, mig.TargetNode, ts[0].Tenant)
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.Background())
	var out []shardmap.RowDiff
	for _, t := range ts {
		rows, err := tgt.Query(ctx, "SELECT slot, key FROM "+writeLogTable(t, mig)+" WHERE slot = ANY ($1) ORDER BY slot, key", slots)
		if err != nil {
			return nil, err
		}
		var d shardmap.RowDiff
		if _, err := pgx.ForEachRow(rows, []any{&d.Slot, &d.Key}, func() error {
			out = append(out, shardmap.RowDiff{Slot: d.Slot, Key: d.Key, Tree: rowTree(t)})
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (l *loggedComparison) Close() {}

// withMigratorSetting is dsn with pgshard.MigratorSetting on for the whole
// session, as a startup parameter: the stream's target connection, whose
// writes the write log leaves out.
func withMigratorSetting(dsn string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("migrator: parse the target's DSN") // url.Error quotes the password
		}
		q := u.Query()
		q.Set(pgshard.MigratorSetting, "on")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " " + pgshard.MigratorSetting + "=on", nil
}

// compareAsOfFlip compares every table of mig: the source's fenced rows
// against the target's rows as of the flip, read through its write log.
func compareAsOfFlip(ctx context.Context, src, tgt *pgx.Conn, trees []*shardmap.Tree, mig *shardmap.Migration) (*shardmap.Verification, error) {
	var v *shardmap.Verification
	for _, t := range trees {
		tgtSide, err := flipSide(ctx, tgt, t, mig)
		if err != nil {
			return nil, err
		}
		got, err := compareSlots(ctx, t, mig, side{conn: src, table: pgshard.ShardTable(t, mig.Source)}, tgtSide, mig.Slots)
		if err != nil {
			return nil, err
		}
		v = addVerification(v, got)
	}
	v.Exact = true
	return v, nil
}

// targetConn is a control connection to mig's target node, for its write log.
func (c clusterNodes) targetConn(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) (*pgxpool.Conn, error) {
	p, err := c.Admin(ctx, mig.TargetNode, ts[0].Tenant)
	if err != nil {
		return nil, err
	}
	return p.Acquire(ctx)
}
