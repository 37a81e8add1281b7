package btreeindex

import (
	"bytes"
	"encoding/binary"
	"fmt"
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
	n    *big.Int // numeric digits that do not fit i
	exp  int32    // numeric: the value is (n or i) * 10^exp
	inf  int      // numeric and time infinity: -1, +1; numeric NaN is 2 (greater than all, as PostgreSQL orders it)
	b    []byte
}

// decode decodes the value of key k in row, whose columns are cols. Only
// types whose order the merge reproduces exactly are accepted: integers
// (int2, int4, int8, oid), float4 and float8, numeric, bool, uuid, date,
// timestamp and timestamptz in either format, and text, varchar, name and
// char(n) in either format under a byte-order collation.
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
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID:
		v, err := decodeInt(c, raw)
		if err != nil {
			return value{}, sqlstate.New(sqlstate.InternalError, "decode sort key: %v", err)
		}
		return value{kind: 'i', i: v}, nil
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
	// Text, varchar, name and char(n) send the same bytes in both formats
	// (textsend: the string in the client encoding).
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID:
		if k.ByteOrder {
			return value{kind: 'B', b: raw}, nil
		}
	case pgtype.BPCharOID:
		// char(n) compares without its trailing blanks (bpcharcmp), so
		// "a" comes before "a\x01" although its padding does not.
		if k.ByteOrder {
			return value{kind: 'B', b: bytes.TrimRight(raw, " ")}, nil
		}
	}
	return value{}, unsupported()
}

// Comparable reports whether the merge can order rows of cols by keys: each
// key's column has a type decode accepts, text-like ones only with
// ByteOrder. A key it cannot compare must be sorted by
// PostgreSQL itself (SortQuery). A date or timestamp that does not decode
// still fails at its row.
func Comparable(cols []Column, keys []SortKey) bool {
	for _, k := range keys {
		if k.Column >= len(cols) {
			return false
		}
		c := cols[k.Column]
		switch c.OID {
		case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID, pgtype.Float4OID, pgtype.Float8OID,
			pgtype.NumericOID, pgtype.BoolOID, pgtype.UUIDOID, pgtype.DateOID, pgtype.TimestampOID, pgtype.TimestamptzOID:
		case pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID, pgtype.BPCharOID:
			if !k.ByteOrder {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// Decodes reports whether decode reads every key of row (nil: no row to
// tell by, true). A date or timestamp that Comparable accepts arrives as
// text in the session's DateStyle, which the merge reads only in ISO: a
// fan-out whose first row does not decode is sorted by PostgreSQL instead.
func Decodes(cols []Column, keys []SortKey, row [][]byte) bool {
	if row == nil {
		return true
	}
	for _, k := range keys {
		if _, err := decode(cols, k, row); err != nil {
			return false
		}
	}
	return true
}

// decodeInt decodes an integer or an oid as PostgreSQL sends it: decimal
// text, or big-endian binary of the type's width. It does what pgtype's
// scans do, without the allocation of scanning through an interface, for
// the commonest sort key.
func decodeInt(c Column, raw []byte) (int64, error) {
	if c.Format == 1 {
		switch {
		case c.OID == pgtype.Int2OID && len(raw) == 2:
			return int64(int16(binary.BigEndian.Uint16(raw))), nil
		case c.OID == pgtype.Int4OID && len(raw) == 4:
			return int64(int32(binary.BigEndian.Uint32(raw))), nil
		case c.OID == pgtype.OIDOID && len(raw) == 4:
			return int64(binary.BigEndian.Uint32(raw)), nil
		case c.OID == pgtype.Int8OID && len(raw) == 8:
			return int64(binary.BigEndian.Uint64(raw)), nil
		}
		return 0, fmt.Errorf("%d bytes for a binary value of type oid %d", len(raw), c.OID)
	}
	neg, digits := false, raw
	if len(digits) > 0 && (digits[0] == '-' || digits[0] == '+') && c.OID != pgtype.OIDOID {
		neg, digits = digits[0] == '-', digits[1:]
	}
	if len(digits) == 0 {
		return 0, fmt.Errorf("invalid integer %q", raw)
	}
	limit := uint64(math.MaxInt64) // the magnitude allowed
	switch {
	case c.OID == pgtype.OIDOID:
		limit = math.MaxUint32
	case neg:
		limit = uint64(math.MaxInt64) + 1
	}
	var n uint64
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("invalid integer %q", raw)
		}
		if n > (limit-uint64(d-'0'))/10 {
			return 0, fmt.Errorf("integer %q out of range", raw)
		}
		n = n*10 + uint64(d-'0')
	}
	if neg {
		return int64(-n), nil // wraps to math.MinInt64 for its magnitude
	}
	return int64(n), nil
}

// numericValue keeps a finite numeric as its digits and exponent
// (v.Int * 10^v.Exp): in an int64 when they fit, which is the common case
// and compares without big arithmetic.
func numericValue(v pgtype.Numeric) value {
	switch {
	case v.NaN:
		return value{kind: 'n', inf: 2}
	case v.InfinityModifier != pgtype.Finite:
		return value{kind: 'n', inf: int(v.InfinityModifier)}
	}
	if v.Int.IsInt64() {
		return value{kind: 'n', i: v.Int.Int64(), exp: v.Exp}
	}
	return value{kind: 'n', n: v.Int, exp: v.Exp}
}

// compareNumeric orders two finite numerics: by sign, then by their digits
// brought to the smaller of the two exponents.
func compareNumeric(a, b *value) int {
	if sa, sb := a.sign(), b.sign(); sa != sb || sa == 0 {
		return cmpInt(int64(sa), int64(sb))
	}
	e := min(a.exp, b.exp)
	if a.n == nil && b.n == nil {
		x, okx := scaleInt(a.i, a.exp-e)
		y, oky := scaleInt(b.i, b.exp-e)
		if okx && oky {
			return cmpInt(x, y)
		}
	}
	return a.scaledBig(a.exp - e).Cmp(b.scaledBig(b.exp - e))
}

func (v *value) sign() int {
	if v.n != nil {
		return v.n.Sign()
	}
	return cmpInt(v.i, 0)
}

// scaledBig is v's digits times 10^k.
func (v *value) scaledBig(k int32) *big.Int {
	m := v.n
	if m == nil {
		m = big.NewInt(v.i)
	}
	if k == 0 {
		return m
	}
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(k)), nil)
	return p.Mul(p, m)
}

// pow10 are the powers of ten an int64 holds.
var pow10 = func() (p [19]int64) {
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = p[i-1] * 10
	}
	return p
}()

// scaleInt is x times 10^k, and whether it fits an int64.
func scaleInt(x int64, k int32) (int64, bool) {
	if k < 0 || int(k) >= len(pow10) {
		return 0, false
	}
	p := pow10[k]
	r := x * p
	return r, r/p == x
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
		return compareNumeric(a, b)
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
