package proxy

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/sqlstate"
)

// A fan-out's ORDER BY is merged in the proxy when the merge can compare
// its keys as PostgreSQL does (btreeindex.Comparable): numbers, dates
// (binary, or text in DateStyle ISO), uuids, and text under a collation
// that orders bytes (COLLATE "C", or a column or database whose collation
// is C, POSIX or C.UTF-8, as the collation probe says). Otherwise the rows
// are gathered and PostgreSQL orders them on the
// catalog node (btreeindex.SortQuery), so that text under en_US, an ICU
// collation or any other sorts exactly as one node would sort it.

// sortKeys returns the keys to merge by, with the collations the probe
// found; inPostgres is non-nil (one collation per key) when the rows must
// be ordered by PostgreSQL instead. It may read the first part's first row
// to learn the columns.
func (f *fanOut) sortKeys(s *session, x *exchange, parts []*partSource) (keys []btreeindex.SortKey, inPostgres []string, err error) {
	keys = f.plan.Sort
	if len(keys) == 0 || len(parts) < 2 {
		return keys, nil, nil
	}
	if f.fields == nil {
		// The simple protocol's RowDescription comes with the first rows.
		row, err := parts[0].Next(f.ctx)
		if err != nil {
			return nil, nil, err
		}
		parts[0].first, parts[0].primed = row, true
	}
	if f.fields == nil || x.errored {
		return keys, nil, nil
	}
	cols := parts[0].Columns()
	// In the simple protocol the first row is at hand: a date in another
	// DateStyle than ISO shows there that the merge cannot read the keys.
	mergeable := func() bool {
		return btreeindex.Comparable(cols, keys) && btreeindex.Decodes(cols, keys, parts[0].first)
	}
	if mergeable() || f.plan.CollationProbe == "" {
		return keys, nil, nil // without a probe every key has COLLATE "C": the merge names what it cannot order
	}
	c, err := s.collationsOf(f.ctx, f.plan.CollationProbe, len(keys))
	if err != nil {
		return nil, nil, err
	}
	keys = append([]btreeindex.SortKey(nil), keys...)
	for i := range keys {
		keys[i].ByteOrder = keys[i].ByteOrder || c.bytes[i]
	}
	if mergeable() {
		return keys, nil, nil
	}
	for i, k := range keys {
		if c.names[i] == "" && textType(cols[k.Column].OID) {
			e := sqlstate.New(sqlstate.FeatureNotSupported, "the proxy cannot tell the collation of ORDER BY item %d over several shards", i+1)
			e.Hint = `add COLLATE "C" (or the collation you mean) to the ORDER BY item, or fix the shard key in WHERE to read one shard`
			return nil, nil, e
		}
	}
	return keys, c.names, nil
}

// mayCollate reports whether a column of one of oids may have a
// collation: any type but the built-in ones known to have none.
func mayCollate(oids []uint32) bool {
	for _, oid := range oids {
		switch oid {
		case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID, pgtype.Float4OID, pgtype.Float8OID,
			pgtype.NumericOID, pgtype.BoolOID, pgtype.UUIDOID, pgtype.DateOID, pgtype.TimestampOID,
			pgtype.TimestamptzOID, pgtype.IntervalOID, pgtype.ByteaOID, pgtype.JSONOID, pgtype.JSONBOID:
		default:
			return true
		}
	}
	return false
}

func textType(oid uint32) bool {
	switch oid {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID:
		return true
	}
	return false
}

// sortInPostgres gathers every part's rows, has PostgreSQL order them by
// keys under collations, and emits them in that order. The rows held count
// against --max-merge-memory.
func (f *fanOut) sortInPostgres(s *session, x *exchange, parts []*partSource, keys []btreeindex.SortKey, collations []string, emit func([][]byte)) error {
	var rows [][][]byte
	held := f.held
	for _, ps := range parts {
		for {
			var row [][]byte
			if ps.primed {
				row, ps.primed = ps.first, false
			} else {
				r, err := f.next(s, x, ps.p, true)
				if err != nil {
					return err
				}
				if row = r; row != nil {
					held += rowSize(row)
					if e := s.overMemory(held); e != nil && !x.errored {
						x.errored = true
						s.send(e.Response())
						s.stopParts()
					}
				}
			}
			if row == nil {
				break
			}
			if x.errored {
				continue
			}
			if !f.checked {
				if err := f.checkFields(); err != nil {
					x.errored = true
					s.send(sqlstate.As(err).Response())
					continue
				}
				f.checked = true
			}
			rows = append(rows, row)
		}
	}
	if x.errored || len(rows) == 0 {
		return nil
	}
	order, err := s.postgresOrder(f.ctx, keys, collations, f.cols, rows)
	if err != nil {
		x.errored = true
		s.send(sqlstate.As(err).Response())
		return nil
	}
	for _, i := range order {
		emit(rows[i])
	}
	return nil
}

// postgresOrder runs SortQuery for rows on a pooled catalog-node backend and
// returns the rows' indexes in PostgreSQL's order.
func (s *session) postgresOrder(ctx context.Context, keys []btreeindex.SortKey, collations []string, cols []btreeindex.Column, rows [][][]byte) ([]int, error) {
	if len(rows)*len(keys) > btreeindex.MaxSortParams {
		e := sqlstate.New(sqlstate.ProgramLimitExceeded, "ORDER BY over several shards under this collation sorts at most %d values in PostgreSQL; this statement has %d rows", btreeindex.MaxSortParams, len(rows))
		e.Hint = `add COLLATE "C" to the text ORDER BY items to merge in the proxy, add a LIMIT, or narrow the WHERE clause`
		return nil, e
	}
	sql, oids, formats := btreeindex.SortQuery(keys, collations, cols, len(rows))
	order := make([]int, 0, len(rows))
	seen := make([]bool, len(rows))
	// The sort values are the nodes' text: they parse as the session's.
	err := s.helperQuery(ctx, &pgproto3.Parse{Query: sql, ParameterOIDs: oids},
		[]*pgproto3.Bind{{Parameters: btreeindex.SortValues(keys, rows), ParameterFormatCodes: formats}},
		func(values [][]byte) error {
			i, err := strconv.Atoi(string(values[0]))
			if err != nil || i < 1 || i > len(rows) || seen[i-1] {
				return sqlstate.New(sqlstate.InternalError, "the sort in PostgreSQL returned row %q", values[0])
			}
			seen[i-1] = true
			order = append(order, i-1)
			return nil
		})
	if err == nil && len(order) != len(rows) {
		err = sqlstate.New(sqlstate.InternalError, "the sort in PostgreSQL returned %d of %d rows", len(order), len(rows))
	}
	return order, err
}
