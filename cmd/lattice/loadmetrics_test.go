package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/shardmap"
)

// TestLoadCollector exports one series per shard of each served tree, with
// the shard's node, from the load signal in Redis.
func TestLoadCollector(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	store := shardmap.NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "")
	defer store.Close()
	tree := &shardmap.Tree{Tenant: "app", Name: "orders", KeyColumn: "id", KeyType: shardmap.KeyInt,
		Columns: []string{"id"}, SlotCount: 16, ShardCount: 4, DDL: []string{"CREATE TABLE {{table}} (id bigint PRIMARY KEY)"}}
	if err := store.CreateTree(ctx, tree, shardmap.NewIdentityMap("app", "orders", 16, 4, []string{"n1", "n2"})); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// Slots 4-7 are shard 1's, on n2.
	if err := store.AddLoad(ctx, "app", "orders", now.Add(-shardmap.LoadBucket), []shardmap.SlotDelta{{Slot: 5, Writes: 300}, {Slot: 6, Writes: 300, Reads: 30}}); err != nil {
		t.Fatal(err)
	}
	cache := shardmap.NewCache(store, 0, nil)
	if _, err := cache.View(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&loadCollector{cache: cache, load: store, log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{} // metric -> shard/node -> value
	for _, f := range families {
		got[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["tenant"] != "app" || labels["tree"] != "orders" {
				t.Fatalf("labels %v", labels)
			}
			got[f.GetName()][labels["shard"]+"/"+labels["node"]] = m.GetGauge().GetValue()
		}
	}
	secs := shardmap.LoadWindow.Seconds()
	w := got["lattice_shard_writes_per_second"]
	if len(w) != 4 || w["1/n2"] != 600/secs || w["0/n1"] != 0 {
		t.Fatalf("writes %v", w)
	}
	if r := got["lattice_shard_reads_per_second"]; len(r) != 4 || r["1/n2"] != 30/secs {
		t.Fatalf("reads %v", r)
	}
	if n := got["lattice_shard_rows_written_per_second"]; len(n) != 4 {
		t.Fatalf("rows written %v", n)
	}
}
