package migrator

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/router"
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
		ref, n, err := f.cluster.CreateReference(ctx, rs, f.store, tenant, table, router.PerNodeValue)
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
