package admin

import (
	"context"
	"time"
)

// TreeOpStatus is a running snapshot, merge or resize of a tree
// (docs/DESIGN.md section 6a), as GET /api/status lists it.
type TreeOpStatus struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Kind      string    `json:"kind"`
	Tree      string    `json:"tree"`
	Target    string    `json:"target,omitempty"`
	Phase     string    `json:"phase"`
	RowsDone  int64     `json:"rows_done"`
	RowsTotal int64     `json:"rows_total"`
	StartedAt time.Time `json:"started_at"`
	LastError string    `json:"last_error,omitempty"`
}

// TreeOpLister lists the running tree operations of every tenant.
type TreeOpLister func(ctx context.Context) ([]TreeOpStatus, error)

// operations lists the running tree operations of the request's tenants;
// none without a lister.
func (a *API) operations(ctx context.Context, tenants []string) ([]TreeOpStatus, error) {
	out := []TreeOpStatus{}
	if a.TreeOps == nil {
		return out, nil
	}
	ops, err := a.TreeOps(ctx)
	if err != nil {
		return nil, err
	}
	for _, op := range ops {
		for _, t := range tenants {
			if op.Tenant == t {
				out = append(out, op)
				break
			}
		}
	}
	return out, nil
}
