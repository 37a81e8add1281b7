package shardmap

import (
	"context"
	"errors"
)

// NodeTrees answers from the nodes whether a tenant has trees: the
// catalog node keeps every tree's fenced template whatever happens to
// Redis. pgshard.Cluster implements it.
type NodeTrees interface {
	HasTrees(ctx context.Context, tenant string) (bool, error)
}

// ErrMapsMissing marks a view whose tenant has trees on the nodes but none
// in the store: Redis lost its data (FLUSHALL, a restart without AOF, a
// fresh Redis). Serving it as a tenant without trees would read the empty
// templates; `lattice recover-map` rebuilds the maps.
var ErrMapsMissing = errors.New("shardmap: the tenant's trees are on the nodes but their maps are missing from the store")

// CheckNodes makes the cache ask n, whenever the store lists no tree for
// a tenant, whether the nodes hold some: then the view it installs is
// Missing. Call it before the cache is used.
func (c *Cache) CheckNodes(n NodeTrees) { c.nodes = n }

// missing reports whether a tenant whose store lists trees is missing
// maps that the nodes show it has, and the list to serve. FLUSHALL, and a
// lost Redis Cluster slot, take all of a tenant's keys at once (they share
// one hash tag), so only an empty list is checked, and a tenant with trees
// in the store costs nothing. A tree made after the list was read has its
// template committed only after its registration: the list is read again
// once the nodes answered, and a tree in it is such a one, not a loss
// (TestNodeRegistryAcrossProxies once saw a proxy refuse every statement
// with LT002 for a tree another proxy had just made).
func (c *Cache) missing(ctx context.Context, tenant string, trees []*Tree) ([]*Tree, bool, error) {
	if c.nodes == nil || len(trees) > 0 {
		return trees, false, nil
	}
	has, err := c.nodes.HasTrees(ctx, tenant)
	if err != nil || !has {
		return trees, false, err
	}
	again, err := c.store.Trees(ctx, tenant)
	if err != nil {
		return nil, false, err
	}
	return again, len(again) == 0, nil
}
