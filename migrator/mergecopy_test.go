package migrator

import (
	"slices"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

func mergeTree(name, key string, kt shardmap.KeyType, cols ...string) *shardmap.Tree {
	return &shardmap.Tree{Tenant: "t", Name: name, KeyColumn: key, KeyType: kt, Columns: cols, SlotCount: 4096}
}

func TestCheckMerge(t *testing.T) {
	src := mergeTree("a", "id", shardmap.KeyInt, "id", "v", "ts")
	for _, tc := range []struct {
		name       string
		target     *shardmap.Tree
		onConflict string
		code       string // "" for accepted
	}{
		{"source wins", mergeTree("b", "id", shardmap.KeyInt, "id", "v", "ts"), "source", ""},
		{"target wins, extra target column", mergeTree("b", "id", shardmap.KeyInt, "id", "v", "ts", "x"), "target", ""},
		{"newer wins", mergeTree("b", "id", shardmap.KeyInt, "id", "v", "ts"), "ts", ""},
		{"same tree", mergeTree("a", "id", shardmap.KeyInt, "id", "v", "ts"), "source", sqlstate.InvalidParameterValue},
		{"key types differ", mergeTree("b", "id", shardmap.KeyText, "id", "v", "ts"), "source", sqlstate.DatatypeMismatch},
		{"key columns differ", mergeTree("b", "k", shardmap.KeyInt, "k", "id", "v", "ts"), "source", sqlstate.DatatypeMismatch},
		{"target lacks a column", mergeTree("b", "id", shardmap.KeyInt, "id", "v"), "source", sqlstate.UndefinedColumn},
		{"unknown rule", mergeTree("b", "id", shardmap.KeyInt, "id", "v", "ts"), "nope", sqlstate.InvalidParameterValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMerge(src, tc.target, tc.onConflict)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !sqlstate.Is(err, tc.code) {
				t.Fatalf("got %v, want SQLSTATE %s", err, tc.code)
			}
			if sqlstate.As(err).Hint == "" {
				t.Fatalf("no hint: %v", err)
			}
		})
	}
}

func TestUpsertClause(t *testing.T) {
	src := mergeTree("a", "id", shardmap.KeyInt, "id", "v", "ts")
	for _, tc := range []struct {
		rule string
		want string
	}{
		{"source", `ON CONFLICT ("id") DO UPDATE SET "v" = EXCLUDED."v", "ts" = EXCLUDED."ts"`},
		{"target", `ON CONFLICT ("id") DO NOTHING`},
		{"ts", `ON CONFLICT ("id") DO UPDATE SET "v" = EXCLUDED."v", "ts" = EXCLUDED."ts" WHERE EXCLUDED."ts" IS NOT NULL AND (t."ts" IS NULL OR EXCLUDED."ts" > t."ts")`},
	} {
		if got := upsertClause(MergeSpec{Source: src, OnConflict: tc.rule}, []string{"id"}); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.rule, got, tc.want)
		}
	}
	// A tree of key columns only has nothing to update.
	keys := mergeTree("a", "id", shardmap.KeyInt, "id")
	if got := upsertClause(MergeSpec{Source: keys, OnConflict: "source"}, []string{"id"}); got != `ON CONFLICT ("id") DO NOTHING` {
		t.Errorf("keys only: %s", got)
	}
}

func TestIntersect(t *testing.T) {
	for _, tc := range []struct {
		a, b, want [][2]int
	}{
		{[][2]int{{0, 4095}}, [][2]int{{10, 20}, {30, 40}}, [][2]int{{10, 20}, {30, 40}}},
		{[][2]int{{0, 15}, {20, 25}}, [][2]int{{10, 22}}, [][2]int{{10, 15}, {20, 22}}},
		{[][2]int{{0, 9}}, [][2]int{{10, 20}}, nil},
		{[][2]int{{5, 5}}, [][2]int{{0, 4095}}, [][2]int{{5, 5}}},
	} {
		if got := intersect(tc.a, tc.b); !slices.Equal(got, tc.want) {
			t.Errorf("intersect(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestSourcesChanged(t *testing.T) {
	m := shardmap.NewIdentityMap("t", "a", 16, 4, []string{"n1", "n2"})
	rec := MergeSources(m)
	if len(rec) != 4 || SourcesChanged(rec, m) {
		t.Fatalf("recorded %v; changed on the same map", rec)
	}
	fold := m.Clone()
	for s := 4; s < 8; s++ {
		fold.Slots[s] = 0 // shard 1 folded into shard 0
	}
	fold.Shards[1] = shardmap.Shard{Index: 1, Node: "n2", State: shardmap.ShardRetired}
	if !SourcesChanged(rec, fold) {
		t.Fatal("a fold that retired a recorded shard is not seen")
	}
	move := m.Clone()
	move.Shards[2] = shardmap.Shard{Index: 2, Node: "n2", State: shardmap.ShardActive}
	if !SourcesChanged(rec, move) {
		t.Fatal("a move of a recorded shard is not seen")
	}
}
