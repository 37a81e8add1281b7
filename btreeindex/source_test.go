package btreeindex

import (
	"reflect"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

func TestNodeSources(t *testing.T) {
	tree := &shardmap.Tree{Name: "t", KeyColumn: "k", KeyType: shardmap.KeyInt, SlotCount: 16}
	// Four shards on two nodes, n1 holding 0 and 2. Shard 1 is a split
	// source before its release: it owns slots 4-5 and still holds 6-7,
	// which shard 4, on n1, now owns.
	m := shardmap.NewIdentityMap("db", "t", 16, 4, []string{"n1", "n2"})
	m.Slots[6], m.Slots[7] = 4, 4
	m.Shards[4] = shardmap.Shard{Index: 4, Node: "n1", State: shardmap.ShardActive}
	sh := m.Shards[1]
	sh.Mixed = true
	m.Shards[1] = sh
	owned := `(hashint8extended("k"::int8, 0) & 15) BETWEEN 4 AND 5`

	for _, c := range []struct {
		name  string
		only  map[int]bool
		nodes []string
		srcs  [][]Source
	}{
		{
			name:  "every shard: the mixed one through its slots",
			nodes: []string{"n1", "n2"},
			srcs: [][]Source{
				{{Schema: "lattice_s0000"}, {Schema: "lattice_s0002"}, {Schema: "lattice_s0004"}},
				{{Schema: "lattice_s0001", Filter: owned}, {Schema: "lattice_s0003"}},
			},
		},
		{
			name:  "some shards",
			only:  map[int]bool{1: true, 4: true},
			nodes: []string{"n2", "n1"},
			srcs:  [][]Source{{{Schema: "lattice_s0001", Filter: owned}}, {{Schema: "lattice_s0004"}}},
		},
		{
			name: "none",
			only: map[int]bool{},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes, srcs := NodeSources(m, c.only, tree)
			if !reflect.DeepEqual(nodes, c.nodes) || !reflect.DeepEqual(srcs, c.srcs) {
				t.Errorf("got %v %v\nwant %v %v", nodes, srcs, c.nodes, c.srcs)
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
