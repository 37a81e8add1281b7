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

// Sources are the given shards of m's tree t as the Sources a read over
// several shards sends their node: a mixed shard is read through the slot
// predicate of the slots it owns under m, so that the read sees each row on
// its owner only.
func Sources(m *shardmap.Map, t *shardmap.Tree, shards []int) []Source {
	out := make([]Source, len(shards))
	for i, idx := range shards {
		out[i] = Source{Schema: shardmap.SchemaName(idx)}
		if m.Shards[idx].Mixed {
			out[i].Filter = SlotPredicate(t, "", m.SlotRanges(idx))
		}
	}
	return out
}
