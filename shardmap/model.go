// Package shardmap holds the per-tree shard map (virtual slot -> physical
// shard -> node), PostgreSQL-compatible key hashing, and the Redis store that
// keeps maps versioned by epoch.
package shardmap

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
)

// DefaultSlotCount is the number of virtual slots a tree gets unless it
// declares another power of two.
const DefaultSlotCount = 4096

// KeyType is the hashing family of a shard key column.
type KeyType string

const (
	KeyText KeyType = "text" // text, varchar: hashtextextended
	KeyInt  KeyType = "int"  // int2, int4, int8: hashint8extended(k::int8)
	KeyUUID KeyType = "uuid" // uuid: uuid_hash_extended
)

// ErrUnsupportedKeyType is returned for a key column type Lattice cannot hash
// the way PostgreSQL does.
var ErrUnsupportedKeyType = errors.New("unsupported shard key type")

// KeyTypeFor maps a PostgreSQL type name, as format_type() prints it, to the
// hashing family of a shard key.
func KeyTypeFor(pgType string) (KeyType, error) {
	t := strings.ToLower(strings.TrimSpace(pgType))
	if i := strings.IndexByte(t, '('); i >= 0 {
		t = t[:i]
	}
	switch t {
	case "text", "character varying", "varchar":
		return KeyText, nil
	case "smallint", "integer", "bigint", "int2", "int4", "int8":
		return KeyInt, nil
	case "uuid":
		return KeyUUID, nil
	}
	return "", fmt.Errorf("%w %q: use text, varchar, smallint, integer, bigint or uuid", ErrUnsupportedKeyType, pgType)
}

// Tree is the registry entry of a distributed table.
type Tree struct {
	Tenant     string    `json:"tenant"`
	Name       string    `json:"name"`
	KeyColumn  string    `json:"key_column"`
	KeyType    KeyType   `json:"key_type"`
	Columns    []string  `json:"columns"` // column names in table order, for INSERT without a column list
	SlotCount  int       `json:"slot_count"`
	ShardCount int       `json:"shard_count"`
	DDL        []string  `json:"ddl"` // statements that build a shard table; "{{table}}" stands for the qualified name
	Created    time.Time `json:"created"`
	// Group names the tree's colocation group (group.go); "" for a tree
	// alone. Once set it never changes.
	Group string `json:"group,omitempty"`
	// AutosplitOff and AutohealOff switch the autonomic split monitor and
	// over-split healing off for this tree
	// (lattice_set_tree_option(tree, 'autosplit'|'autoheal', false)).
	AutosplitOff bool `json:"autosplit_off,omitempty"`
	AutohealOff  bool `json:"autoheal_off,omitempty"`

	counters *SlotCounters // this proxy's load counters (loadcount.go); set by a Cache
}

// ShardState is the life-cycle state of a physical shard.
type ShardState string

const (
	ShardActive  ShardState = "active"
	ShardPending ShardState = "pending" // a split target being filled; owns no slot yet
	ShardRetired ShardState = "retired" // a fold donor; a tombstone that redirects old maps
)

// Shard is one physical shard: a schema lattice_sNNNN on one node.
type Shard struct {
	Index int        `json:"index"`
	Node  string     `json:"node"`
	State ShardState `json:"state"`
	// Mixed marks a shard that may hold rows of slots it does not own (a
	// fold survivor before the flip, a split source before the release):
	// scans read it with a predicate on its own slots.
	Mixed bool `json:"mixed,omitempty"`
}

// Map is a tree's routing table at one epoch.
type Map struct {
	Tenant    string        `json:"tenant"`
	Tree      string        `json:"tree"`
	Epoch     uint64        `json:"epoch"`
	Slots     SlotList      `json:"slots"` // slot -> shard index
	Shards    map[int]Shard `json:"shards"`
	HighWater int           `json:"high_water"` // next shard index to allocate; never goes back
	// Frozen slots are moving: proxies hold statements for them until a
	// later map unfreezes them.
	Frozen [][2]int `json:"frozen,omitempty"`
	// Freezing slots are about to freeze: no statement is held for them,
	// but a proxy acknowledges the map only once the statements it planned
	// on them before it have ended, so the freeze that follows finds none
	// left to wait for (docs/DESIGN.md section 5, step 4).
	Freezing [][2]int `json:"freezing,omitempty"`
}

// IsFrozen reports whether slot is frozen.
func (m *Map) IsFrozen(slot int) bool { return inRanges(m.Frozen, slot) }

// IsFreezing reports whether slot is about to freeze.
func (m *Map) IsFreezing(slot int) bool { return inRanges(m.Freezing, slot) }

// inRanges reports whether slot lies in one of the inclusive ranges.
func inRanges(ranges [][2]int, slot int) bool {
	for _, r := range ranges {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// SchemaName is the schema that holds shard idx on its node.
func SchemaName(idx int) string { return fmt.Sprintf("lattice_s%04d", idx) }

// IsSchemaName reports whether name is one SchemaName makes.
func IsSchemaName(name string) bool { return schemaNamePattern.MatchString(name) }

var schemaNamePattern = regexp.MustCompile(`^lattice_s[0-9]{4,}$`)

// NewIdentityMap spreads slotCount slots over shardCount shards in contiguous,
// equal ranges (shard i owns [i*S/n, (i+1)*S/n)), placing shard i on
// nodes[i % len(nodes)].
func NewIdentityMap(tenant, tree string, slotCount, shardCount int, nodes []string) *Map {
	m := &Map{
		Tenant:    tenant,
		Tree:      tree,
		Epoch:     1,
		Slots:     make([]int, slotCount),
		Shards:    make(map[int]Shard, shardCount),
		HighWater: shardCount,
	}
	for i := 0; i < shardCount; i++ {
		m.Shards[i] = Shard{Index: i, Node: nodes[i%len(nodes)], State: ShardActive}
		lo, hi := i*slotCount/shardCount, (i+1)*slotCount/shardCount
		for s := lo; s < hi; s++ {
			m.Slots[s] = i
		}
	}
	return m
}

// SlotCount is the number of virtual slots of the map.
func (m *Map) SlotCount() int { return len(m.Slots) }

// Owner is the shard that owns slot.
func (m *Map) Owner(slot int) Shard { return m.Shards[m.Slots[slot]] }

// SlotRanges lists the inclusive [lo, hi] slot ranges owned by shard idx.
func (m *Map) SlotRanges(idx int) [][2]int {
	var out [][2]int
	for s := 0; s < len(m.Slots); s++ {
		if m.Slots[s] != idx {
			continue
		}
		if n := len(out); n > 0 && out[n-1][1] == s-1 {
			out[n-1][1] = s
		} else {
			out = append(out, [2]int{s, s})
		}
	}
	return out
}

// SlotCounts is the number of slots each shard owns; shards owning none are absent.
func (m *Map) SlotCounts() map[int]int {
	c := make(map[int]int)
	for _, idx := range m.Slots {
		c[idx]++
	}
	return c
}

// DistinctShards is the number of shards that own at least one slot.
func (m *Map) DistinctShards() int { return len(m.SlotCounts()) }

// OwningShards lists the indices of shards that own at least one slot, in order.
// Every fan-out asks it, so it walks the slots without a map: a shard owns
// runs of slots, and a shard index is small (below the high-water mark).
func (m *Map) OwningShards() []int {
	var seen []bool
	var out []int
	prev := -1
	for _, idx := range m.Slots {
		if idx == prev || idx < 0 {
			continue
		}
		prev = idx
		if idx >= len(seen) {
			seen = append(seen, make([]bool, idx+1-len(seen))...)
		}
		if !seen[idx] {
			seen[idx] = true
			out = append(out, idx)
		}
	}
	sort.Ints(out)
	return out
}

// Clone returns a deep copy that can be changed and written back.
func (m *Map) Clone() *Map {
	c := *m
	c.Slots = append([]int(nil), m.Slots...)
	c.Frozen = append([][2]int(nil), m.Frozen...)
	c.Freezing = append([][2]int(nil), m.Freezing...)
	c.Shards = make(map[int]Shard, len(m.Shards))
	for k, v := range m.Shards {
		c.Shards[k] = v
	}
	return &c
}
