package shardmap

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tenants lists the tenants this cache has been asked about, sorted: the
// ones this proxy has served (or been asked to report) since it started.
func (c *Cache) Tenants() []string {
	var out []string
	c.tenants.Range(func(k, _ any) bool {
		out = append(out, k.(string))
		return true
	})
	slices.Sort(out)
	return out
}

// CachedEpoch is the epoch of tree's map in this cache's view of tenant;
// false when the tenant is not loaded or has no such tree.
func (c *Cache) CachedEpoch(tenant, tree string) (uint64, bool) {
	v, ok := c.tenants.Load(tenant)
	if !ok {
		return 0, false
	}
	view := v.(*tenantCache).view.Load()
	if view == nil {
		return 0, false
	}
	m := view.Maps[tree]
	if m == nil {
		return 0, false
	}
	return m.Epoch, true
}

// ProxyLease is a live proxy of the registry and when its lease runs out.
type ProxyLease struct {
	ID      string
	Expires time.Time
}

// ProxyLeases lists the live proxies with their lease expiry, soonest first.
func (s *RedisStore) ProxyLeases(ctx context.Context) ([]ProxyLease, error) {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	zs, err := s.client.ZRangeByScoreWithScores(ctx, s.proxiesKey(), &redis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: proxy leases: %w", err)
	}
	out := make([]ProxyLease, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		out = append(out, ProxyLease{ID: id, Expires: time.UnixMilli(int64(z.Score)).UTC()})
	}
	return out, nil
}
