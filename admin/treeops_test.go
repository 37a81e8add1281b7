package admin

import (
	"context"
	"testing"

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
