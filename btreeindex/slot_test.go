package btreeindex

import (
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

func TestSlotExpr(t *testing.T) {
	for _, tc := range []struct {
		kt        shardmap.KeyType
		key, qual string
		slots     int
		want      string
	}{
		{shardmap.KeyText, "sku", "", 4096, `(hashtextextended("sku", 0) & 4095)`},
		{shardmap.KeyInt, "id", "", 4096, `(hashint8extended("id"::int8, 0) & 4095)`},
		{shardmap.KeyUUID, "id", "", 4096, `(uuid_hash_extended("id", 0) & 4095)`},
		{shardmap.KeyText, `Odd "Key"`, `"lattice_s0005"."t"`, 1024, `(hashtextextended("lattice_s0005"."t"."Odd ""Key""", 0) & 1023)`},
		{shardmap.KeyInt, "id", "x", 2, `(hashint8extended(x."id"::int8, 0) & 1)`},
		{shardmap.KeyUUID, "Id", "NEW", 16, `(uuid_hash_extended(NEW."Id", 0) & 15)`},
		// PostgreSQL identifiers cannot hold NUL: dropped, as pgx does.
		{shardmap.KeyText, "k\x00ey", "", 4096, `(hashtextextended("key", 0) & 4095)`},
	} {
		tr := &shardmap.Tree{Name: "t", KeyColumn: tc.key, KeyType: tc.kt, SlotCount: tc.slots}
		if got := SlotExpr(tr, tc.qual); got != tc.want {
			t.Errorf("SlotExpr(%s %q) = %s, want %s", tc.kt, tc.key, got, tc.want)
		}
	}
}

func TestSlotExprRefusesUnknownKeyType(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("SlotExpr accepted an unknown key type")
		}
	}()
	SlotExpr(&shardmap.Tree{Name: "t", KeyColumn: "k", KeyType: "jsonb", SlotCount: 4096}, "")
}

func TestSlotPredicate(t *testing.T) {
	for _, tc := range []struct {
		kt     shardmap.KeyType
		qual   string
		ranges [][2]int
		want   string
	}{
		{shardmap.KeyText, "", nil, "false"},
		{shardmap.KeyText, "", [][2]int{{0, 511}}, `(hashtextextended("k", 0) & 4095) BETWEEN 0 AND 511`},
		{shardmap.KeyText, "", [][2]int{{7, 7}}, `(hashtextextended("k", 0) & 4095) = 7`},
		{shardmap.KeyText, "", [][2]int{{0, 1}, {9, 9}},
			`((hashtextextended("k", 0) & 4095) BETWEEN 0 AND 1 OR (hashtextextended("k", 0) & 4095) = 9)`},
		{shardmap.KeyInt, "", [][2]int{{2048, 4095}}, `(hashint8extended("k"::int8, 0) & 4095) BETWEEN 2048 AND 4095`},
		{shardmap.KeyInt, "OLD", [][2]int{{0, 0}, {5, 6}, {4095, 4095}},
			`((hashint8extended(OLD."k"::int8, 0) & 4095) = 0 OR (hashint8extended(OLD."k"::int8, 0) & 4095) BETWEEN 5 AND 6 OR (hashint8extended(OLD."k"::int8, 0) & 4095) = 4095)`},
		{shardmap.KeyUUID, "", [][2]int{{100, 200}}, `(uuid_hash_extended("k", 0) & 4095) BETWEEN 100 AND 200`},
		{shardmap.KeyUUID, "", nil, "false"},
	} {
		tr := &shardmap.Tree{Name: "t", KeyColumn: "k", KeyType: tc.kt, SlotCount: 4096}
		if got := SlotPredicate(tr, tc.qual, tc.ranges); got != tc.want {
			t.Errorf("SlotPredicate(%s, %q, %v) = %s, want %s", tc.kt, tc.qual, tc.ranges, got, tc.want)
		}
	}
}
