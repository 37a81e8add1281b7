package migrator

import (
	"context"
	"time"

	"github.com/lattice-db/lattice/autonomic"
	"github.com/lattice-db/lattice/shardmap"
)

// treeLoad is the load signal in Redis (docs/DESIGN.md section 4.2) as the
// monitor, the healer and a load-aware grow read it: rows written per
// second per slot.
type treeLoad struct {
	reader shardmap.LoadReader
	store  shardmap.Store
	// counting: the deployment's proxies count load, so a window without
	// a count is a quiet tree, not missing data.
	counting bool
}

// NewLoadSource reads the load signal of reader for the policy. counting
// says whether the proxies count load (--load-stats): without counting,
// an empty window is no data, and the monitor and the healer wait.
func NewLoadSource(reader shardmap.LoadReader, store shardmap.Store, counting bool) autonomic.LoadSource {
	return &treeLoad{reader: reader, store: store, counting: counting}
}

// SlotWrites implements autonomic.LoadSource.
func (l *treeLoad) SlotWrites(ctx context.Context, tenant, tree string) ([]float64, error) {
	t, err := l.store.Tree(ctx, tenant, tree)
	if err != nil {
		return nil, err
	}
	tl, err := l.reader.TreeLoad(ctx, tenant, tree, t.SlotCount, time.Now())
	if err != nil {
		return nil, err
	}
	if !l.counting && tl.Empty() {
		return nil, nil
	}
	w := make([]float64, len(tl.Slots))
	for s, r := range tl.Slots {
		w[s] = r.Rows
	}
	return w, nil
}
