package router

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
)

func TestArraySlots(t *testing.T) {
	const slots = 4096
	textSlots := func(kt shardmap.KeyType, keys ...string) []int {
		var out []int
		for _, k := range keys {
			s, err := shardmap.SlotForText(kt, []byte(k), slots)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	encode := func(oid uint32, v any) []byte {
		b, err := typeMap.Encode(oid, 1, v, nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name   string
		kt     shardmap.KeyType
		raw    []byte
		format int16
		oid    uint32
		want   []int
		ok     bool
	}{
		{"text ints", shardmap.KeyInt, []byte("{1, 2,NULL,300}"), 0, 0, textSlots(shardmap.KeyInt, "1", "2", "300"), true},
		{"text strings", shardmap.KeyText, []byte(`{a,"b c"}`), 0, 0, textSlots(shardmap.KeyText, "a", "b c"), true},
		{"text empty", shardmap.KeyInt, []byte("{}"), 0, 0, nil, true},
		// = ANY reads every element of a multi-dimensional array.
		{"text two dimensions", shardmap.KeyInt, []byte("{{1,2},{3,4}}"), 0, 0, textSlots(shardmap.KeyInt, "1", "2", "3", "4"), true},
		{"text not an integer", shardmap.KeyInt, []byte("{1.5}"), 0, 0, nil, false},
		{"binary int8", shardmap.KeyInt, encode(pgtype.Int8ArrayOID, []int64{1, 2, 300}), 1, 0, textSlots(shardmap.KeyInt, "1", "2", "300"), true},
		{"binary int4", shardmap.KeyInt, encode(pgtype.Int4ArrayOID, []int32{-7, 9}), 1, pgtype.Int4ArrayOID, textSlots(shardmap.KeyInt, "-7", "9"), true},
		{"binary with NULL", shardmap.KeyInt, encode(pgtype.Int8ArrayOID, []*int64{nil, new(int64)}), 1, 0, textSlots(shardmap.KeyInt, "0"), true},
		{"binary text", shardmap.KeyText, encode(pgtype.TextArrayOID, []string{"x", "y"}), 1, 0, textSlots(shardmap.KeyText, "x", "y"), true},
		{"binary float8 refused", shardmap.KeyInt, encode(pgtype.Float8ArrayOID, []float64{1}), 1, pgtype.Float8ArrayOID, nil, false},
		{"binary float8 undeclared", shardmap.KeyInt, encode(pgtype.Float8ArrayOID, []float64{1}), 1, 0, nil, false},
		{"binary truncated", shardmap.KeyInt, encode(pgtype.Int8ArrayOID, []int64{1, 2})[:30], 1, 0, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := arraySlots(c.kt, slots, c.raw, c.format, c.oid)
			if ok != c.ok || ok && !slices.Equal(got, c.want) {
				t.Fatalf("got %v %v, want %v %v", got, ok, c.want, c.ok)
			}
		})
	}
}
