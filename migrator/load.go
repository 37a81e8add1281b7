package migrator

import (
	"context"
	"math"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// shardLoad is tree t's load signal summed per shard of m (zero for every
// shard when the store keeps no load signal).
func shardLoad(ctx context.Context, store Store, t *shardmap.Tree, m *shardmap.Map) (map[int]shardmap.SlotRate, error) {
	lr, ok := store.(shardmap.LoadReader)
	if !ok {
		return nil, nil
	}
	l, err := lr.TreeLoad(ctx, t.Tenant, t.Name, len(m.Slots), time.Now())
	if err != nil {
		return nil, err
	}
	return l.ByShard(m), nil
}

// roundRate keeps two decimals of a rate: what a reader of lattice_shards
// compares, without float noise.
func roundRate(r float64) float64 { return math.Round(r*100) / 100 }
