package main

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lattice-db/lattice/shardmap"
)

// loadCollector exports the load signal per shard (not per slot, so that
// the series stay as few as the shards): the deployment's rates, summed
// over every proxy, for the trees of the tenants this proxy serves. Every
// proxy exports the same sums, so a query takes one proxy's (max), not a
// sum over proxies.
type loadCollector struct {
	cache *shardmap.Cache
	load  shardmap.LoadReader
	log   *slog.Logger

	mu      sync.Mutex
	at      time.Time // of the last read; a read serves scrapes for one bucket
	metrics []prometheus.Metric
}

// maxLoadMetricTrees bounds the trees one scrape reads from Redis.
const maxLoadMetricTrees = 256

var (
	loadReads   = prometheus.NewDesc("lattice_shard_reads_per_second", "Statements on one slot that wrote nothing, per second, summed over the shard's slots and every proxy, over the last 30 s.", []string{"tenant", "tree", "shard", "node"}, nil)
	loadWrites  = prometheus.NewDesc("lattice_shard_writes_per_second", "Statements on one slot that wrote (INSERT, UPDATE, DELETE, MERGE), per second, summed over the shard's slots and every proxy, over the last 30 s.", []string{"tenant", "tree", "shard", "node"}, nil)
	loadWritten = prometheus.NewDesc("lattice_shard_rows_written_per_second", "Rows those statements and COPY FROM wrote, per second, summed over the shard's slots and every proxy, over the last 30 s.", []string{"tenant", "tree", "shard", "node"}, nil)
)

func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- loadReads
	ch <- loadWrites
	ch <- loadWritten
}

func (c *loadCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.metrics == nil || time.Since(c.at) >= shardmap.LoadBucket {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.metrics = c.read(ctx)
		cancel()
		c.at = time.Now()
	}
	for _, m := range c.metrics {
		ch <- m
	}
}

func (c *loadCollector) read(ctx context.Context) []prometheus.Metric {
	out := []prometheus.Metric{}
	trees := 0
	now := time.Now()
	for _, tenant := range c.cache.Tenants() {
		v, err := c.cache.View(ctx, tenant)
		if err != nil {
			c.log.Warn("load metrics: read the shard maps", "tenant", tenant, "err", err)
			continue
		}
		names := make([]string, 0, len(v.Trees))
		for name := range v.Trees {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			if trees++; trees > maxLoadMetricTrees {
				return out
			}
			m := v.Maps[name]
			l, err := c.load.TreeLoad(ctx, tenant, name, len(m.Slots), now)
			if err != nil {
				c.log.Warn("load metrics: read the load signal", "tenant", tenant, "tree", name, "err", err)
				return out
			}
			for idx, r := range l.ByShard(m) {
				labels := []string{tenant, name, strconv.Itoa(idx), m.Shards[idx].Node}
				out = append(out,
					prometheus.MustNewConstMetric(loadReads, prometheus.GaugeValue, r.Reads, labels...),
					prometheus.MustNewConstMetric(loadWrites, prometheus.GaugeValue, r.Writes, labels...),
					prometheus.MustNewConstMetric(loadWritten, prometheus.GaugeValue, r.Rows, labels...))
			}
		}
	}
	return out
}
