package migrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// RecoveredReference says what RecoverReferences did for one reference
// table.
type RecoveredReference struct {
	Tenant, Name string
	Nodes        []string
	Skipped      string // why it was left alone (it is registered)
}

// RecoverReferences rebuilds, for every tenant database of the catalog
// node, the registry entry of each reference table that the store lacks,
// from the catalog's list of its copies (docs/DESIGN.md section 17). Until
// it is back, proxies take the table for an ordinary one: its writes are
// refused by the fence (LT001) and joins of it with a tree are refused,
// so nothing is answered wrong, but the tenant cannot use it. A table the
// store still has is skipped.
func RecoverReferences(ctx context.Context, cluster *pgshard.Cluster, store shardmap.ReferenceStore, log *slog.Logger) ([]RecoveredReference, error) {
	if log == nil {
		log = slog.Default()
	}
	dbs, err := cluster.Databases(ctx)
	if err != nil {
		return nil, err
	}
	var out []RecoveredReference
	for _, tenant := range dbs {
		refs, err := cluster.ReadReferences(ctx, tenant)
		if err != nil {
			return out, err
		}
		if len(refs) == 0 {
			continue
		}
		kept, err := store.References(ctx, tenant)
		if err != nil {
			return out, fmt.Errorf("tenant %s: %w", tenant, err)
		}
		for _, r := range refs {
			rr := RecoveredReference{Tenant: tenant, Name: r.Name, Nodes: r.Nodes}
			if slices.ContainsFunc(kept, func(k *shardmap.Reference) bool { return k.Name == r.Name }) {
				rr.Skipped = "registered in Redis"
				out = append(out, rr)
				continue
			}
			switch err := store.PutReference(ctx, r, nil); {
			case errors.Is(err, shardmap.ErrConflict):
				rr.Skipped = "registered in Redis while it was rebuilt"
			case err != nil:
				return out, fmt.Errorf("tenant %s: reference table %s: %w", tenant, r.Name, err)
			default:
				log.Info("recover-map: reference table rebuilt", "tenant", tenant, "table", r.Name, "nodes", r.Nodes)
			}
			out = append(out, rr)
		}
	}
	return out, nil
}
