package btreeindex

import (
	"bytes"
	"math"
	"math/big"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/sqlstate"
)

// Column is what the merge must know of a result column to order by it:
// its type, and the format (0 text, 1 binary) the node sends it in.
type Column struct {
	OID    uint32
	Format int16
}

// Types whose order the merge reproduces exactly; the hint of the error
// that refuses any other names them.
const supportedHint = "order by integers, numerics, floats, booleans, dates, timestamps or uuids; for text add COLLATE \"C\" to the ORDER BY item"

// typeMap decodes sort values. Scanning keeps no state in the map, so one
// map serves every merge at once.
var typeMap = pgtype.NewMap()

// false orders before true, as in PostgreSQL; the slices are never written.
var falseBytes, trueBytes = []byte{0}, []byte{1}

// value is a decoded sort value.
type value struct {
	null bool
	kind byte // 'i' integer, 'f' float, 'n' numeric, 't' time; anything else compares b bytewise (bool, uuid, C-collated text)
	i    int64
	f    float64
	n    *big.Rat
	inf  int // numeric and time infinity: -1, +1; numeric NaN is 2 (greater than all, as PostgreSQL orders it)
	b    []byte
}

// decode decodes the value of key k in row, whose columns are cols. Only
// types whose order the merge reproduces exactly are accepted: integers
// (int2, int4, int8, oid), float4 and float8, numeric, bool, uuid, date,
// timestamp and timestamptz in either format, and text, varchar and name in
// text format under a byte-order collation.
func decode(cols []Column, k SortKey, row [][]byte) (value, error) {
	if k.Column >= len(cols) || k.Column >= len(row) {
		return value{}, sqlstate.New(sqlstate.InternalError, "sort column %d out of range", k.Column)
	}
	c := cols[k.Column]
	raw := row[k.Column]
	if raw == nil {
		return value{null: true}, nil
	}
	unsupported := func() error {
		e := sqlstate.New(sqlstate.FeatureNotSupported, "ORDER BY on a column of type oid %d across several shards is not supported", c.OID)
		e.Hint = supportedHint
		return e
	}
	scan := func(dst any) error {
		if err := typeMap.Scan(c.OID, c.Format, raw, dst); err != nil {
			return sqlstate.New(sqlstate.InternalError, "decode sort key: %v", err)
		}
		return nil
	}
	switch c.OID {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		var v int64
		if err := scan(&v); err != nil {
			return value{}, err
		}
		return value{kind: 'i', i: v}, nil
	case pgtype.OIDOID:
		// pgtype scans an oid into unsigned integers only.
		var v uint32
		if err := scan(&v); err != nil {
			return value{}, err
		}
		return value{kind: 'i', i: int64(v)}, nil
	case pgtype.Float4OID, pgtype.Float8OID:
		var v float64
		if err := scan(&v); err != nil {
			return value{}, err
		}
		return value{kind: 'f', f: v}, nil
	case pgtype.NumericOID:
		var v pgtype.Numeric
		if err := scan(&v); err != nil {
			return value{}, err
		}
		return numericValue(v), nil
	case pgtype.BoolOID:
		var v bool
		if err := scan(&v); err != nil {
			return value{}, err
		}
		if v {
			return value{kind: 'b', b: trueBytes}, nil
		}
		return value{kind: 'b', b: falseBytes}, nil
	case pgtype.UUIDOID:
		var v pgtype.UUID
		if err := scan(&v); err != nil {
			return value{}, err
		}
		return value{kind: 'B', b: v.Bytes[:]}, nil
	// A date or timestamp that does not decode is one the merge cannot
	// place (a text form of another DateStyle, a year past pgtype's
	// range): refused as unsupported rather than misordered.
	case pgtype.DateOID:
		var v pgtype.Date
		if scan(&v) != nil {
			return value{}, unsupported()
		}
		return value{kind: 't', i: v.Time.Unix(), inf: int(v.InfinityModifier)}, nil
	case pgtype.TimestampOID:
		var v pgtype.Timestamp
		if scan(&v) != nil {
			return value{}, unsupported()
		}
		return value{kind: 't', i: v.Time.UnixMicro(), inf: int(v.InfinityModifier)}, nil
	case pgtype.TimestamptzOID:
		var v pgtype.Timestamptz
		if scan(&v) != nil {
			return value{}, unsupported()
		}
		return value{kind: 't', i: v.Time.UnixMicro(), inf: int(v.InfinityModifier)}, nil
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID:
		if k.ByteOrder && c.Format == 0 {
			return value{kind: 'B', b: raw}, nil
		}
	}
	return value{}, unsupported()
}

func numericValue(v pgtype.Numeric) value {
	switch {
	case v.NaN:
		return value{kind: 'n', inf: 2}
	case v.InfinityModifier != pgtype.Finite:
		return value{kind: 'n', inf: int(v.InfinityModifier)}
	}
	r := new(big.Rat).SetInt(v.Int)
	if v.Exp > 0 {
		r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(v.Exp)), nil)))
	} else if v.Exp < 0 {
		r.Quo(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-v.Exp)), nil)))
	}
	return value{kind: 'n', n: r}
}

// compareKey orders a and b, two values of key k, as PostgreSQL's ORDER BY
// does: -1 when a comes first. NULLS FIRST/LAST is a position, whichever
// the direction.
func compareKey(a, b *value, k SortKey) int {
	switch {
	case a.null && b.null:
		return 0
	case a.null:
		if k.NullsFirst {
			return -1
		}
		return 1
	case b.null:
		if k.NullsFirst {
			return 1
		}
		return -1
	}
	c := compareValues(a, b)
	if k.Desc {
		return -c
	}
	return c
}

// compareValues orders two non-null values of one key in ascending order.
func compareValues(a, b *value) int {
	switch a.kind {
	case 'i':
		return cmpInt(a.i, b.i)
	case 'f':
		// PostgreSQL orders NaN above every other value, equal to itself.
		an, bn := math.IsNaN(a.f), math.IsNaN(b.f)
		switch {
		case an && bn:
			return 0
		case an:
			return 1
		case bn:
			return -1
		case a.f < b.f:
			return -1
		case a.f > b.f:
			return 1
		}
		return 0
	case 'n':
		if a.inf != 0 || b.inf != 0 {
			return cmpInt(int64(a.inf), int64(b.inf))
		}
		return a.n.Cmp(b.n)
	case 't':
		if a.inf != 0 || b.inf != 0 {
			if c := cmpInt(int64(a.inf), int64(b.inf)); c != 0 {
				return c
			}
			if a.inf != 0 {
				return 0
			}
		}
		return cmpInt(a.i, b.i)
	}
	return bytes.Compare(a.b, b.b)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
