package pgshard

import (
	"context"
	"fmt"
	"time"
)

// LockWait is a backend of a node waiting for a heavyweight lock, with the
// backends ahead of it: those holding a conflicting lock and those queued
// before it for one (pg_blocking_pids). A prepared transaction that holds
// the lock shows as pid 0, which is left out: it waits for nothing.
type LockWait struct {
	PID      uint32
	Blockers []uint32
	Since    time.Time // when its statement began
}

// LockWaits returns the backends of node, in any database, that have
// waited for a lock for longer than older. PostgreSQL warns that
// pg_blocking_pids takes the lock manager's locks for a moment: it runs
// only for backends already waiting.
func (c *Cluster) LockWaits(ctx context.Context, node string, older time.Duration) ([]LockWait, error) {
	p, err := c.Admin(ctx, node, c.DefaultTenant())
	if err != nil {
		return nil, err
	}
	rows, err := p.Query(ctx, `SELECT pid, pg_catalog.array_remove(pg_catalog.pg_blocking_pids(pid), 0), query_start
		FROM pg_catalog.pg_stat_activity
		WHERE wait_event_type = 'Lock' AND state = 'active' AND query_start < pg_catalog.now() - $1 * interval '1 microsecond'`,
		older.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("pgshard: lock waits on %s: %w", node, err)
	}
	defer rows.Close()
	var out []LockWait
	for rows.Next() {
		var w LockWait
		var pid int32
		var blockers []int32
		if err := rows.Scan(&pid, &blockers, &w.Since); err != nil {
			return nil, fmt.Errorf("pgshard: lock waits on %s: %w", node, err)
		}
		w.PID = uint32(pid)
		for _, b := range blockers {
			w.Blockers = append(w.Blockers, uint32(b))
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgshard: lock waits on %s: %w", node, err)
	}
	return out, nil
}
