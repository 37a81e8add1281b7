package pgshard

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Blocker is a long transaction on a node that a migration's step would
// wait for: a session (Pid set) or a prepared transaction (GID set).
type Blocker struct {
	Pid         int32
	GID         string
	BackendType string // "client backend", "autovacuum worker", ...
	State       string // pg_stat_activity's state: "idle in transaction", "active", ...
	Application string
	Age         time.Duration // since the transaction began (or was prepared)
}

func (x Blocker) String() string {
	if x.GID != "" {
		return fmt.Sprintf("prepared transaction %q, prepared %s ago", x.GID, x.Age.Round(time.Second))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", x.Pid)
	if x.BackendType != "" && x.BackendType != "client backend" {
		fmt.Fprintf(&b, " (%s)", x.BackendType)
	}
	if x.Application != "" {
		fmt.Fprintf(&b, " application %q", x.Application)
	}
	state := x.State
	if state == "" {
		state = "in a transaction"
	}
	fmt.Fprintf(&b, ", %s, its transaction began %s ago", state, x.Age.Round(time.Second))
	return b.String()
}

// armConflicts are the table lock modes that conflict with the SHARE ROW
// EXCLUSIVE lock CREATE TRIGGER takes: a fence's arm waits for every
// transaction holding one of them on the shard table, writers included.
// Dropping the trigger takes ACCESS EXCLUSIVE, which every mode conflicts
// with, readers' included.
var armConflicts = []string{"RowExclusiveLock", "ShareUpdateExclusiveLock", "ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"}

// maxBlockers bounds how many blockers a look reports.
const maxBlockers = 5

// ArmBlockers returns the transactions on node that began more than older
// ago and hold a lock on a shard table of fs that the fences' arm would
// wait for, oldest first. A fence is armed inside the write pause and
// waits for all of them; a transaction that is already older than the
// pause may last would only make the freeze pause writes and roll back, so
// the migrator looks before it freezes. Autovacuum counts: its lock
// conflicts too, and PostgreSQL cancels it only for a lock wait longer
// than deadlock_timeout, which the arm's lock_timeout never reaches.
func (c *Cluster) ArmBlockers(ctx context.Context, node string, fs []SlotFence, older time.Duration) ([]Blocker, error) {
	return c.tableBlockers(ctx, node, fs, older, armConflicts)
}

// DropBlockers is ArmBlockers for the removal of the fences, which waits
// for a transaction holding any lock on the tables, a reader's too.
func (c *Cluster) DropBlockers(ctx context.Context, node string, fs []SlotFence, older time.Duration) ([]Blocker, error) {
	return c.tableBlockers(ctx, node, fs, older, nil)
}

// tableBlockers returns the transactions older than older that hold a
// lock on a table of fs in one of modes (nil: any).
func (c *Cluster) tableBlockers(ctx context.Context, node string, fs []SlotFence, older time.Duration, modes []string) ([]Blocker, error) {
	if len(fs) == 0 {
		return nil, nil
	}
	p, err := c.Admin(ctx, node, fs[0].Tree.Tenant)
	if err != nil {
		return nil, err
	}
	tables := make([]string, len(fs))
	for i, f := range fs {
		tables[i] = ShardTable(f.Tree, f.Shard)
	}
	// A prepared transaction's locks have no pid; the lock on its own xid,
	// in the same virtual transaction, names it.
	return queryBlockers(ctx, p, fmt.Sprintf("look for long transactions on shard %d on %s", fs[0].Shard, node), `
SELECT coalesce(a.pid, 0), coalesce(x.gid, ''), coalesce(a.backend_type, ''), coalesce(a.state, ''),
       coalesce(a.application_name, ''), extract(epoch FROM now() - min(coalesce(a.xact_start, x.prepared)))::float8
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_locks xl ON l.pid IS NULL AND xl.pid IS NULL AND xl.locktype = 'transactionid' AND xl.virtualtransaction = l.virtualtransaction
LEFT JOIN pg_prepared_xacts x ON x.transaction = xl.transactionid
WHERE l.locktype = 'relation' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = ANY (SELECT to_regclass(t) FROM unnest($1::text[]) t)
  AND ($3::text[] IS NULL OR l.mode = ANY ($3))
  AND l.pid IS DISTINCT FROM pg_backend_pid()
  AND coalesce(a.xact_start, x.prepared) < now() - make_interval(secs => $2)
GROUP BY 1, 2, 3, 4, 5
ORDER BY 6 DESC
LIMIT `+fmt.Sprint(maxBlockers), tables, older.Seconds(), modes)
}

// SlotBlockers returns the transactions on node that the creation of the
// logical replication slot named slot is waiting for, if it is. Building
// a slot's snapshot waits for every transaction that held a transaction
// id when it began, in any database, one after another: a session left
// idle in a transaction, or a prepared transaction no one resolves, holds
// a migration's shadow copy back for as long as it lasts. A prepared
// transaction has no pid; the slot's walsender waits on its xid.
func (c *Cluster) SlotBlockers(ctx context.Context, node, tenant, slot string) ([]Blocker, error) {
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return nil, err
	}
	return queryBlockers(ctx, p, "look for what the replication slot on "+node+" waits for", `
WITH waited AS (
  SELECT l.transactionid FROM pg_replication_slots s JOIN pg_locks l ON l.pid = s.active_pid
  WHERE s.slot_name = $1 AND NOT l.granted AND l.locktype = 'transactionid')
SELECT a.pid, '', coalesce(a.backend_type, ''), coalesce(a.state, ''), coalesce(a.application_name, ''),
       coalesce(extract(epoch FROM now() - a.xact_start), 0)::float8
FROM waited w JOIN pg_locks h ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid AND h.granted
JOIN pg_stat_activity a ON a.pid = h.pid
UNION ALL
SELECT 0, x.gid, '', '', '', extract(epoch FROM now() - x.prepared)::float8
FROM waited w JOIN pg_prepared_xacts x ON x.transaction = w.transactionid
LIMIT `+fmt.Sprint(maxBlockers), slot)
}

// queryBlockers runs a query whose rows are blockers: pid, gid, backend
// type, state, application and age in seconds.
func queryBlockers(ctx context.Context, p *pgxpool.Pool, what, sql string, args ...any) ([]Blocker, error) {
	rows, err := p.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("pgshard: %s: %w", what, err)
	}
	blockers, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Blocker, error) {
		var b Blocker
		var age float64
		err := row.Scan(&b.Pid, &b.GID, &b.BackendType, &b.State, &b.Application, &age)
		b.Age = time.Duration(age * float64(time.Second))
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgshard: %s: %w", what, err)
	}
	return blockers, nil
}
