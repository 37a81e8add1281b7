package admin

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// SizeCache keeps each tree's shard size estimates for a while, so that a
// page polling every second costs the nodes one statistics query per tree
// and TTL, and a slow node delays an answer by Timeout at most.
type SizeCache struct {
	fetch   SizeFunc
	ttl     time.Duration
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	entries map[[2]string]*sizeEntry // by tenant, tree
}

type sizeEntry struct {
	mu    sync.Mutex // held while fetching: concurrent readers share one fetch
	epoch uint64
	at    time.Time // of the last attempt, failed or not
	sizes map[int]ShardSize
}

// maxSizeEntries bounds the cache; past it, it starts over.
const maxSizeEntries = 1024

// NewSizeCache caches fetch's answers for ttl; one fetch may take timeout.
func NewSizeCache(fetch SizeFunc, ttl, timeout time.Duration, log *slog.Logger) *SizeCache {
	return &SizeCache{fetch: fetch, ttl: ttl, timeout: timeout, log: log, entries: map[[2]string]*sizeEntry{}}
}

// Get returns the estimates of m's shards: fresh ones, or the last ones
// known when the nodes fail or are slow (nil if there are none). A new
// epoch fetches again, since shards come and go with it.
func (c *SizeCache) Get(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) map[int]ShardSize {
	key := [2]string{t.Tenant, t.Name}
	c.mu.Lock()
	e := c.entries[key]
	if e == nil {
		if len(c.entries) >= maxSizeEntries {
			c.entries = map[[2]string]*sizeEntry{}
		}
		e = &sizeEntry{}
		c.entries[key] = e
	}
	c.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.at.IsZero() && e.epoch == m.Epoch && time.Since(e.at) < c.ttl {
		return e.sizes
	}
	fctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	sizes, err := c.fetch(fctx, t, m)
	e.at, e.epoch = time.Now(), m.Epoch
	if err != nil {
		c.log.Warn("admin: shard size estimates", "tenant", t.Tenant, "tree", t.Name, "err", err)
		return e.sizes
	}
	e.sizes = sizes
	return sizes
}
