package proxy

import (
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// loadMark names the slot counter a statement on one slot bumps when its
// CommandComplete arrives: the tag says whether it wrote and how many rows.
// The counters hang on the plan's Tree (shardmap.Tree.Counters), so marking
// costs no lookup; a zero mark (counting off, or a statement that is not a
// tree's) counts nothing.
type loadMark struct {
	c    *shardmap.SlotCounters
	slot int
	// m and shards mark a statement over whole shards of m, a fan-out's
	// part or one shard's part of an UPDATE or DELETE without the key,
	// counted by SlotCounters.Shards.
	m      *shardmap.Map
	shards []int
	// shard is the one shard a statement by its key runs on, and tree
	// the tree it names, for noteWrite (freezepass.go), counted or not.
	shard shardRef
	tree  string
}

func markLoad(p *router.Plan, t router.Target) loadMark {
	return loadMark{c: p.Tree.Counters(), slot: t.Slot, shard: shardRef{p.Tree.MapName(), t.Shard, t.Node}, tree: p.Tree.Name}
}

// markShards marks a statement of p over shards of v's map of its tree.
func markShards(v *shardmap.View, p *router.Plan, shards []int) loadMark {
	c := p.Tree.Counters()
	if c == nil {
		return loadMark{}
	}
	return loadMark{c: c, m: v.Maps[p.Tree.Name], shards: shards}
}

// markFanOut marks a fan-out over the shards of every one of its targets.
func markFanOut(v *shardmap.View, p *router.Plan, targets []router.Target) loadMark {
	if p.Tree.Counters() == nil {
		return loadMark{}
	}
	var shards []int
	for _, t := range targets {
		shards = append(shards, t.Shards...)
	}
	return markShards(v, p, shards)
}

// done counts the statement by its command tag (nil: a read).
func (m loadMark) done(tag []byte) {
	if m.c == nil {
		return
	}
	write, rows := tagWrites(tag)
	switch {
	case m.shards != nil:
		m.c.Shards(m.m, m.shards, write, rows)
	case write:
		m.c.Write(m.slot, rows)
	default:
		m.c.Read(m.slot)
	}
}

// countLoad counts the statement whose CommandComplete has tag and moves
// to the mark of the step's next statement: a Query of several
// statements, or of several parts on one node, answers one
// CommandComplete per statement, in order.
func (st *step) countLoad(tag []byte) {
	st.load.done(tag)
	if len(st.more) == 0 {
		st.load = loadMark{}
		return
	}
	st.load, st.more = st.more[0], st.more[1:]
}

// tagWrites reads a command tag: INSERT, UPDATE, DELETE, MERGE and COPY
// wrote, the tag's count being the rows written; anything else (SELECT,
// FETCH, ...) read.
func tagWrites(tag []byte) (write bool, rows int64) {
	if len(tag) == 0 {
		return false, 0
	}
	var verb string
	switch tag[0] {
	case 'I':
		verb = "INSERT "
	case 'U':
		verb = "UPDATE "
	case 'D':
		verb = "DELETE "
	case 'M':
		verb = "MERGE "
	case 'C':
		verb = "COPY "
	default:
		return false, 0
	}
	if len(tag) < len(verb) || string(tag[:len(verb)]) != verb {
		return false, 0
	}
	return true, rowsAffected(tag)
}

// countSplitRows counts the rows of a multi-row INSERT split across
// shards on their slots, when it is bound: the parts' tags give rows per
// shard, not per slot. A row that fails or that ON CONFLICT skips is
// counted all the same.
func countSplitRows(p *router.Plan, parts []router.Target) {
	c := p.Tree.Counters()
	if c == nil {
		return
	}
	for _, t := range parts {
		for _, slot := range t.RowSlots {
			c.Row(slot)
		}
	}
}
