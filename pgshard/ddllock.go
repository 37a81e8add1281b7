package pgshard

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ddlLockClass is the first key of the advisory lock, on the catalog node
// in the tenant's database, that a tree's DDL holds from before its
// reshard check to the end of its log entry (the second key hashes the
// tree's name). It serialises DDL on one tree across proxies, and a
// migration's prepare waits for it (WaitTreeDDL) so that its target
// replays every statement that passed its check before the migration was
// recorded.
const ddlLockClass = 0x4c617432 // "Lat2"

// The lock is taken by trying it and trying again, never by a blocking
// pg_advisory_lock: a statement blocked in it holds a snapshot, and CREATE
// INDEX CONCURRENTLY, which holds the lock on a connection of its own
// while it runs, waits for every transaction of the database with an
// older snapshot; PostgreSQL would not see that cycle, and both would
// wait for ever.
const (
	ddlLockRetryFirst = 5 * time.Millisecond
	ddlLockRetryMax   = 200 * time.Millisecond
)

// retryDDLLock calls try until it reports the lock taken, backing off
// between tries, until ctx ends.
func retryDDLLock(ctx context.Context, try func() (bool, error)) error {
	for wait := ddlLockRetryFirst; ; wait = min(2*wait, ddlLockRetryMax) {
		ok, err := try()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(wait):
		}
	}
}

// beginTreeDDL begins a transaction on a connection of p, the catalog
// node's pool for the tree's tenant, that holds the tree's DDL lock to its
// end: each try is a transaction of its own, rolled back when the lock is
// taken elsewhere.
func beginTreeDDL(ctx context.Context, p *pgxpool.Pool, tree string) (*pgxpool.Conn, pgx.Tx, error) {
	var conn *pgxpool.Conn
	var tx pgx.Tx
	err := retryDDLLock(ctx, func() (bool, error) {
		c, err := p.Acquire(ctx)
		if err != nil {
			return false, err
		}
		t, err := c.Begin(ctx)
		if err != nil {
			c.Release()
			return false, err
		}
		var ok bool
		if err := t.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext($2))`, int32(ddlLockClass), tree).Scan(&ok); err != nil || !ok {
			_ = t.Rollback(context.WithoutCancel(ctx))
			c.Release()
			return false, err
		}
		conn, tx = c, t
		return true, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pgshard: lock tree %s for DDL: %w", tree, err)
	}
	return conn, tx, nil
}

// holdTreeDDL takes the tree's DDL lock for the session of a connection
// of its own to the catalog node, for a statement that runs outside a
// transaction (CREATE INDEX CONCURRENTLY), and returns the function that
// gives it back by closing the connection: the lock ends with the session,
// also when the proxy dies. The connection is not a pooled one, which the
// statement's own work on the catalog node may need.
func (c *Cluster) holdTreeDDL(ctx context.Context, tenant, tree string) (func(), error) {
	conn, err := c.connectConfig(ctx, c.Catalog().Name, tenant, nil)
	if err != nil {
		return nil, fmt.Errorf("pgshard: lock tree %s for DDL: %w", tree, err)
	}
	release := func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	err = retryDDLLock(ctx, func() (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, int32(ddlLockClass), tree).Scan(&ok)
		return ok, err
	})
	if err != nil {
		release()
		return nil, fmt.Errorf("pgshard: lock tree %s for DDL: %w", tree, err)
	}
	return release, nil
}

// holdCheckedTreeDDL takes d's tree's DDL lock for a statement that runs
// outside a transaction, then checks for a reshard under it: a migration
// recorded before the check refuses the statement, and one recorded after
// it waits for the log entry before it builds its target from the log.
func (c *Cluster) holdCheckedTreeDDL(ctx context.Context, store DDLStore, d TreeDDL) (func(), error) {
	unlock, err := c.holdTreeDDL(ctx, d.Tenant, d.Tree)
	if err != nil {
		return nil, err
	}
	if err := refuseDuringReshard(ctx, store, d); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// WaitTreeDDL waits until no DDL statement on the trees (of tenant) holds
// their DDL lock: one that passed its reshard check has then logged itself
// or failed, and one that takes the lock later meets whatever the caller
// recorded before (a migration) in its check.
func (c *Cluster) WaitTreeDDL(ctx context.Context, tenant string, trees []string) error {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return err
	}
	start, tries := time.Now(), 0
	err = retryDDLLock(ctx, func() (bool, error) {
		// An implicit transaction: every lock taken goes at its end.
		var ok bool
		err := p.QueryRow(ctx, `SELECT bool_and(pg_try_advisory_xact_lock($1, hashtext(t))) FROM unnest($2::text[]) t`, int32(ddlLockClass), trees).Scan(&ok)
		if tries++; err == nil && !ok && tries == 2 {
			c.log.Info("pgshard: waiting for DDL running on the trees before their new shard is made", "tenant", tenant, "trees", trees)
		}
		return ok, err
	})
	if tries > 1 && err == nil {
		c.log.Info("pgshard: DDL on the trees ended", "tenant", tenant, "trees", trees, "waited", time.Since(start).Round(time.Millisecond))
	}
	if err != nil {
		return fmt.Errorf("pgshard: wait for DDL on %v: %w", trees, err)
	}
	return nil
}
