package shardmap

import (
	"context"
	"log/slog"
	"time"
)

// DefaultLoadPublish is how often a proxy publishes its load counters.
const DefaultLoadPublish = 5 * time.Second

// LoadPublisher adds, every interval, what a Cache's trees counted since
// the last time into the load signal in Redis (load.go). Counts that fail
// to reach Redis are dropped, not kept for later: the signal is a rate
// over a window, and a late count would land in the wrong bucket.
type LoadPublisher struct {
	cache *Cache
	w     LoadWriter
	every time.Duration
	log   *slog.Logger
}

// NewLoadPublisher publishes c's counters (c must count them: CountLoad)
// to w every interval (<= 0 means DefaultLoadPublish). A nil log means
// slog.Default().
func NewLoadPublisher(c *Cache, w LoadWriter, every time.Duration, log *slog.Logger) *LoadPublisher {
	if every <= 0 {
		every = DefaultLoadPublish
	}
	if log == nil {
		log = slog.Default()
	}
	return &LoadPublisher{cache: c, w: w, every: every, log: log}
}

// Run publishes until ctx ends.
func (p *LoadPublisher) Run(ctx context.Context) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.Publish(ctx, now)
		}
	}
}

// Publish adds every cached tree's counts since the last Publish into the
// bucket that holds now, one tree at a time, each within one interval.
func (p *LoadPublisher) Publish(ctx context.Context, now time.Time) {
	p.cache.tenants.Range(func(_, v any) bool {
		view := v.(*tenantCache).view.Load()
		if view == nil {
			return true
		}
		for name, t := range view.Trees {
			if t.counters == nil {
				continue
			}
			d := t.counters.take()
			if len(d) == 0 {
				continue
			}
			tctx, cancel := context.WithTimeout(ctx, p.every)
			err := p.w.AddLoad(tctx, view.Tenant, name, now, d)
			cancel()
			if err != nil && ctx.Err() == nil {
				p.log.WarnContext(ctx, "shardmap: publishing load counters failed; this interval's counts are dropped",
					"tenant", view.Tenant, "tree", name, "slots", len(d), "err", err)
			}
		}
		return ctx.Err() == nil
	})
}
