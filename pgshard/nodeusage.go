package pgshard

import (
	"context"
	"sync"
	"time"
)

// NodeUsage is what one node answers about itself for a tenant.
type NodeUsage struct {
	Reachable bool
	// Bytes is the size on disk of the tenant's shard tables there (tables,
	// indexes and TOAST in lattice_s* schemas); 0 when not reachable.
	Bytes int64
}

// nodeUsageTimeout bounds the probe of one node: lattice_nodes must answer
// while a node is down, and says so.
const nodeUsageTimeout = 3 * time.Second

// Usage probes every node for tenant, nodes in parallel. A node that does
// not answer within a few seconds is not reachable; a node without the
// tenant's database is reachable and holds no bytes of it.
func (c *Cluster) Usage(ctx context.Context, tenant string) map[string]NodeUsage {
	names := c.NodeNames()
	var mu sync.Mutex
	out := make(map[string]NodeUsage, len(names))
	_ = forEachNode(ctx, names, func(ctx context.Context, node string) error {
		u := c.usage(ctx, node, tenant)
		mu.Lock()
		out[node] = u
		mu.Unlock()
		return nil
	})
	return out
}

func (c *Cluster) usage(ctx context.Context, node, tenant string) NodeUsage {
	ctx, cancel := context.WithTimeout(ctx, nodeUsageTimeout)
	defer cancel()
	p, err := c.probePool(ctx, node)
	if err != nil {
		return NodeUsage{}
	}
	var hasDB bool
	if err := p.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1)`, tenant).Scan(&hasDB); err != nil {
		return NodeUsage{}
	}
	u := NodeUsage{Reachable: true}
	if !hasDB {
		return u
	}
	a, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return u
	}
	_ = a.QueryRow(ctx, `SELECT coalesce(sum(pg_catalog.pg_total_relation_size(c.oid)), 0)::int8
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname LIKE 'lattice\_s%' AND c.relkind = 'r'`).Scan(&u.Bytes)
	return u
}
