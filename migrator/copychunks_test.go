package migrator

import (
	"fmt"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

func TestPageRanges(t *testing.T) {
	for _, tc := range []struct {
		pages   int64
		workers int
		want    string
	}{
		{0, 4, "[[0 -1]]"},
		{copyChunkMinPages*2 - 1, 4, "[[0 -1]]"},
		{copyChunkMinPages * 2, 4, "[[0 128] [128 -1]]"},
		{385, 4, "[[0 128] [128 256] [256 -1]]"},
		{1000, 4, "[[0 250] [250 500] [500 750] [750 -1]]"},
		{1003, 4, "[[0 250] [250 501] [501 752] [752 -1]]"},
		{1000, 2, "[[0 500] [500 -1]]"},
		{1000, 1, "[[0 -1]]"},
	} {
		if got := fmt.Sprint(pageRanges(tc.pages, tc.workers)); got != tc.want {
			t.Errorf("pageRanges(%d, %d) = %s, want %s", tc.pages, tc.workers, got, tc.want)
		}
	}
}

func TestCopyOutSQL(t *testing.T) {
	tree := &shardmap.Tree{Name: "t", KeyColumn: "k", KeyType: shardmap.KeyInt, SlotCount: 4096}
	st := &shadowTable{tree: tree, cols: []string{"k", "v"}}
	split := ShadowSpec{Tree: tree, Source: 1, Target: 2, Slots: [][2]int{{0, 9}}}
	move := ShadowSpec{Tree: tree, Source: 1, Target: 1, Slots: [][2]int{{0, 4095}}, Whole: true}
	for _, tc := range []struct {
		name string
		sp   ShadowSpec
		c    copyChunk
		want string
	}{
		{"slot filter", split, copyChunk{st: st, to: -1},
			`COPY (SELECT "k", "v" FROM "lattice_s0001"."t" WHERE (hashint8extended("k"::int8, 0) & 4095) BETWEEN 0 AND 9) TO STDOUT (FORMAT binary)`},
		{"whole table", move, copyChunk{st: st, to: -1},
			`COPY "lattice_s0001"."t" ("k", "v") TO STDOUT (FORMAT binary)`},
		{"first range", move, copyChunk{st: st, from: 0, to: 128},
			`COPY (SELECT "k", "v" FROM "lattice_s0001"."t" WHERE ctid >= '(0,0)'::tid AND ctid < '(128,0)'::tid) TO STDOUT (FORMAT binary)`},
		{"last range", move, copyChunk{st: st, from: 128, to: -1},
			`COPY (SELECT "k", "v" FROM "lattice_s0001"."t" WHERE ctid >= '(128,0)'::tid) TO STDOUT (FORMAT binary)`},
	} {
		if got := copyOutSQL(tc.sp, tc.c); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}
