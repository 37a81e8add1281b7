package pgshard

import (
	"context"
	"errors"
	"fmt"
)

// ErrTooManyHeld is returned when a node already has MaxHeld held backends.
var ErrTooManyHeld = errors.New("too many backends held by sessions")

// AcquireHeld takes a backend that one session keeps for itself across
// transactions (a LISTEN connection) of user. It counts against the pool,
// the node and the user like any backend in use, and against MaxHeld; give
// it back with ReleaseHeld.
func (p *Pools) AcquireHeld(ctx context.Context, user, node, tenant string) (*Conn, error) {
	pl, err := p.get(node, tenant)
	if err != nil {
		return nil, err
	}
	if n := pl.held.Add(1); n > int64(pl.cfg.MaxHeld) {
		pl.held.Add(-1)
		return nil, fmt.Errorf("node %s: %w (%d)", node, ErrTooManyHeld, pl.cfg.MaxHeld)
	}
	c, err := p.Acquire(ctx, user, node, tenant)
	if err != nil {
		pl.held.Add(-1)
		return nil, err
	}
	c.held = true
	return c, nil
}

// ReleaseHeld returns a backend taken with AcquireHeld, pooling it when it
// is clean and closing it otherwise, as Release does.
func (p *Pools) ReleaseHeld(c *Conn) {
	p.mu.Lock()
	pl := p.pools[poolKey{c.Node, c.Tenant}]
	p.mu.Unlock()
	if pl != nil && pl == c.pool && c.held {
		pl.held.Add(-1)
	}
	c.held = false
	p.Release(c)
}
