package pgshard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

// PoolConfig bounds the backend connections of one proxy.
type PoolConfig struct {
	// MaxConns is the most backend connections per node and tenant. Shards
	// are schemas, so this does not grow with the shard count.
	MaxConns int
	// AcquireTimeout is how long a statement waits for a free backend before
	// it fails with 53300.
	AcquireTimeout time.Duration
	// IdleTimeout closes backends unused for this long.
	IdleTimeout time.Duration
	// MaxMessageSize bounds every message a backend sends.
	MaxMessageSize int
	// MaxHeld bounds the backends per node and tenant that sessions hold for
	// themselves (LISTEN); they count against MaxConns too. 0 means half of
	// MaxConns, so listeners cannot starve the pool.
	MaxHeld int
	// MaxNodeConns bounds the backends open on one node, idle or in use,
	// across tenants; MaxUserConns, the backends one user's sessions use at
	// once (caps.go). 0 means DefaultMaxNodeConns and MaxConns.
	MaxNodeConns, MaxUserConns int
	// Prepare, when set, runs before a pool's first backend is opened, and
	// again until it succeeds: it makes the tenant's role on the node
	// (Cluster.EnsureRole).
	Prepare func(ctx context.Context, node, tenant string) error
	// CheckParam, when set, refuses a setting's value the backend reports
	// (ParameterStatus), at startup or at run time, under which the proxy
	// would read statements differently from the backend
	// (router.CheckReported). Such a backend is closed.
	CheckParam func(name, value string) error
}

func (c *PoolConfig) withDefaults() PoolConfig {
	out := *c
	if out.MaxConns <= 0 {
		out.MaxConns = 32
	}
	if out.AcquireTimeout <= 0 {
		out.AcquireTimeout = 10 * time.Second
	}
	if out.IdleTimeout <= 0 {
		out.IdleTimeout = 5 * time.Minute
	}
	if out.MaxMessageSize <= 0 {
		out.MaxMessageSize = 256 << 20
	}
	if out.MaxHeld <= 0 {
		out.MaxHeld = max(1, out.MaxConns/2)
	}
	if out.MaxNodeConns <= 0 {
		out.MaxNodeConns = DefaultMaxNodeConns
	}
	if out.MaxUserConns <= 0 {
		// One node's worth: a user's sessions fill several nodes' pools
		// at once in a fan-out or a transaction across nodes, so the
		// pool size alone would cap a one-user application below what
		// its pools give it (with --pool-size 1, at one backend).
		out.MaxUserConns = max(out.MaxConns, out.MaxNodeConns)
	}
	return out
}

// DefaultMaxNodeConns is MaxNodeConns when none is given: with PostgreSQL's
// default max_connections of 100, room for one proxy and the control role.
const DefaultMaxNodeConns = 64

// ErrPoolExhausted is returned when no backend became free in time.
var ErrPoolExhausted = errors.New("no backend connection became free in time")

// Pools holds one transaction-mode pool per node and tenant.
type Pools struct {
	cfg     PoolConfig
	resolve func(node, tenant string) (string, error)

	// connect opens a backend; a field so that tests can count without a
	// server.
	connect func(ctx context.Context, node, tenant, dsn string, maxMessage int) (*Conn, error)

	mu    sync.Mutex
	pools map[poolKey]*pool
	nodes map[string]*nodeCap
	users map[string]*userCap
}

type poolKey struct{ node, tenant string }

// NewPools creates the pools; resolve gives the DSN of a node for a tenant.
func NewPools(cfg PoolConfig, resolve func(node, tenant string) (string, error)) *Pools {
	return &Pools{cfg: cfg.withDefaults(), resolve: resolve, connect: connect,
		pools: make(map[poolKey]*pool), nodes: make(map[string]*nodeCap), users: make(map[string]*userCap)}
}

// Stats is a pool's use, for metrics.
type Stats struct {
	Node, Tenant  string
	InUse, Idle   int
	Held          int
	Waiting       int // acquires waiting for a free backend now
	AcquireWaits  int64
	AcquireErrors int64
}

type pool struct {
	key   poolKey
	dsn   string
	cfg   PoolConfig
	pools *Pools
	node  *nodeCap
	slots chan struct{} // one token per backend in use; idle ones hold none, so in use + idle <= MaxConns

	mu   sync.Mutex
	idle []*Conn

	waits, errs atomic.Int64
	waiting     atomic.Int64 // acquires blocked on a free slot now
	held        atomic.Int64 // backends in use that a session holds for itself
	prepared    atomic.Bool  // cfg.Prepare succeeded
}

func (p *Pools) get(node, tenant string) (*pool, error) {
	k := poolKey{node, tenant}
	p.mu.Lock()
	if pl, ok := p.pools[k]; ok {
		p.mu.Unlock()
		return pl, nil
	}
	p.mu.Unlock()
	dsn, err := p.resolve(node, tenant)
	if err != nil {
		return nil, err
	}
	nc := p.nodeCapOf(node)
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl, ok := p.pools[k]; ok {
		return pl, nil
	}
	pl := &pool{key: k, dsn: dsn, cfg: p.cfg, pools: p, node: nc, slots: make(chan struct{}, p.cfg.MaxConns)}
	p.pools[k] = pl
	return pl, nil
}

// Acquire returns an idle backend of node for tenant, or opens one, for a
// session of user, waiting at most AcquireTimeout for a free slot of the
// pool, the node and the user each. A first backend that finds no database
// of the tenant's name (3D000) leaves no pool behind.
func (p *Pools) Acquire(ctx context.Context, user, node, tenant string) (*Conn, error) {
	pl, err := p.get(node, tenant)
	if err != nil {
		return nil, err
	}
	uc, err := p.takeUser(ctx, user, pl)
	if err != nil {
		return nil, err
	}
	c, err := pl.acquire(ctx)
	if err != nil {
		<-uc.inUse
		p.unref(uc)
		if sqlstate.Is(err, sqlstate.InvalidCatalogName) {
			p.forgetUnused(node, tenant)
		}
		return nil, err
	}
	c.user = uc
	return c, nil
}

// Release returns c to its pool. A backend that is inside a transaction or
// whose state is unknown is closed instead: the next user must get a clean one.
func (p *Pools) Release(c *Conn) {
	if c.pinned {
		if !c.broken {
			return
		}
		c.pinned = false
	}
	if c.Untracked {
		// Nobody checked it for session state: the next client must not
		// get it.
		c.broken = true
	}
	p.mu.Lock()
	pl := p.pools[poolKey{c.Node, c.Tenant}]
	p.mu.Unlock()
	if pl == nil || pl != c.pool {
		// Its pool was forgotten (the node left, or its DSN changed):
		// the backend goes with it.
		p.giveUser(c)
		c.Close()
		return
	}
	c.Wrote = false
	p.giveUser(c)
	pl.release(c)
}

// forgetUnused drops the pool of node and tenant if it holds no backend,
// in use or idle: after its database turned out not to exist, so that
// clients naming databases at random do not grow the pool map.
func (p *Pools) forgetUnused(node, tenant string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := poolKey{node, tenant}
	pl := p.pools[k]
	if pl == nil || len(pl.slots) > 0 || pl.waiting.Load() > 0 {
		return
	}
	pl.mu.Lock()
	idle := len(pl.idle)
	pl.mu.Unlock()
	if idle == 0 {
		delete(p.pools, k)
	}
}

// Stats reports each pool's use.
func (p *Pools) Stats() []Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Stats, 0, len(p.pools))
	for k, pl := range p.pools {
		pl.mu.Lock()
		idle := len(pl.idle)
		pl.mu.Unlock()
		out = append(out, Stats{Node: k.node, Tenant: k.tenant, InUse: len(pl.slots), Idle: idle, Held: int(pl.held.Load()),
			Waiting: int(pl.waiting.Load()), AcquireWaits: pl.waits.Load(), AcquireErrors: pl.errs.Load()})
	}
	return out
}

// Close closes every idle backend; backends in use are closed on release.
func (p *Pools) Close() {
	p.mu.Lock()
	pools := p.pools
	p.pools = make(map[poolKey]*pool)
	p.mu.Unlock()
	for _, pl := range pools {
		pl.closeIdle(0)
	}
}

// Forget drops the pools of node, after it left the cluster or its DSN
// changed: their idle backends close now, and each backend a session
// still uses closes when it is released (Release finds no pool for it), so
// sessions in flight are not disturbed. The next Acquire opens a new pool
// over the node's current DSN.
func (p *Pools) Forget(node string) {
	p.mu.Lock()
	var drop []*pool
	for k, pl := range p.pools {
		if k.node == node {
			drop = append(drop, pl)
			delete(p.pools, k)
		}
	}
	p.mu.Unlock()
	for _, pl := range drop {
		pl.closeIdle(0)
	}
}

// ReapIdle closes backends idle for longer than the idle timeout. The caller
// runs it periodically.
func (p *Pools) ReapIdle() {
	p.mu.Lock()
	pools := make([]*pool, 0, len(p.pools))
	for _, pl := range p.pools {
		pools = append(pools, pl)
	}
	p.mu.Unlock()
	for _, pl := range pools {
		pl.closeIdle(pl.cfg.IdleTimeout)
	}
}

func (pl *pool) acquire(ctx context.Context) (*Conn, error) {
	select {
	case pl.slots <- struct{}{}:
	default:
		pl.waits.Add(1)
		pl.waiting.Add(1)
		defer pl.waiting.Add(-1)
		t := time.NewTimer(pl.cfg.AcquireTimeout)
		defer t.Stop()
		select {
		case pl.slots <- struct{}{}:
		case <-t.C:
			pl.errs.Add(1)
			return nil, fmt.Errorf("node %s: %w (%d connections in use)", pl.key.node, ErrPoolExhausted, pl.cfg.MaxConns)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	pl.mu.Lock()
	for n := len(pl.idle); n > 0; n = len(pl.idle) {
		c := pl.idle[n-1]
		pl.idle = pl.idle[:n-1]
		pl.mu.Unlock()
		if time.Since(c.lastUsed) < aliveCheckAfter || c.alive() {
			return c, nil
		}
		// The server closed it while it sat idle (a restart, a crash,
		// pg_terminate_backend): it would fail a statement the node can
		// serve now, so it goes and the next one is tried.
		c.Close()
		pl.mu.Lock()
	}
	pl.mu.Unlock()
	if pl.cfg.Prepare != nil && !pl.prepared.Load() {
		if err := pl.cfg.Prepare(ctx, pl.key.node, pl.key.tenant); err != nil {
			<-pl.slots
			pl.errs.Add(1)
			return nil, err
		}
		pl.prepared.Store(true)
	}
	if err := pl.pools.takeNode(ctx, pl.node); err != nil {
		<-pl.slots
		pl.errs.Add(1)
		return nil, err
	}
	c, err := pl.pools.connect(ctx, pl.key.node, pl.key.tenant, pl.dsn, pl.cfg.MaxMessageSize)
	if err == nil {
		if c.checkParam = pl.cfg.CheckParam; c.checkParam != nil {
			if err = c.checkParams(c.Params); err != nil {
				c.Close()
			}
		}
	}
	if err != nil {
		pl.node.give()
		<-pl.slots
		pl.errs.Add(1)
		return nil, err
	}
	c.pool, c.node = pl, pl.node
	return c, nil
}

// aliveCheckAfter is how long a backend must have sat idle before get
// peeks at its socket (Conn.alive), a system call per statement otherwise.
// A backend released more recently was fine a moment ago; if its server
// died in that moment, the statement gets the connection error, as the
// statements running on it when it died did.
const aliveCheckAfter = 50 * time.Millisecond

func (pl *pool) release(c *Conn) {
	// A new backend waiting for room on the node gets this one's.
	if c.broken || c.TxStatus != 'I' || !c.Idle() || pl.node.waiting.Load() > 0 {
		c.Close()
		<-pl.slots
		return
	}
	c.lastUsed = time.Now()
	pl.mu.Lock()
	pl.idle = append(pl.idle, c)
	pl.mu.Unlock()
	<-pl.slots
}

// closeIdle closes idle backends unused for longer than age (all when 0).
// The slot tokens of idle backends were already returned on release.
func (pl *pool) closeIdle(age time.Duration) {
	now := time.Now()
	pl.mu.Lock()
	keep := pl.idle[:0]
	var drop []*Conn
	for _, c := range pl.idle {
		if age == 0 || now.Sub(c.lastUsed) > age {
			drop = append(drop, c)
		} else {
			keep = append(keep, c)
		}
	}
	pl.idle = keep
	pl.mu.Unlock()
	for _, c := range drop {
		c.Close()
	}
}
