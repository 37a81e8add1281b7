package pgshard

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// ReadReferences rebuilds the registry entries of tenant's reference
// tables from the catalog node's lattice_meta.reference_tables, the list
// of copies every write is checked against (the fence); for lattice
// recover-map. Created is now: the catalog does not keep it. A database
// without the table has none.
func (c *Cluster) ReadReferences(ctx context.Context, tenant string) ([]*shardmap.Reference, error) {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return nil, err
	}
	var exists bool
	err = p.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, referenceMeta).Scan(&exists)
	switch {
	case sqlstate.Is(err, sqlstate.InvalidCatalogName):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("pgshard: reference tables of %s on the catalog node: %w", tenant, err)
	case !exists:
		return nil, nil
	}
	rows, err := p.Query(ctx, `SELECT name, nodes FROM `+referenceMeta+` ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("pgshard: reference tables of %s on the catalog node: %w", tenant, err)
	}
	now := time.Now().UTC()
	var out []*shardmap.Reference
	var r shardmap.Reference
	_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Nodes}, func() error {
		out = append(out, &shardmap.Reference{Tenant: tenant, Name: r.Name, Nodes: slices.Sorted(slices.Values(r.Nodes)), Created: now})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgshard: reference tables of %s on the catalog node: %w", tenant, err)
	}
	return out, nil
}
