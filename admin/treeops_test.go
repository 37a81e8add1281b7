package admin

import (
	"context"
	"testing"
)

// TestOperations: the status lists the running tree operations of the
// request's tenants only, and none without a lister.
func TestOperations(t *testing.T) {
	ctx := context.Background()
	a := &API{}
	if ops, err := a.operations(ctx, []string{"main"}); err != nil || ops == nil || len(ops) != 0 {
		t.Fatalf("without a lister: %v %v, want an empty list", ops, err)
	}
	a.TreeOps = func(context.Context) ([]TreeOpStatus, error) {
		return []TreeOpStatus{{ID: "1", Tenant: "main", Kind: "snapshot", Tree: "t", Target: "t2"}, {ID: "2", Tenant: "other", Kind: "resize", Tree: "u"}}, nil
	}
	ops, err := a.operations(ctx, []string{"main"})
	if err != nil || len(ops) != 1 || ops[0].ID != "1" {
		t.Fatalf("operations of main: %+v %v, want operation 1 only", ops, err)
	}
}
