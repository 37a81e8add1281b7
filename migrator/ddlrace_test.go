package migrator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

// ddlProxyStore is the store as seen with one proxy running a DDL
// statement on the tree that passed its reshard check before the
// migration was recorded, planned on the map of epoch view: the proxy
// acknowledges a later epoch only once the statement has ended, and the
// statement's end appends its entry to the DDL log (end).
type ddlProxyStore struct {
	Store
	view uint64
	mu   sync.Mutex
	end  func()
}

func (s *ddlProxyStore) Lagging(ctx context.Context, tenant, tree string, epoch uint64) (shardmap.Lag, error) {
	s.mu.Lock()
	if epoch > s.view && s.end != nil {
		s.end()
		s.end = nil
	}
	s.mu.Unlock()
	return s.Store.Lagging(ctx, tenant, tree, epoch)
}

// TestTargetReplaysDDLStillRunning: DDL that passed its reshard check
// before a split or move was recorded, and records itself in the DDL log
// after the run read the tree's entry, reaches the migration's target: the
// target, in no map the statement read, is built from the DDL log read
// once every proxy acknowledged a map written after the record. The
// target was built from the entry the run read at its start, and lacked
// the column or index (a missing unique index lets duplicates in).
func TestTargetReplaysDDLStillRunning(t *testing.T) {
	for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Move} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t)
			ds := &ddlProxyStore{Store: r.store, view: r.mapNow().Epoch}
			run := newRunner(r.nodes, ds, r.opts, nil, slog.New(slog.DiscardHandler))
			var mig *shardmap.Migration
			var err error
			if kind == shardmap.Split {
				mig, err = run.StartSplit(r.ctx, r.tree, 0)
			} else {
				to := map[string]string{"n1": "n2", "n2": "n1"}[r.mapNow().Shards[0].Node]
				mig, err = run.StartMove(r.ctx, r.tree, 0, to)
			}
			if err != nil {
				t.Fatal(err)
			}
			ds.end = func() {
				r.swapTree(func(t *shardmap.Tree) {
					t.DDL = append(t.DDL, raceAlter)
					t.Columns = append(t.Columns, "color")
				})
			}
			if err := run.Run(r.ctx, mig); err != nil {
				t.Fatal(err)
			}
			r.nodes.mu.Lock()
			defer r.nodes.mu.Unlock()
			target := fmt.Sprintf("%s/%d", mig.TargetNode, mig.Target)
			if got := r.nodes.replayed[target]; !slices.Contains(got, raceAlter) {
				t.Errorf("%s target %s replayed %q, without the ALTER TABLE that ended after the run began", kind, target, got)
			}
		})
	}
}
