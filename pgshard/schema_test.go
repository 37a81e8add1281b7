package pgshard

import (
	"math"
	"slices"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

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
