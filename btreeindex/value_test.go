package btreeindex

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestDecodeOrder decodes, for every type the merge orders, values in their
// text form (as a node sends them) and in binary, and checks that they
// compare in the order listed, equal where a group lists several spellings
// of one value, and equal across the two formats.
func TestDecodeOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		oid  uint32
		dst  func() any // a pgtype value to turn the text form into binary
		// ascending groups of equal values, in text form
		groups [][]string
	}{
		{"int2", pgtype.Int2OID, func() any { return new(pgtype.Int2) },
			[][]string{{"-32768"}, {"-1"}, {"0", "-0"}, {"1"}, {"32767"}}},
		{"int4", pgtype.Int4OID, func() any { return new(pgtype.Int4) },
			[][]string{{"-2147483648"}, {"-7"}, {"0"}, {"7"}, {"2147483647"}}},
		{"int8", pgtype.Int8OID, func() any { return new(pgtype.Int8) },
			[][]string{{"-9223372036854775808"}, {"-1"}, {"0"}, {"1"}, {"10"}, {"9223372036854775807"}}},
		{"oid", pgtype.OIDOID, func() any { return new(pgtype.Uint32) },
			[][]string{{"0"}, {"1"}, {"4294967295"}}},
		{"float4", pgtype.Float4OID, func() any { return new(pgtype.Float4) },
			[][]string{{"-Infinity"}, {"-1.5"}, {"0", "-0"}, {"0.125"}, {"3.25"}, {"Infinity"}, {"NaN"}}},
		{"float8", pgtype.Float8OID, func() any { return new(pgtype.Float8) },
			[][]string{{"-Infinity"}, {"-1e+300"}, {"-0.5"}, {"0", "-0"}, {"2.5"}, {"1e+300"}, {"Infinity"}, {"NaN"}}},
		{"numeric", pgtype.NumericOID, func() any { return new(pgtype.Numeric) },
			[][]string{{"-Infinity"}, {"-123456789012345678901234567890.5"}, {"-1", "-1.000"}, {"0", "0.00"},
				{"0.000001"}, {"1", "1.0", "1.00"}, {"1.5"}, {"1000000000000000000000000000000"}, {"Infinity"}, {"NaN"}}},
		{"bool", pgtype.BoolOID, func() any { return new(pgtype.Bool) },
			[][]string{{"f"}, {"t"}}},
		{"uuid", pgtype.UUIDOID, func() any { return new(pgtype.UUID) },
			[][]string{{"00000000-0000-0000-0000-000000000000"}, {"00000000-0000-0000-0000-0000000000ff"},
				{"7f000000-0000-0000-0000-000000000000"}, {"80000000-0000-0000-0000-000000000000", "80000000000000000000000000000000"},
				{"ffffffff-ffff-ffff-ffff-ffffffffffff"}}},
		{"date", pgtype.DateOID, func() any { return new(pgtype.Date) },
			[][]string{{"-infinity"}, {"1969-12-31"}, {"1970-01-01"}, {"2000-01-01"}, {"2024-02-29"}, {"infinity"}}},
		{"timestamp", pgtype.TimestampOID, func() any { return new(pgtype.Timestamp) },
			[][]string{{"-infinity"}, {"1969-12-31 23:59:59.999999"}, {"1970-01-01 00:00:00"}, {"1999-12-31 23:59:59.999999"},
				{"2000-01-01 00:00:00", "2000-01-01 00:00:00.000"}, {"infinity"}}},
		{"timestamptz", pgtype.TimestamptzOID, func() any { return new(pgtype.Timestamptz) },
			// the instant orders, not the text: +02 is two hours earlier
			[][]string{{"-infinity"}, {"2000-01-01 01:00:00+02"}, {"2000-01-01 00:00:00+00", "1999-12-31 23:00:00-01"},
				{"1999-12-31 23:30:00-01"}, {"infinity"}}},
	} {
		// Values are exact in either format: a float4's shortest text is
		// read at float8 precision, in the order of the float4 values but
		// not equal to the binary value read back (1e-10 is not).
		t.Run(c.name, func(t *testing.T) {
			type decoded struct {
				group int
				text  string
				v     value
			}
			var all []decoded
			for g, group := range c.groups {
				for _, text := range group {
					tv, err := decode([]Column{{OID: c.oid}}, SortKey{}, [][]byte{[]byte(text)})
					if err != nil {
						t.Fatalf("decode text %q: %v", text, err)
					}
					dst := c.dst()
					if err := typeMap.Scan(c.oid, 0, []byte(text), dst); err != nil {
						t.Fatalf("scan %q: %v", text, err)
					}
					bin, err := typeMap.Encode(c.oid, 1, dst, nil)
					if err != nil {
						t.Fatalf("encode %q: %v", text, err)
					}
					bv, err := decode([]Column{{OID: c.oid, Format: 1}}, SortKey{}, [][]byte{bin})
					if err != nil {
						t.Fatalf("decode binary %q: %v", text, err)
					}
					if compareValues(&tv, &bv) != 0 {
						t.Errorf("%q: text and binary differ", text)
					}
					all = append(all, decoded{g, text, tv}, decoded{g, text + " (binary)", bv})
				}
			}
			for _, a := range all {
				for _, b := range all {
					want := cmpInt(int64(a.group), int64(b.group))
					if got := compareValues(&a.v, &b.v); got != want {
						t.Errorf("compare(%s, %s) = %d, want %d", a.text, b.text, got, want)
					}
				}
			}
		})
	}
}

// TestDecodeText orders text, varchar and name only under a byte-order
// collation, in either format: both send the string's bytes.
func TestDecodeText(t *testing.T) {
	c := SortKey{ByteOrder: true}
	for _, oid := range []uint32{pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID} {
		for _, format := range []int16{0, 1} {
			var prev value
			for i, s := range []string{"", "A", "B", "a", "ab", "b", "é"} {
				v, err := decode([]Column{{OID: oid, Format: format}}, c, [][]byte{[]byte(s)})
				if err != nil {
					t.Fatalf("oid %d %q: %v", oid, s, err)
				}
				if i > 0 && compareValues(&prev, &v) >= 0 {
					t.Errorf("oid %d: %q does not follow the value before it", oid, s)
				}
				prev = v
			}
		}
		for _, bad := range []struct {
			k      SortKey
			format int16
		}{{SortKey{}, 0}, {SortKey{}, 1}} {
			_, err := decode([]Column{{OID: oid, Format: bad.format}}, bad.k, [][]byte{[]byte("a")})
			var e *sqlstate.Error
			if !errors.As(err, &e) || e.Code != sqlstate.FeatureNotSupported || e.Hint == "" {
				t.Errorf("oid %d, byte order %v, format %d: %v; want 0A000 with a hint", oid, bad.k.ByteOrder, bad.format, err)
			}
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		col  Column
		k    SortKey
		row  [][]byte
		code string
	}{
		{"jsonb", Column{OID: pgtype.JSONBOID}, SortKey{}, [][]byte{[]byte(`{}`)}, sqlstate.FeatureNotSupported},
		{"interval", Column{OID: pgtype.IntervalOID}, SortKey{}, [][]byte{[]byte("1 day")}, sqlstate.FeatureNotSupported},
		{"bytea", Column{OID: pgtype.ByteaOID}, SortKey{ByteOrder: true}, [][]byte{[]byte(`\x00`)}, sqlstate.FeatureNotSupported},
		{"a date the merge cannot place", Column{OID: pgtype.DateOID}, SortKey{}, [][]byte{[]byte("not a date")}, sqlstate.FeatureNotSupported},
		{"an integer that does not parse", Column{OID: pgtype.Int4OID}, SortKey{}, [][]byte{[]byte("x")}, sqlstate.InternalError},
		{"a binary float8 of the wrong size", Column{OID: pgtype.Float8OID, Format: 1}, SortKey{}, [][]byte{{1, 2}}, sqlstate.InternalError},
		{"a key past the row", Column{OID: pgtype.Int4OID}, SortKey{Column: 1}, [][]byte{[]byte("1")}, sqlstate.InternalError},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := decode([]Column{c.col}, c.k, c.row)
			var e *sqlstate.Error
			if !errors.As(err, &e) || e.Code != c.code {
				t.Errorf("decode: %v, want SQLSTATE %s", err, c.code)
			}
		})
	}
}

func TestDecodeNull(t *testing.T) {
	// A NULL needs no type: it is placed by the key's null order alone.
	v, err := decode([]Column{{OID: pgtype.JSONBOID}}, SortKey{}, [][]byte{nil})
	if err != nil || !v.null {
		t.Fatalf("decode NULL = %+v, %v", v, err)
	}
	one := value{kind: 'i', i: 1}
	for _, c := range []struct {
		k    SortKey
		want int // compareKey(NULL, 1)
	}{
		{SortKey{}, 1},
		{SortKey{NullsFirst: true}, -1},
		{SortKey{Desc: true, NullsFirst: true}, -1},
		{SortKey{Desc: true}, 1},
	} {
		if got := compareKey(&v, &one, c.k); got != c.want {
			t.Errorf("%s: compare(NULL, 1) = %d, want %d", c.k.Order(), got, c.want)
		}
		if got := compareKey(&one, &v, c.k); got != -c.want {
			t.Errorf("%s: compare(1, NULL) = %d, want %d", c.k.Order(), got, -c.want)
		}
		if got := compareKey(&v, &v, c.k); got != 0 {
			t.Errorf("%s: compare(NULL, NULL) = %d, want 0", c.k.Order(), got)
		}
	}
}

func TestDecodeInt(t *testing.T) {
	for _, c := range []struct {
		col  Column
		raw  []byte
		want int64
		bad  bool
	}{
		{Column{OID: pgtype.Int8OID}, []byte("-9223372036854775808"), math.MinInt64, false},
		{Column{OID: pgtype.Int8OID}, []byte("9223372036854775807"), math.MaxInt64, false},
		{Column{OID: pgtype.Int8OID}, []byte("9223372036854775808"), 0, true},
		{Column{OID: pgtype.Int8OID}, []byte("-9223372036854775809"), 0, true},
		{Column{OID: pgtype.Int4OID}, []byte("+12"), 12, false},
		{Column{OID: pgtype.Int4OID}, []byte("-0"), 0, false},
		{Column{OID: pgtype.Int4OID}, []byte("-"), 0, true},
		{Column{OID: pgtype.Int4OID}, []byte(""), 0, true},
		{Column{OID: pgtype.Int4OID}, []byte("1 "), 0, true},
		{Column{OID: pgtype.OIDOID}, []byte("4294967295"), math.MaxUint32, false},
		{Column{OID: pgtype.OIDOID}, []byte("4294967296"), 0, true},
		{Column{OID: pgtype.OIDOID}, []byte("-1"), 0, true},
		{Column{OID: pgtype.Int2OID, Format: 1}, []byte{0xff, 0xfe}, -2, false},
		{Column{OID: pgtype.Int4OID, Format: 1}, []byte{0x80, 0, 0, 0}, math.MinInt32, false},
		{Column{OID: pgtype.OIDOID, Format: 1}, []byte{0xff, 0xff, 0xff, 0xff}, math.MaxUint32, false},
		{Column{OID: pgtype.Int8OID, Format: 1}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, -1, false},
		{Column{OID: pgtype.Int8OID, Format: 1}, []byte{0, 0, 0, 1}, 0, true},
		{Column{OID: pgtype.Int2OID, Format: 1}, []byte{0, 0, 0, 1}, 0, true},
	} {
		got, err := decodeInt(c.col, c.raw)
		if c.bad != (err != nil) || !c.bad && got != c.want {
			t.Errorf("decodeInt(oid %d format %d, %q) = %d, %v; want %d, error %v", c.col.OID, c.col.Format, c.raw, got, err, c.want, c.bad)
		}
	}
}

// TestCompareNumeric compares random numerics, small and large, against
// exact rational arithmetic.
func TestCompareNumeric(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	random := func() (value, *big.Rat) {
		var digits *big.Int
		switch rng.IntN(4) {
		case 0: // digits beyond an int64
			digits = new(big.Int).Mul(big.NewInt(rng.Int64()), big.NewInt(rng.Int64()))
		case 1: // the extremes of an int64
			digits = big.NewInt([]int64{math.MaxInt64, math.MinInt64, 0, 1, -1}[rng.IntN(5)])
		default:
			digits = big.NewInt(rng.Int64N(2000000) - 1000000)
		}
		if rng.IntN(2) == 0 {
			digits.Neg(digits)
		}
		exp := int32(rng.IntN(50) - 25)
		r := new(big.Rat).SetInt(digits)
		p := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(exp, -exp))), nil))
		if exp >= 0 {
			r.Mul(r, p)
		} else {
			r.Quo(r, p)
		}
		return numericValue(pgtype.Numeric{Int: digits, Exp: exp, Valid: true}), r
	}
	for range 20000 {
		a, ra := random()
		b, rb := random()
		if got, want := compareValues(&a, &b), ra.Cmp(rb); got != want {
			t.Fatalf("compare(%s, %s) = %d, want %d", ra.FloatString(30), rb.FloatString(30), got, want)
		}
	}
}
