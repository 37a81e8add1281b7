package proxy

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// binaryRows gives rows of a cursor over trees, held as the nodes' text,
// in the result formats a FETCH's Bind asked for (pgx asks for binary for
// every type it knows). PostgreSQL converts them: a helper backend, with
// the session's settings, reads each value with its type's input function
// and sends it with its send function: "SELECT $1, ..." whose parameters
// have the columns' types, bound once per row (helperQuery pipelines the
// Binds in rounds). So the bytes are the ones
// PostgreSQL sends for the value, under the DateStyle and IntervalStyle
// the text was printed in, and a type without a binary form (an anonymous
// record) fails as it would.
func (s *session) binaryRows(ctx context.Context, fields []pgproto3.FieldDescription, formats []int16, rows [][][]byte) ([][][]byte, error) {
	var cols []int
	var oids []uint32
	var query strings.Builder
	query.WriteString("SELECT ")
	for i, f := range fields {
		if formatFor(formats, i) != 1 {
			continue
		}
		if len(cols) > 0 {
			query.WriteString(", ")
		}
		cols = append(cols, i)
		oids = append(oids, f.DataTypeOID)
		query.WriteString("$" + strconv.Itoa(len(cols)))
	}
	if len(cols) == 0 || len(rows) == 0 {
		return rows, nil
	}
	binds := make([]*pgproto3.Bind, len(rows))
	for r, row := range rows {
		params := make([][]byte, len(cols))
		for k, c := range cols {
			params[k] = row[c]
		}
		binds[r] = &pgproto3.Bind{Parameters: params, ResultFormatCodes: []int16{1}}
	}
	out := make([][][]byte, 0, len(rows))
	err := s.helperQuery(ctx, &pgproto3.Parse{Query: query.String(), ParameterOIDs: oids}, binds, func(values [][]byte) error {
		if len(out) == len(rows) || len(values) != len(cols) {
			return sqlstate.New(sqlstate.InternalError, "the conversion of a cursor's rows to binary returned %d values for row %d", len(values), len(out)+1)
		}
		row := slices.Clone(rows[len(out)])
		for k, c := range cols {
			// The values are the helper's read buffer.
			row[c] = slices.Clone(values[k])
		}
		out = append(out, row)
		return nil
	})
	if err == nil && len(out) != len(rows) {
		err = sqlstate.New(sqlstate.InternalError, "the conversion of a cursor's rows to binary returned %d of %d rows", len(out), len(rows))
	}
	return out, err
}
