package migrator

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// The reference-table functions (docs/DESIGN.md, "Reference tables"):
// lattice_create_reference_table(table), lattice_undistribute_table(table)
// and lattice_reference_tables().

var referenceSignatures = map[string][]pgproto3.FieldDescription{
	"lattice_create_reference_table": {field("lattice_create_reference_table", pgtype.TextOID)},
	"lattice_undistribute_table":     {field("lattice_undistribute_table", pgtype.TextOID)},
	"lattice_reference_tables":       {field("table", pgtype.TextOID), field("nodes", pgtype.TextOID)},
}

var referenceArgNames = map[string][]string{
	"lattice_create_reference_table": {"table"},
	"lattice_undistribute_table":     {"table"},
	"lattice_reference_tables":       {},
}

func init() {
	maps.Copy(signatures, referenceSignatures)
	maps.Copy(argNames, referenceArgNames)
}

// callReference runs the functions of this file; ok is false for any other name.
func (f *Functions) callReference(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	params, ok := referenceArgNames[name]
	if !ok {
		return nil, false, nil
	}
	rs, isRS := f.store.(shardmap.ReferenceStore)
	if !isRS {
		return nil, true, sqlstate.New(sqlstate.FeatureNotSupported, "this map store keeps no reference tables")
	}
	a, err := bindArgs(name, args, named, params...)
	if err != nil {
		return nil, true, err
	}
	if name == "lattice_reference_tables" {
		refs, err := rs.References(ctx, tenant)
		if err != nil {
			return nil, true, err
		}
		for _, r := range refs {
			rows = append(rows, []any{r.Name, strings.Join(r.Nodes, ",")})
		}
		return rows, true, nil
	}
	table, err := required(a, "table")
	if err != nil {
		return nil, true, err
	}
	table = foldName(table)
	refresh := func(ctx context.Context) error {
		if f.cache == nil {
			return nil
		}
		_, err := f.cache.Refresh(ctx, tenant)
		return err
	}
	var msg string
	switch name {
	case "lattice_create_reference_table":
		ref, n, err := f.cluster.CreateReference(ctx, rs, f.store, tenant, table, f.perNode)
		if err != nil {
			return nil, true, err
		}
		msg = fmt.Sprintf("reference table %s: %d rows on %d nodes", ref.Name, n, len(ref.Nodes))
	case "lattice_undistribute_table":
		if err := f.cluster.UndistributeReference(ctx, rs, tenant, table, refresh); err != nil {
			return nil, true, err
		}
		msg = fmt.Sprintf("table %s is an ordinary table on the catalog node again", table)
	}
	if err := refresh(ctx); err != nil {
		return nil, true, fmt.Errorf("%s, but refreshing the map cache failed: %w", msg, err)
	}
	return [][]any{{msg}}, true, nil
}

// referenceTenants lists the tenants that have reference tables
// (shardmap.RedisStore).
type referenceTenants interface {
	TenantsWithReferences(ctx context.Context) ([]string, error)
}

// releaseReferences takes node out of every tenant's reference tables
// before lattice_remove_node takes it out of the registry: otherwise every
// later write of those tables would wait for a copy on a node no proxy
// reaches (08006).
func (f *Functions) releaseReferences(ctx context.Context, node string) error {
	return f.eachReferenceTenant(ctx, func(rs shardmap.ReferenceStore, tenant string) error {
		if err := f.cluster.ReleaseReferences(ctx, rs, tenant, node); err != nil {
			return err
		}
		if f.cache != nil {
			// This proxy's next write goes to the copies left at once; the
			// others read the registry's event.
			if _, err := f.cache.Refresh(ctx, tenant); err != nil {
				return fmt.Errorf("node %s released its reference tables, but refreshing the map cache failed: %w", node, err)
			}
		}
		return nil
	})
}

// restoreReferences gives node back the copies releaseReferences took, for
// a removal undone because a shard was placed there meanwhile (its joins
// need them).
func (f *Functions) restoreReferences(ctx context.Context, node string) error {
	return f.eachReferenceTenant(ctx, func(rs shardmap.ReferenceStore, tenant string) error {
		return f.cluster.CopyReferences(ctx, rs, tenant, node)
	})
}

// eachReferenceTenant calls fn for every tenant with reference tables,
// and stops at its first error.
func (f *Functions) eachReferenceTenant(ctx context.Context, fn func(shardmap.ReferenceStore, string) error) error {
	rs, ok := f.store.(shardmap.ReferenceStore)
	lister, listed := f.store.(referenceTenants)
	if !ok || !listed {
		return nil
	}
	tenants, err := lister.TenantsWithReferences(ctx)
	if err != nil {
		return err
	}
	for _, tenant := range tenants {
		if err := fn(rs, tenant); err != nil {
			return err
		}
	}
	return nil
}
