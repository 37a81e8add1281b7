package btreeindex

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestComparable says which keys the merge orders itself: text-like
// columns only under a byte-order collation and in text format, and no
// type it cannot decode.
func TestComparable(t *testing.T) {
	text, bpchar := Column{OID: pgtype.TextOID}, Column{OID: pgtype.BPCharOID}
	for _, c := range []struct {
		name string
		cols []Column
		keys []SortKey
		want bool
	}{
		{"integers", []Column{int8Text}, []SortKey{{Column: 0}}, true},
		{"text without byte order", []Column{text}, []SortKey{{Column: 0}}, false},
		{"text under C", []Column{text}, []SortKey{{Column: 0, ByteOrder: true}}, true},
		{"char(n) under C", []Column{bpchar}, []SortKey{{Column: 0, ByteOrder: true}}, true},
		{"char(n) without byte order", []Column{bpchar}, []SortKey{{Column: 0}}, false},
		{"text under C in binary: the same bytes", []Column{{OID: pgtype.TextOID, Format: 1}}, []SortKey{{Column: 0, ByteOrder: true}}, true},
		{"char(n) without byte order in binary", []Column{{OID: pgtype.BPCharOID, Format: 1}}, []SortKey{{Column: 0}}, false},
		{"interval", []Column{{OID: pgtype.IntervalOID}}, []SortKey{{Column: 0}}, false},
		{"one key of two not comparable", []Column{int8Text, text}, []SortKey{{Column: 0}, {Column: 1}}, false},
		{"a key past the columns", []Column{int8Text}, []SortKey{{Column: 1}}, false},
	} {
		if got := Comparable(c.cols, c.keys); got != c.want {
			t.Errorf("%s: Comparable = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestDecodes tells a first row the merge can read from one it cannot: a
// date or timestamp in text form is read in DateStyle ISO only.
func TestDecodes(t *testing.T) {
	ts, date := Column{OID: pgtype.TimestamptzOID}, Column{OID: pgtype.DateOID}
	for _, c := range []struct {
		name string
		cols []Column
		row  [][]byte
		want bool
	}{
		{"no row", []Column{ts}, nil, true},
		{"ISO", []Column{ts}, [][]byte{[]byte("1970-01-02 03:46:40+00")}, true},
		{"German", []Column{ts}, [][]byte{[]byte("02.01.1970 03:46:40 UTC")}, false},
		{"SQL date", []Column{date}, [][]byte{[]byte("01/02/1970")}, false},
		{"NULL", []Column{date}, [][]byte{nil}, true},
		{"integers", []Column{int8Text}, [][]byte{[]byte("42")}, true},
	} {
		if got := Decodes(c.cols, []SortKey{{Column: 0}}, c.row); got != c.want {
			t.Errorf("%s: Decodes = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestDecodeBPChar orders char(n) under C as bpcharcmp does: without its
// trailing blanks, so "a" (padded) comes before "a\x01" (padded).
func TestDecodeBPChar(t *testing.T) {
	k := SortKey{ByteOrder: true}
	cols := []Column{{OID: pgtype.BPCharOID}}
	a, err := decode(cols, k, [][]byte{[]byte("a   ")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := decode(cols, k, [][]byte{[]byte("a\x01  ")})
	if err != nil {
		t.Fatal(err)
	}
	if compareValues(&a, &b) >= 0 {
		t.Error(`char(n) "a" does not come before "a\x01"`)
	}
	c, _ := decode(cols, k, [][]byte{[]byte("a")})
	if compareValues(&a, &c) != 0 {
		t.Error(`char(n) "a   " and "a" differ`)
	}
}

// TestMergeOneSourceAnyType passes one source's rows through in its own
// order, whatever the type of the key: the node has sorted them.
func TestMergeOneSourceAnyType(t *testing.T) {
	cols := []Column{{OID: pgtype.TextOID}}
	src := newFake(t, "only", cols, textRows([]string{"b"}, []string{"a"}))
	m := NewMerge([]SortKey{{Column: 0}}, []RowSource{src})
	got, err := drain(t, testCtx(), m)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"b", "a"}) {
		t.Errorf("rows %v, want [b a]", got)
	}
}

func TestSortQuery(t *testing.T) {
	keys := []SortKey{{Column: 1, Desc: true, NullsFirst: true}, {Column: 0}}
	cols := []Column{{OID: pgtype.Int4OID, Format: 1}, {OID: pgtype.BPCharOID}}
	sql, oids, formats := SortQuery(keys, []string{`"en-US-x-icu"`, ""}, cols, 2)
	want := `SELECT lattice_i FROM (VALUES ($1, $2, 1), ($3, $4, 2)) AS lattice_v(lattice_k1, lattice_k2, lattice_i)` +
		` ORDER BY lattice_k1 COLLATE "en-US-x-icu" DESC NULLS FIRST, lattice_k2 ASC NULLS LAST, lattice_i`
	if sql != want {
		t.Errorf("sql\n%s\nwant\n%s", sql, want)
	}
	if !reflect.DeepEqual(oids, []uint32{pgtype.BPCharOID, pgtype.Int4OID, pgtype.BPCharOID, pgtype.Int4OID}) {
		t.Errorf("oids %v", oids)
	}
	if !reflect.DeepEqual(formats, []int16{0, 1, 0, 1}) {
		t.Errorf("formats %v", formats)
	}
	vals := SortValues(keys, [][][]byte{{[]byte("1"), []byte("x")}, {[]byte("2"), nil}})
	if !reflect.DeepEqual(vals, [][]byte{[]byte("x"), []byte("1"), nil, []byte("2")}) {
		t.Errorf("values %q", vals)
	}
}

func TestValidCollation(t *testing.T) {
	for name, want := range map[string]bool{
		`"default"`: true, `"en-US-x-icu"`: true, `"C"`: true, `public."my ""odd"" one"`: true, `pg_catalog."POSIX"`: true,
		`ucs_basic`: true, ``: false, `"`: false, `""`: false, `"x"; DROP TABLE t`: false, `"a".`: false, `Upper`: false,
	} {
		if got := ValidCollation(name); got != want {
			t.Errorf("ValidCollation(%q) = %v, want %v", name, got, want)
		}
	}
}
