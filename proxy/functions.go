package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Functions runs the lattice_* SQL functions. cmd/lattice wires it to the
// migrator, so the request path never imports the migrator.
type Functions interface {
	// Describe returns the result columns of function name, or an error
	// carrying 42883 when there is no such function.
	Describe(name string) ([]pgproto3.FieldDescription, error)
	// Call runs name for tenant with positional and named arguments (nil is
	// SQL NULL). Each row holds Go values of the described column types.
	Call(ctx context.Context, tenant, name string, args []*string, named map[string]*string) ([][]any, error)
}

// ArgTyper is implemented by Functions that know their arguments' types,
// so that Describe reports them as PostgreSQL would from the signature.
type ArgTyper interface {
	// ArgType is the type OID of argument pos (0-based) of fn, or of the
	// named argument when name is not empty; 0 when unknown.
	ArgType(fn string, pos int, name string) uint32
}

// funcParamType is the type Describe reports for parameter $n of f: its
// argument's type, text when unknown (text accepts any value).
func (s *session) funcParamType(f *router.FuncCall, n int) uint32 {
	if t, ok := s.srv.functions.(ArgTyper); ok {
		for i, a := range f.Args {
			if a.Param == n {
				if oid := t.ArgType(f.Name, i, ""); oid != 0 {
					return oid
				}
			}
		}
		for name, a := range f.Named {
			if a.Param == n {
				if oid := t.ArgType(f.Name, -1, name); oid != 0 {
					return oid
				}
			}
		}
	}
	return pgtype.TextOID
}

// functionGuard refuses lattice_create_tree (and the reference-table
// functions, which lock the table on connections of their own) inside a
// transaction block,
// as PostgreSQL refuses CREATE DATABASE (25001): it commits on connections
// of its own, so it would not see a table the transaction created, would
// wait forever for the transaction's own locks on it, and a ROLLBACK would
// not undo it.
func (s *session) functionGuard(name string) error {
	if (name == "lattice_create_tree" || name == "lattice_create_reference_table" || name == "lattice_undistribute_table") && s.tx.active && !s.tx.implicit {
		e := sqlstate.New(sqlstate.ActiveSQLTransaction, "%s cannot run inside a transaction block", name)
		e.Hint = "commit the transaction (the table must be committed too), then call " + name + " on its own"
		return e
	}
	return nil
}

// typeMap answers type lookups, which only read it. Encoding memoizes its
// plans in the map it runs on, so concurrent sessions take their own map
// from encodeMaps.
var typeMap = pgtype.NewMap()

var encodeMaps = sync.Pool{New: func() any { return pgtype.NewMap() }}

// funcResult is a function's rows encoded for one portal's result formats.
type funcResult struct {
	fields []pgproto3.FieldDescription
	rows   [][][]byte
}

// resultFields applies the Bind result-format codes to the described columns.
func resultFields(fields []pgproto3.FieldDescription, formats []int16) []pgproto3.FieldDescription {
	out := make([]pgproto3.FieldDescription, len(fields))
	copy(out, fields)
	for i := range out {
		out[i].Format = formatFor(formats, i)
	}
	return out
}

// formatFor reads a Bind format-code list: none means text, one applies to all.
func formatFor(formats []int16, i int) int16 {
	switch {
	case len(formats) == 0:
		return 0
	case len(formats) == 1:
		return formats[0]
	case i < len(formats):
		return formats[i]
	}
	return 0
}

func encodeRows(fields []pgproto3.FieldDescription, rows [][]any) ([][][]byte, error) {
	m := encodeMaps.Get().(*pgtype.Map)
	defer encodeMaps.Put(m)
	out := make([][][]byte, len(rows))
	for r, row := range rows {
		if len(row) != len(fields) {
			return nil, fmt.Errorf("function returned %d values for %d columns", len(row), len(fields))
		}
		vals := make([][]byte, len(row))
		for i, v := range row {
			if v == nil {
				continue
			}
			b, err := m.Encode(fields[i].DataTypeOID, fields[i].Format, v, []byte{})
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", fields[i].Name, err)
			}
			vals[i] = b
		}
		out[r] = vals
	}
	return out, nil
}

// paramText turns one Bind parameter into its text form for a function
// argument, decoding the binary forms drivers use for integers and text.
func paramText(value []byte, format int16, oid uint32) (*string, error) {
	if value == nil {
		return nil, nil
	}
	if format == 0 {
		s := string(value)
		return &s, nil
	}
	var s string
	switch oid {
	case pgtype.Int2OID:
		if len(value) != 2 {
			return nil, errBadBinary
		}
		s = strconv.Itoa(int(int16(binary.BigEndian.Uint16(value))))
	case pgtype.Int4OID:
		if len(value) != 4 {
			return nil, errBadBinary
		}
		s = strconv.Itoa(int(int32(binary.BigEndian.Uint32(value))))
	case pgtype.Int8OID:
		if len(value) != 8 {
			return nil, errBadBinary
		}
		s = strconv.FormatInt(int64(binary.BigEndian.Uint64(value)), 10)
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID, 0:
		s = string(value)
	case pgtype.BoolOID:
		if len(value) != 1 {
			return nil, errBadBinary
		}
		s = strconv.FormatBool(value[0] != 0)
	default:
		return nil, sqlstate.New(sqlstate.InvalidBinaryRepresentation, "lattice functions take text or integer arguments; got binary type oid %d", oid)
	}
	return &s, nil
}

var errBadBinary = sqlstate.New(sqlstate.InvalidBinaryRepresentation, "incorrect binary data format in bind parameter")
