package pgshard

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

// Beyond each pool's MaxConns, backends are bounded per node and per user.
//
// Per node (MaxNodeConns): every backend this proxy has open on a node,
// idle or in use, of every tenant. Without it, a user granted many tenants
// (or *) opens a pool for each and takes the node's max_connections, and
// the control role's migrator, recoverer and presence cannot connect. A
// pool that needs a new backend on a full node first closes an idle one of
// another tenant there, so idle backends never block a working tenant.
//
// Per user (MaxUserConns): the backends one user's sessions use at once,
// across nodes and tenants, so that one user cannot take every backend
// from the others.

// nodeCap holds a token per backend open on one node.
type nodeCap struct {
	name    string
	open    chan struct{}
	waiting atomic.Int64 // acquires waiting for a token now
}

// give returns the token of a backend that closed. A nil cap is a backend
// no pool opened (tests).
func (nc *nodeCap) give() {
	if nc != nil {
		<-nc.open
	}
}

// userCap holds a token per backend one user's sessions use now.
type userCap struct {
	name  string
	inUse chan struct{}
	refs  int // holders and waiters, under Pools.mu: at 0 the entry goes
}

// nodeCapOf is node's budget, made on first use.
func (p *Pools) nodeCapOf(node string) *nodeCap {
	p.mu.Lock()
	defer p.mu.Unlock()
	nc := p.nodes[node]
	if nc == nil {
		nc = &nodeCap{name: node, open: make(chan struct{}, p.cfg.MaxNodeConns)}
		p.nodes[node] = nc
	}
	return nc
}

// takeNode takes a token for a new backend on nc's node: at once if the
// node has room, else by closing an idle backend there, else by waiting
// at most AcquireTimeout for one to close.
func (p *Pools) takeNode(ctx context.Context, nc *nodeCap) error {
	for {
		select {
		case nc.open <- struct{}{}:
			return nil
		default:
		}
		if !p.closeIdleOn(nc.name) {
			break
		}
	}
	nc.waiting.Add(1)
	defer nc.waiting.Add(-1)
	t := time.NewTimer(p.cfg.AcquireTimeout)
	defer t.Stop()
	select {
	case nc.open <- struct{}{}:
		return nil
	case <-t.C:
		return sqlstate.New(sqlstate.TooManyConnections, "node %s: this proxy already has %d backends open there (--max-node-backends)", nc.name, p.cfg.MaxNodeConns).
			WithHint("Retry later, or raise --max-node-backends, keeping it times the number of proxies below the node's max_connections less what the control role needs.")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeIdleOn closes the longest-idle backend of any pool on node, and
// reports whether there was one.
func (p *Pools) closeIdleOn(node string) bool {
	var oldest *Conn
	var from *pool
	p.mu.Lock()
	for k, pl := range p.pools {
		if k.node != node {
			continue
		}
		pl.mu.Lock()
		if len(pl.idle) > 0 && (oldest == nil || pl.idle[0].lastUsed.Before(oldest.lastUsed)) {
			oldest, from = pl.idle[0], pl
		}
		pl.mu.Unlock()
	}
	if from != nil {
		from.mu.Lock()
		// Another acquire may have taken it meanwhile; then look again.
		if len(from.idle) == 0 || from.idle[0] != oldest {
			oldest = nil
		} else {
			from.idle = from.idle[1:]
		}
		from.mu.Unlock()
	}
	p.mu.Unlock()
	if from == nil {
		return false
	}
	if oldest != nil {
		oldest.Close()
	}
	return true
}

// takeUser takes a token of user's, waiting at most AcquireTimeout. A wait
// counts in the waits of pl, the pool the token is for: the statement
// waits for a backend there.
func (p *Pools) takeUser(ctx context.Context, user string, pl *pool) (*userCap, error) {
	p.mu.Lock()
	uc := p.users[user]
	if uc == nil {
		uc = &userCap{name: user, inUse: make(chan struct{}, p.cfg.MaxUserConns)}
		p.users[user] = uc
	}
	uc.refs++
	p.mu.Unlock()
	select {
	case uc.inUse <- struct{}{}:
		return uc, nil
	default:
	}
	pl.waits.Add(1)
	pl.waiting.Add(1)
	defer pl.waiting.Add(-1)
	t := time.NewTimer(p.cfg.AcquireTimeout)
	defer t.Stop()
	select {
	case uc.inUse <- struct{}{}:
		return uc, nil
	case <-t.C:
		p.unref(uc)
		return nil, sqlstate.New(sqlstate.TooManyConnections, "user %q already uses %d backends at once (--max-user-backends)", user, p.cfg.MaxUserConns).
			WithHint("End idle transactions and sessions of this user, or raise --max-user-backends.")
	case <-ctx.Done():
		p.unref(uc)
		return nil, ctx.Err()
	}
}

// giveUser returns c's user token, once.
func (p *Pools) giveUser(c *Conn) {
	if uc := c.user; uc != nil {
		c.user = nil
		<-uc.inUse
		p.unref(uc)
	}
}

func (p *Pools) unref(uc *userCap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if uc.refs--; uc.refs == 0 && p.users[uc.name] == uc {
		delete(p.users, uc.name)
	}
}
