package admin

import (
	"context"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TreeOpLister lists a tree's running tree operations (snapshot, merge,
// resize; shardmap.TreeOps). A Catalog that implements it (the RedisStore
// does) has them shown with each tree.
type TreeOpLister interface {
	TreeOps(ctx context.Context, tenant, tree string) ([]*shardmap.TreeOp, error)
}

// TreeOpInfo is one running tree operation of a tree, as its record holds it.
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
	for _, op := range ops {
		out = append(out, TreeOpInfo{ID: op.ID, Kind: string(op.Kind), Tree: op.Tree, Target: op.Target, Phase: op.Phase,
			RowsDone: op.RowsDone, RowsTotal: op.RowsTotal, Started: op.Started, LastError: op.LastError})
	}
	return out, nil
}
