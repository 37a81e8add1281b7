package admin

import (
	"context"
	"errors"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TreeOpLister lists a tree's running tree operations (snapshot, merge,
// resize; shardmap.TreeOps). A Catalog that implements it (the RedisStore
// does) has them shown with each tree.
type TreeOpLister interface {
	TreeOps(ctx context.Context, tenant, tree string) ([]*shardmap.TreeOp, error)
}

// TreeOpEstimator estimates the seconds a running tree operation has left
// with the code of the operation's status function, so that the page and
// lattice_snapshot_status, lattice_merge_status and lattice_resize_status
// tell one estimate; migrator.Functions implements it. nil: none known yet.
type TreeOpEstimator interface {
	TreeOpETA(ctx context.Context, op *shardmap.TreeOp, now time.Time) (*float64, error)
}

// TreeOpInfo is one running tree operation of a tree, as its record holds
// it, and its ETA.
type TreeOpInfo struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Tree      string    `json:"tree"`
	Target    string    `json:"target,omitempty"`
	Phase     string    `json:"phase"`
	RowsDone  int64     `json:"rows_done"`
	RowsTotal int64     `json:"rows_total"`
	Started   time.Time `json:"started"`
	LastError string    `json:"last_error,omitempty"`
	// ETASeconds is null while the operation has nothing to extrapolate
	// from, as the status functions' eta_seconds is NULL.
	ETASeconds *float64 `json:"eta_seconds"`
}

// treeOps lists the operations that read or write tree; none when the
// catalog keeps no tree operations.
func (a *API) treeOps(ctx context.Context, tenant, tree string) ([]TreeOpInfo, error) {
	l, ok := a.Catalog.(TreeOpLister)
	if !ok {
		return nil, nil
	}
	ops, err := l.TreeOps(ctx, tenant, tree)
	if err != nil {
		return nil, err
	}
	var out []TreeOpInfo
	now := time.Now()
	for _, op := range ops {
		info := TreeOpInfo{ID: op.ID, Kind: string(op.Kind), Tree: op.Tree, Target: op.Target, Phase: op.Phase,
			RowsDone: op.RowsDone, RowsTotal: op.RowsTotal, Started: op.Started, LastError: op.LastError}
		if a.ETA != nil {
			info.ETASeconds, err = a.ETA.TreeOpETA(ctx, op, now)
			if err != nil && !errors.Is(err, shardmap.ErrNotFound) { // a tree dropped since the list was read has none
				return nil, err
			}
		}
		out = append(out, info)
	}
	return out, nil
}
