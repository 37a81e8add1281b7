package admin

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// opsCatalog is a Catalog that lists tree operations.
type opsCatalog struct {
	Catalog
	ops []*shardmap.TreeOp
}

func (c opsCatalog) TreeOps(_ context.Context, tenant, tree string) ([]*shardmap.TreeOp, error) {
	var out []*shardmap.TreeOp
	for _, op := range c.ops {
		if op.Tenant == tenant && (op.Tree == tree || op.Target == tree) {
			out = append(out, op)
		}
	}
	return out, nil
}

// etaByID estimates an operation's time left from a table by id; an id
// missing answers err.
type etaByID struct {
	eta map[string]*float64
	err error
}

func (e etaByID) TreeOpETA(_ context.Context, op *shardmap.TreeOp, _ time.Time) (*float64, error) {
	if eta, ok := e.eta[op.ID]; ok {
		return eta, nil
	}
	return nil, e.err
}

// TestOperations: a tree's summary lists the running operations that read or
// write it, and none when the catalog keeps no operations.
func TestOperations(t *testing.T) {
	ctx := context.Background()
	if ops, err := (&API{}).treeOps(ctx, "main", "t"); err != nil || len(ops) != 0 {
		t.Fatalf("without operations: %v %v, want none", ops, err)
	}
	a := &API{Catalog: opsCatalog{ops: []*shardmap.TreeOp{
		{ID: "1", Tenant: "main", Kind: shardmap.OpSnapshot, Tree: "t", Target: "t2"},
		{ID: "2", Tenant: "other", Kind: shardmap.OpResize, Tree: "t"},
	}}}
	for _, tree := range []string{"t", "t2"} {
		ops, err := a.treeOps(ctx, "main", tree)
		if err != nil || len(ops) != 1 || ops[0].ID != "1" || ops[0].Kind != "snapshot" {
			t.Fatalf("operations of main/%s: %+v %v, want operation 1 only", tree, ops, err)
		}
	}
}

// TestOperationETA: each operation carries the estimate of its status
// function, null when there is none; an estimator's failure fails the
// request, except for a tree dropped since the list was read.
func TestOperationETA(t *testing.T) {
	ctx := context.Background()
	sixty := 60.0
	ops := opsCatalog{ops: []*shardmap.TreeOp{{ID: "1", Tenant: "main", Kind: shardmap.OpMerge, Tree: "s", Target: "t"}}}
	tests := []struct {
		name    string
		eta     TreeOpEstimator
		want    *float64
		wantErr bool
	}{
		{"no estimator", nil, nil, false},
		{"an estimate", etaByID{eta: map[string]*float64{"1": &sixty}}, &sixty, false},
		{"nothing to extrapolate from yet", etaByID{eta: map[string]*float64{"1": nil}}, nil, false},
		{"the tree was dropped", etaByID{err: shardmap.ErrNotFound}, nil, false},
		{"the store failed", etaByID{err: errors.New("redis: connection refused")}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := (&API{Catalog: ops, ETA: tc.eta}).treeOps(ctx, "main", "t")
			if tc.wantErr {
				if err == nil {
					t.Fatalf("%+v, want the estimator's error", got)
				}
				return
			}
			if err != nil || len(got) != 1 {
				t.Fatalf("%+v, %v; want operation 1", got, err)
			}
			if e := got[0].ETASeconds; (e == nil) != (tc.want == nil) || e != nil && *e != *tc.want {
				t.Errorf("ETA %s, want %s", showETA(e), showETA(tc.want))
			}
		})
	}
}

func showETA(e *float64) string {
	if e == nil {
		return "null"
	}
	return fmt.Sprint(*e)
}
