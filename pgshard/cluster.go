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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/secret"
	"github.com/lattice-db/lattice/sqlstate"
)

// Node is one PostgreSQL server of the cluster.
type Node struct {
	Name string
	// DSN gives host, port and credentials. Its database is the node's own:
	// on the catalog node it is the default tenant, on every node it is where
	// missing tenant databases are created from.
	DSN string
}

// Cluster is the ordered set of nodes; the first is the catalog node.
type Cluster struct {
	nodes  []Node
	byName map[string]int
	ownDB  []string // each node's own database, in node order
	log    *slog.Logger

	mu     sync.Mutex
	admin  map[adminKey]*pgxpool.Pool
	closed bool
}

type adminKey struct{ node, tenant string }

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
	if len(nodes) == 0 {
		return nil, errors.New("pgshard: a cluster needs at least one node")
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Cluster{
		nodes:  append([]Node(nil), nodes...),
		byName: make(map[string]int, len(nodes)),
		ownDB:  make([]string, len(nodes)),
		log:    log,
		admin:  make(map[adminKey]*pgxpool.Pool),
	}
	for i, n := range nodes {
		if n.Name == "" {
			return nil, fmt.Errorf("pgshard: node %d has no name", i+1)
		}
		if _, dup := c.byName[n.Name]; dup {
			return nil, fmt.Errorf("pgshard: node name %q is used twice", n.Name)
		}
		cfg, err := pgconn.ParseConfig(n.DSN)
		if err != nil {
			return nil, fmt.Errorf("pgshard: node %s: %w", n.Name, err)
		}
		c.byName[n.Name] = i
		// Without a database in the DSN the server uses the user's name.
		c.ownDB[i] = cfg.Database
		if c.ownDB[i] == "" {
			c.ownDB[i] = cfg.User
		}
	}
	return c, nil
}

// Nodes returns the nodes in order.
func (c *Cluster) Nodes() []Node { return append([]Node(nil), c.nodes...) }

// NodeNames returns the node names in order, as shard maps place shards.
func (c *Cluster) NodeNames() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Name
	}
	return out
}

// Catalog is the first node: it holds ordinary tables and tree templates.
func (c *Cluster) Catalog() Node { return c.nodes[0] }

// Node looks a node up by name.
func (c *Cluster) Node(name string) (Node, bool) {
	i, ok := c.byName[name]
	if !ok {
		return Node{}, false
	}
	return c.nodes[i], true
}

// DefaultTenant is the database of the catalog node's DSN.
func (c *Cluster) DefaultTenant() string { return c.ownDB[0] }

// TenantDSN is the DSN of node with its database replaced by tenant.
func (c *Cluster) TenantDSN(node, tenant string) (string, error) {
	i, ok := c.byName[node]
	if !ok {
		return "", fmt.Errorf("pgshard: unknown node %q", node)
	}
	if tenant == "" {
		return "", errors.New("pgshard: empty tenant")
	}
	return withDatabase(c.nodes[i].DSN, tenant)
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

// nameApplication names control sessions, unless the DSN does, so they are
// recognisable in pg_stat_activity.
func nameApplication(cfg *pgx.ConnConfig) {
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "lattice-admin"
	}
}

// Admin returns a small lazily created pgxpool for control work (DDL, COPY)
// on node for tenant. Pools are cached and closed by Close.
func (c *Cluster) Admin(ctx context.Context, node, tenant string) (*pgxpool.Pool, error) {
	return c.pool(ctx, adminKey{node, tenant}, adminMaxConns, func() (string, error) { return c.TenantDSN(node, tenant) })
}

// probePool is a pool of two connections to node's own database for the
// quick reads of a freeze (Present), apart from the control pools, whose
// connections a shadow copy or a release can hold for long.
func (c *Cluster) probePool(ctx context.Context, node string) (*pgxpool.Pool, error) {
	// No tenant in the key: apart from every control pool.
	return c.pool(ctx, adminKey{node: node}, 2, func() (string, error) {
		i, ok := c.byName[node]
		if !ok {
			return "", fmt.Errorf("pgshard: unknown node %q", node)
		}
		return c.nodes[i].DSN, nil
	})
}

// pool returns the cached pool under k, creating it over dsn() with at
// most maxConns connections.
func (c *Cluster) pool(ctx context.Context, k adminKey, maxConns int32, dsn func() (string, error)) (*pgxpool.Pool, error) {
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
	nameApplication(cfg.ConnConfig)
	cfg.MaxConns = maxConns
	cfg.MaxConnIdleTime = time.Minute
	// NewWithConfig does not connect (MinConns is 0), so holding c.mu is cheap.
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
	dsn, err := c.TenantDSN(node, tenant)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
	}
	nameApplication(cfg)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
	}
	return conn, nil
}

// Close closes every control pool.
func (c *Cluster) Close() {
	c.mu.Lock()
	pools := c.admin
	c.admin = nil
	c.closed = true
	c.mu.Unlock()
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
	i, ok := c.byName[node]
	if !ok {
		return fmt.Errorf("pgshard: unknown node %q", node)
	}
	if tenant == c.ownDB[i] {
		return nil
	}
	p, err := c.Admin(ctx, node, c.ownDB[i])
	if err != nil {
		return err
	}
	var exists bool
	if err := p.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1)`, tenant).Scan(&exists); err != nil {
		return fmt.Errorf("pgshard: node %s: look up database %q: %w", node, tenant, err)
	}
	if exists {
		return nil
	}
	_, err = p.Exec(ctx, "CREATE DATABASE "+quoteIdent(tenant))
	if sqlstate.Is(err, sqlstate.DuplicateDatabase) || sqlstate.Is(err, sqlstate.UniqueViolation) {
		// Another proxy created it first: CREATE DATABASE looks for the
		// name before it inserts it, so a concurrent one can also fail on
		// pg_database's unique index.
		err = nil
	}
	if err != nil {
		return fmt.Errorf("pgshard: node %s: create database %q: %w", node, tenant, err)
	}
	c.log.Info("created tenant database", "node", node, "tenant", tenant)
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
