// Package pgshard talks to the PostgreSQL nodes of a Lattice cluster: backend
// pools for the request path, and the control work that builds and drops
// shard schemas and turns ordinary tables into trees.
package pgshard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/secret"
)

// Node is one PostgreSQL server of the cluster.
type Node struct {
	Name string
	// DSN gives host, port and credentials. Its database is the node's own:
	// on the catalog node it is the default tenant, on every node it is where
	// missing tenant databases are created from.
	DSN string
	// Password, when set, is used where the DSN has none: a --node flag's
	// password, which this proxy keeps and the node registry never sees.
	Password string
	// Draining: shards are being moved off the node, so new shards are not
	// placed there (PlacementNodes).
	Draining bool
}

// Cluster is the ordered set of nodes; the first is the catalog node. The
// set changes as the node registry does (SetNodes); each call reads the
// set of that moment.
type Cluster struct {
	nodes    atomic.Pointer[nodeSet]
	seed     []Node // the node set given to NewCluster (Seed, ApplyRegistry)
	passfile string // --pgpass: where node passwords come from, "" for libpq's default
	log      *slog.Logger

	verifier  func(password string) (string, error) // SetVerifier
	roles     sync.Map                              // roleKey -> struct{}: EnsureRole succeeded
	roleLocks sync.Map                              // roleKey -> *sync.Mutex
	refs      atomic.Pointer[referenceStore]        // SetReferences: copied to a node before its first shard
	// refChanges lets one change of reference tables' copies run at a
	// time in this process (changeReferences).
	refChanges sync.Mutex

	mu      sync.Mutex
	admin   map[adminKey]*pgxpool.Pool
	closed  bool
	changed chan struct{} // closed and replaced by every SetNodes that changes the set

	looks *looks[lookKey, map[string]bool] // Present's, per node

	spares spares // Borrow's idle connections

	armWarm sync.Map // *pgx.Conn -> struct{}: an arm connection warmArm readied
}

// nodeSet is one immutable version of the node set.
type nodeSet struct {
	nodes  []Node
	byName map[string]int
	ownDB  []string // each node's own database, in node order
}

// adminKey names a cached pool: a control pool (role ""), or a pool of
// another role apart from it.
type adminKey struct{ node, tenant, role string }

// adminMaxConns bounds each control pool: control work is a few DDL
// statements and COPY streams at a time, never the request path.
const adminMaxConns = 4

// maxParallelNodes bounds how many nodes control work talks to at once.
const maxParallelNodes = 8

// ErrClusterClosed is returned by Admin after Close.
var ErrClusterClosed = errors.New("pgshard: cluster is closed")

// NewCluster checks the node list: at least one node, unique non-empty names,
// DSNs that parse. log may be nil.
func NewCluster(nodes []Node, log *slog.Logger) (*Cluster, error) {
	set, err := newNodeSet(nodes)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Cluster{seed: set.nodes, log: log, admin: make(map[adminKey]*pgxpool.Pool), changed: make(chan struct{})}
	c.looks = newLooks(c.look)
	c.nodes.Store(set)
	return c, nil
}

func newNodeSet(nodes []Node) (*nodeSet, error) {
	if len(nodes) == 0 {
		return nil, errors.New("pgshard: a cluster needs at least one node")
	}
	s := &nodeSet{
		nodes:  append([]Node(nil), nodes...),
		byName: make(map[string]int, len(nodes)),
		ownDB:  make([]string, len(nodes)),
	}
	for i, n := range nodes {
		if n.Name == "" {
			return nil, fmt.Errorf("pgshard: node %d has no name", i+1)
		}
		if _, dup := s.byName[n.Name]; dup {
			return nil, fmt.Errorf("pgshard: node name %q is used twice", n.Name)
		}
		cfg, err := pgconn.ParseConfig(n.DSN)
		if err != nil {
			return nil, fmt.Errorf("pgshard: node %s: %w", n.Name, err)
		}
		s.byName[n.Name] = i
		// Without a database in the DSN the server uses the user's name.
		s.ownDB[i] = cfg.Database
		if s.ownDB[i] == "" {
			s.ownDB[i] = cfg.User
		}
	}
	return s, nil
}

func (c *Cluster) set() *nodeSet { return c.nodes.Load() }

// SetPassfile makes every connection whose DSN has no password look it up
// in the pgpass file at path (PostgreSQL's format), read afresh at each
// connection so that a changed file needs no restart.
func (c *Cluster) SetPassfile(path string) { c.passfile = path }

// SetNodes replaces the node set and returns the names of the nodes that
// left it or whose DSN changed. Their control pools close once their
// connections are released; the caller forgets their request pools
// (Pools.Forget). The catalog node must stay first: Lattice never moves it.
func (c *Cluster) SetNodes(nodes []Node) (gone []string, err error) {
	next, err := newNodeSet(nodes)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.set()
	if next.nodes[0].Name != old.nodes[0].Name {
		return nil, fmt.Errorf("pgshard: the catalog node is %s, not %s: Lattice does not move it", old.nodes[0].Name, next.nodes[0].Name)
	}
	changed := len(old.nodes) != len(next.nodes)
	for i, n := range old.nodes {
		j, ok := next.byName[n.Name]
		if !ok || next.nodes[j].DSN != n.DSN || next.nodes[j].Password != n.Password {
			gone = append(gone, n.Name)
		}
		changed = changed || !ok || j != i || next.nodes[j] != n
	}
	c.nodes.Store(next)
	var closing []*pgxpool.Pool
	for _, name := range gone {
		c.spares.drop(name)
		for k, p := range c.admin {
			if k.node == name {
				closing = append(closing, p)
				delete(c.admin, k)
			}
		}
	}
	// Close waits for acquired connections: work in flight on a removed
	// node finishes first, and nothing here waits for it.
	for _, p := range closing {
		go p.Close()
	}
	if changed {
		close(c.changed)
		c.changed = make(chan struct{})
		c.log.Info("pgshard: node set changed", "nodes", c.namesLocked(next), "gone", gone)
	}
	return gone, nil
}

func (c *Cluster) namesLocked(s *nodeSet) []string {
	out := make([]string, len(s.nodes))
	for i, n := range s.nodes {
		out[i] = n.Name
	}
	return out
}

// Changed returns a channel that is closed at the next change of the node set.
func (c *Cluster) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Nodes returns the nodes in order.
func (c *Cluster) Nodes() []Node { return append([]Node(nil), c.set().nodes...) }

// NodeNames returns the node names in order, as shard maps place shards.
func (c *Cluster) NodeNames() []string { return c.namesLocked(c.set()) }

// PlacementNodes are the nodes new shards may be placed on, in order: all
// but the draining ones, or all when every node drains.
func (c *Cluster) PlacementNodes() []string {
	var out []string
	for _, n := range c.set().nodes {
		if !n.Draining {
			out = append(out, n.Name)
		}
	}
	if len(out) == 0 {
		return c.NodeNames()
	}
	return out
}

// Catalog is the first node: it holds ordinary tables and tree templates.
func (c *Cluster) Catalog() Node { return c.set().nodes[0] }

// Node looks a node up by name.
func (c *Cluster) Node(name string) (Node, bool) {
	s := c.set()
	i, ok := s.byName[name]
	if !ok {
		return Node{}, false
	}
	return s.nodes[i], true
}

// DefaultTenant is the database of the catalog node's DSN.
func (c *Cluster) DefaultTenant() string { return c.set().ownDB[0] }

// TenantDSN is the DSN of node with its database replaced by tenant, and
// the password it needs when the DSN has none: the node's own (from a
// --node flag), else a lookup in the --pgpass file. Without either,
// pgconn's own defaults apply (PGPASSWORD, PGPASSFILE, ~/.pgpass).
func (c *Cluster) TenantDSN(node, tenant string) (string, error) {
	s := c.set()
	i, ok := s.byName[node]
	if !ok {
		return "", fmt.Errorf("pgshard: unknown node %q", node)
	}
	if tenant == "" {
		return "", errors.New("pgshard: empty tenant")
	}
	return c.connString(s.nodes[i], tenant)
}

// OwnDSN is TenantDSN for the node's own database.
func (c *Cluster) OwnDSN(node string) (string, error) {
	s := c.set()
	i, ok := s.byName[node]
	if !ok {
		return "", fmt.Errorf("pgshard: unknown node %q", node)
	}
	return c.connString(s.nodes[i], s.ownDB[i])
}

// connString is n's DSN for database db ("": the DSN's own), with the
// credentials it needs.
func (c *Cluster) connString(n Node, db string) (string, error) {
	dsn := n.DSN
	if db != "" {
		var err error
		if dsn, err = withDatabase(n.DSN, db); err != nil {
			return "", err
		}
	}
	_, pw, _, err := SplitPassword(dsn)
	if err != nil || pw != "" {
		return dsn, err
	}
	if n.Password != "" {
		return withParam(dsn, "password", n.Password)
	}
	if c.passfile != "" {
		return withParam(dsn, "passfile", c.passfile)
	}
	return dsn, nil
}

// withDatabase replaces the database of a DSN in URL or keyword/value form,
// and checks the result parses to that database.
func withDatabase(dsn, db string) (string, error) {
	var out string
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgshard: parse DSN: %w", secret.Error(err)) // url.Error quotes the password
		}
		u.Path, u.RawPath = "/"+db, ""
		q := u.Query()
		if q.Has("dbname") || q.Has("database") {
			q.Del("dbname")
			q.Del("database")
			u.RawQuery = q.Encode()
		}
		out = u.String()
	} else {
		// In keyword/value form the last occurrence of a keyword wins.
		v := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db)
		out = strings.TrimSpace(dsn + " dbname='" + v + "'")
	}
	cfg, err := pgconn.ParseConfig(out)
	if err != nil {
		return "", fmt.Errorf("pgshard: DSN for database %q: %w", db, err)
	}
	if cfg.Database != db {
		return "", fmt.Errorf("pgshard: DSN for database %q names database %q", db, cfg.Database)
	}
	return out, nil
}

// controlSession names control sessions, unless the DSN does, so they are
// recognisable in pg_stat_activity, and resets a connection given up on
// (ResetOnGiveUp): a fence or a DDL statement must not arrive after its
// caller moved on.
func controlSession(cfg *pgx.ConnConfig) {
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "lattice-admin"
	}
	cfg.DialFunc = ResetOnGiveUp(cfg.DialFunc)
}

// Admin returns a small lazily created pgxpool for control work (DDL, COPY)
// on node for tenant. Pools are cached and closed by Close.
func (c *Cluster) Admin(ctx context.Context, node, tenant string) (*pgxpool.Pool, error) {
	return c.pool(ctx, adminKey{node: node, tenant: tenant}, adminMaxConns, func() (string, error) { return c.TenantDSN(node, tenant) }, nil)
}

// fencePool is a pool of two connections to node for tenant for preparing
// the fences of freezes, apart from the control pool: a release's deletes,
// a shadow copy's setup or a drop of another migration can hold all of its
// connections.
func (c *Cluster) fencePool(ctx context.Context, node, tenant string) (*pgxpool.Pool, error) {
	return c.pool(ctx, adminKey{node: node, tenant: tenant, role: "fence"}, 2, func() (string, error) { return c.TenantDSN(node, tenant) }, nil)
}

// armMaxConns bounds the arms of one node and tenant at once: one per
// migration in flight from that node, which --max-concurrent-migrations
// bounds (4 by default); a fifth waits for a connection.
const armMaxConns = 4

// armPool is the connections that arm fences on node for tenant, and
// nothing else, since an arm runs inside a write pause: a prepare of
// another migration, which waits for a node-wide lock, must not hold the
// connection an arm needs. PrepareSlotFence opens one before the pause,
// and a connection is never pinged before an arm: pgxpool pings one idle
// for over a second, and the pause would pay that round trip. An arm on a
// broken connection is sent again on another (ArmSlotFences).
func (c *Cluster) armPool(ctx context.Context, node, tenant string) (*pgxpool.Pool, error) {
	return c.pool(ctx, adminKey{node: node, tenant: tenant, role: "arm"}, armMaxConns, func() (string, error) { return c.TenantDSN(node, tenant) }, func(cfg *pgxpool.Config) {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.BeforeClose = func(conn *pgx.Conn) { c.armWarm.Delete(conn) }
	})
}

// probePool is a pool of two connections to node's own database for the
// quick reads of lattice_nodes (Usage), apart from the control pools, whose
// connections a shadow copy or a release can hold for long.
func (c *Cluster) probePool(ctx context.Context, node string) (*pgxpool.Pool, error) {
	// No tenant in the key: apart from every control pool.
	return c.pool(ctx, adminKey{node: node}, 2, func() (string, error) {
		return c.OwnDSN(node)
	}, nil)
}

// lookPool is the one connection to node's own database that Present's
// looks take, one at a time (looks), apart from every other pool. Once
// opened it is kept: never closed for idleness or age, opened again in the
// background if it breaks, and never pinged before a look, which would
// double the look's round trips (pgxpool pings a connection idle for over a
// second, and freezes come seconds apart). A look that finds it broken
// opens a new one (Cluster.look).
func (c *Cluster) lookPool(ctx context.Context, node string) (*pgxpool.Pool, error) {
	return c.pool(ctx, adminKey{node: node, role: "look"}, 1, func() (string, error) {
		return c.OwnDSN(node)
	}, func(cfg *pgxpool.Config) {
		cfg.MinConns = 1
		cfg.MaxConnLifetime = 0
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
}

// pool returns the cached pool under k, creating it over dsn() with at
// most maxConns connections, and tune, if not nil, applied to its config.
func (c *Cluster) pool(ctx context.Context, k adminKey, maxConns int32, dsn func() (string, error), tune func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClusterClosed
	}
	if p := c.admin[k]; p != nil {
		return p, nil
	}
	d, err := dsn()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(d)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", k.node, err)
	}
	controlSession(cfg.ConnConfig)
	cfg.MaxConns = maxConns
	cfg.MaxConnIdleTime = time.Minute
	if tune != nil {
		tune(cfg)
	}
	// NewWithConfig does not connect (MinConns connects in the background),
	// so holding c.mu is cheap.
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", k.node, err)
	}
	c.admin[k] = p
	return p, nil
}

// connect opens a dedicated connection, outside the control pools, for a
// transaction that holds locks for a long time.
func (c *Cluster) connect(ctx context.Context, node, tenant string) (*pgx.Conn, error) {
	return c.connectConfig(ctx, node, tenant, nil)
}

// connectConfig is connect with the connection's configuration changed
// by tune (nil: none) before it connects.
func (c *Cluster) connectConfig(ctx context.Context, node, tenant string, tune func(*pgx.ConnConfig)) (*pgx.Conn, error) {
	dsn, err := c.TenantDSN(node, tenant)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
	}
	controlSession(cfg)
	if tune != nil {
		tune(cfg)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
	}
	return conn, nil
}

// Close closes every control pool and spare connection.
func (c *Cluster) Close() {
	c.mu.Lock()
	pools := c.admin
	c.admin = nil
	c.closed = true
	c.mu.Unlock()
	c.spares.close()
	for _, p := range pools {
		p.Close()
	}
}

// EnsureTenant creates the tenant's database on node if it is missing,
// connected to the node's own database, with the server's defaults (owned
// by the node DSN's user, copied from template1). Only the catalog node
// holds a tenant's ordinary tables and tree templates; another node's
// tenant database holds shard schemas only, which CreateShard makes. It
// can run again, and from several proxies at once.
func (c *Cluster) EnsureTenant(ctx context.Context, node, tenant string) error {
	s := c.set()
	i, ok := s.byName[node]
	if !ok {
		return fmt.Errorf("pgshard: unknown node %q", node)
	}
	if tenant == s.ownDB[i] {
		return nil
	}
	p, err := c.Admin(ctx, node, s.ownDB[i])
	if err != nil {
		return err
	}
	created, err := createDatabase(ctx, p, tenant)
	if err != nil {
		return fmt.Errorf("pgshard: node %s: create database %q: %w", node, tenant, err)
	}
	if created {
		c.log.Info("created tenant database", "node", node, "tenant", tenant)
	}
	return nil
}

// forEachNode runs fn for every node named, at most maxParallelNodes at a
// time, and joins their errors.
func forEachNode(ctx context.Context, nodes []string, fn func(ctx context.Context, node string) error) error {
	sem := make(chan struct{}, maxParallelNodes)
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			errs[i] = fn(ctx, n)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

// Aggregates returns which of names are aggregate functions in tenant's
// catalog: the router knows PostgreSQL's built-in ones by name, but only the
// catalog knows the user-defined ones.
func (c *Cluster) Aggregates(ctx context.Context, tenant string, names []string) ([]string, error) {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := p.Query(ctx, `SELECT DISTINCT lower(proname) FROM pg_proc WHERE prokind = 'a' AND lower(proname) = ANY($1)`, names)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
