package btreeindex

import "github.com/lattice-db/lattice/shardmap"

// Source is one shard a node reads for a statement over several shards:
// its schema, and a filter (a boolean SQL expression over the tree's
// unqualified columns, "" for none) that keeps only the rows of the slots
// the shard owns. A shard that may hold rows of slots it does not own (a
// fold survivor before the flip, a split source before the release) is read
// through its filter, so that no row is read twice or from the wrong shard.
type Source struct {
	Schema string
	Filter string
}

// Schemas is a Source per schema, with no filter.
func Schemas(schemas ...string) []Source {
	out := make([]Source, len(schemas))
	for i, s := range schemas {
		out[i] = Source{Schema: s}
	}
	return out
}

// NodeSources groups the shards of m that own slots by node, in shard order
// (nodes in the order of their first shard), as the Sources a read over
// several shards sends each node: a mixed shard gets the slot predicate of
// the slots it owns under m, so the read sees each row on its owner only.
// With only not nil, only the shards in it are read. t is m's tree.
func NodeSources(m *shardmap.Map, only map[int]bool, t *shardmap.Tree) (nodes []string, srcs [][]Source) {
	index := map[string]int{}
	for _, idx := range m.OwningShards() {
		if only != nil && !only[idx] {
			continue
		}
		sh := m.Shards[idx]
		g, ok := index[sh.Node]
		if !ok {
			g = len(nodes)
			index[sh.Node] = g
			nodes = append(nodes, sh.Node)
			srcs = append(srcs, nil)
		}
		src := Source{Schema: shardmap.SchemaName(idx)}
		if sh.Mixed {
			src.Filter = SlotPredicate(t, "", m.SlotRanges(idx))
		}
		srcs[g] = append(srcs[g], src)
	}
	return nodes, srcs
}
