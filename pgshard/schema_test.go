package pgshard

import (
	"math"
	"slices"
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
	} {
		tr := &shardmap.Tree{Name: "t", KeyColumn: tc.key, KeyType: tc.kt, SlotCount: tc.slots}
		if got := SlotExpr(tr, tc.qual); got != tc.want {
			t.Errorf("SlotExpr(%s %s) = %s, want %s", tc.kt, tc.key, got, tc.want)
		}
	}
}

func TestSlotPredicate(t *testing.T) {
	tr := &shardmap.Tree{Name: "t", KeyColumn: "k", KeyType: shardmap.KeyText, SlotCount: 4096}
	e := `(hashtextextended("k", 0) & 4095)`
	for _, tc := range []struct {
		ranges [][2]int
		want   string
	}{
		{nil, "false"},
		{[][2]int{{0, 511}}, e + " BETWEEN 0 AND 511"},
		{[][2]int{{7, 7}}, e + " = 7"},
		{[][2]int{{0, 1}, {9, 9}}, "(" + e + " BETWEEN 0 AND 1 OR " + e + " = 9)"},
	} {
		if got := SlotPredicate(tr, "", tc.ranges); got != tc.want {
			t.Errorf("SlotPredicate(%v) = %s, want %s", tc.ranges, got, tc.want)
		}
	}
}

func TestShardDDL(t *testing.T) {
	tr := &shardmap.Tree{Name: "Cat", DDL: []string{
		"CREATE TABLE {{table}} (k text)",
		`CREATE INDEX "i" ON {{table}} USING btree (k)`,
		`DROP INDEX {{schema}}."i"`,
	}}
	if got := ShardTable(tr, 5); got != `"lattice_s0005"."Cat"` {
		t.Errorf("ShardTable = %s", got)
	}
	want := []string{
		`CREATE TABLE "lattice_s0012"."Cat" (k text)`,
		`CREATE INDEX "i" ON "lattice_s0012"."Cat" USING btree (k)`,
		`DROP INDEX "lattice_s0012"."i"`,
	}
	if got := ShardDDL(tr, 12); !slices.Equal(got, want) {
		t.Errorf("ShardDDL = %q, want %q", got, want)
	}
}

func TestMultirange(t *testing.T) {
	for _, tc := range []struct {
		slots [][2]int
		want  string
	}{
		{nil, "{}"},
		{[][2]int{{0, 511}}, "{[0,512)}"},
		{[][2]int{{0, 0}, {1024, 2047}}, "{[0,1),[1024,2048)}"},
	} {
		if got := multirange(tc.slots); got != tc.want {
			t.Errorf("multirange(%v) = %s, want %s", tc.slots, got, tc.want)
		}
	}
}

func TestEpochParam(t *testing.T) {
	if v, err := epochParam(7); err != nil || v != 7 {
		t.Errorf("epochParam(7) = %d, %v", v, err)
	}
	if _, err := epochParam(math.MaxInt64 + 1); err == nil {
		t.Error("epochParam accepted an epoch beyond bigint")
	}
}

func TestSchemaRE(t *testing.T) {
	for s, want := range map[string]string{"lattice_s0005": "0005", "lattice_s12345": "12345", "lattice_s05": "", "lattice_sx": "", "lattice_s0005x": ""} {
		m := schemaRE.FindStringSubmatch(s)
		got := ""
		if m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("%s: index %q, want %q", s, got, want)
		}
	}
}
