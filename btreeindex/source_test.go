package btreeindex

import (
	"reflect"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

func TestSources(t *testing.T) {
	tree := &shardmap.Tree{Name: "t", KeyColumn: "k", KeyType: shardmap.KeyInt, SlotCount: 16}
	// Shard 1 is a split source before its release: it owns slots 4-5 and
	// still holds 6-7, which shard 4 now owns.
	m := shardmap.NewIdentityMap("db", "t", 16, 4, []string{"n1", "n2"})
	m.Slots[6], m.Slots[7] = 4, 4
	m.Shards[4] = shardmap.Shard{Index: 4, Node: "n1", State: shardmap.ShardActive}
	sh := m.Shards[1]
	sh.Mixed = true
	m.Shards[1] = sh
	owned := `(hashint8extended("k"::int8, 0) & 15) BETWEEN 4 AND 5`

	for _, c := range []struct {
		name   string
		shards []int
		want   []Source
	}{
		{"no mixed shard", []int{0, 2, 4}, []Source{{Schema: "lattice_s0000"}, {Schema: "lattice_s0002"}, {Schema: "lattice_s0004"}}},
		{"the mixed one through its slots", []int{1, 3}, []Source{{Schema: "lattice_s0001", Filter: owned}, {Schema: "lattice_s0003"}}},
		{"none", nil, []Source{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Sources(m, tree, c.shards); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %v\nwant %v", got, c.want)
			}
		})
	}
}

func TestSchemas(t *testing.T) {
	got := Schemas("lattice_s0001", "Odd Schema")
	want := []Source{{Schema: "lattice_s0001"}, {Schema: "Odd Schema"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Schemas = %v, want %v", got, want)
	}
}
