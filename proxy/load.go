package proxy

import (
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// loadMark names the slot counter a statement on one slot bumps when its
// CommandComplete arrives: the tag says whether it wrote and how many rows.
// The counters hang on the plan's Tree (shardmap.Tree.Counters), so marking
// costs no lookup; a zero mark (counting off, or a statement over several
// shards) counts nothing.
type loadMark struct {
	c    *shardmap.SlotCounters
	slot int
}

func markLoad(p *router.Plan, t router.Target) loadMark {
	return loadMark{c: p.Tree.Counters(), slot: t.Slot}
}

// done counts the statement by its command tag.
func (m loadMark) done(tag []byte) {
	if m.c == nil {
		return
	}
	if write, rows := tagWrites(tag); write {
		m.c.Write(m.slot, rows)
	} else {
		m.c.Read(m.slot)
	}
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
