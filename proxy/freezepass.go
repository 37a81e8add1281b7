package proxy

import (
	"slices"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// A transaction that wrote to a shard holds its table's ROW EXCLUSIVE lock
// until it ends, and a freeze's fence (CREATE TRIGGER on every member table
// of the source shard, SHARE ROW EXCLUSIVE) waits for it. Held at the
// freeze, the transaction's next statement on the moving slots would wait
// for the flip, which waits for the fence: a cycle that only the freeze's
// budget broke. Under TPC-C, 368 of 380 transactions blocking a fence's arm
// were idle in transaction so, for a median 1.5 s, and 9 of 31 freezes
// rolled back, holding the moving slots' statements for 2 s each.
//
// So a statement of such a transaction on a frozen slot of that shard is
// not held: it runs on the shard, as before the freeze. One that may reach
// several shards (a fan-out, a write without the key, an INSERT of several
// rows) is not held when the transaction wrote so to the shard of every
// frozen slot. Such a statement cannot meet the fence, which cannot be
// armed before the transaction ends, and what it writes commits before the
// fence's WAL position, which the final drain reaches (docs/DESIGN.md 5.1
// step 4, 5.3). A write counts only if this proxy's map showed no frozen
// slot of the shard when it completed: a fence is armed only once every
// proxy has acknowledged its frozen map, and a proxy acknowledges only maps
// it holds, so the fence was not armed then and the write's lock came
// first. (A fence armed before the write would have let it in, its slot not
// moving, and stopped the statement let through with LT001.)

// shardRef names one shard: its map (the tree's, or its colocation
// group's), its index and its node.
type shardRef struct {
	tree  string
	shard int
	node  string
}

// noteWrite records, in the session's transaction, the shard a statement
// by its key (mark) just wrote to (tag is its command tag), unless the
// proxy's map has a frozen slot of that shard.
func (s *session) noteWrite(mark loadMark, tag []byte) {
	ref := mark.shard
	if ref.tree == "" || !s.tx.active || slices.Contains(s.tx.wrote, ref) {
		return
	}
	if write, _ := tagWrites(tag); !write {
		return
	}
	v := s.srv.cache.Current(s.tenant)
	if v == nil {
		return
	}
	m := v.Maps[mark.tree]
	if m == nil || m.Shards[ref.shard].Node != ref.node || frozenOwnedBy(m, ref.shard) {
		return
	}
	s.tx.wrote = append(s.tx.wrote, ref)
}

// frozenOwnedBy reports whether a frozen slot of m belongs to shard.
func frozenOwnedBy(m *shardmap.Map, shard int) bool {
	for _, r := range m.Frozen {
		for slot := r[0]; slot <= r[1]; slot++ {
			if m.Slots[slot] == shard {
				return true
			}
		}
	}
	return false
}

// passesFreeze reports whether p, held under v for a frozen slot, goes on
// to the slots' shards rather than wait: the session's transaction wrote,
// before its slots froze, to the shard of the frozen slot p names (a
// statement by its key), or to the shard of every frozen slot of the tree
// (a statement that may reach several shards).
func (s *session) passesFreeze(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32) bool {
	if len(s.tx.wrote) == 0 || !s.tx.active || p == nil || p.Tree == nil {
		return false
	}
	m := v.Maps[p.Tree.Name]
	if m == nil {
		return false
	}
	wrote := func(shard int) bool {
		return slices.Contains(s.tx.wrote, shardRef{p.Tree.MapName(), shard, m.Shards[shard].Node})
	}
	switch p.Kind {
	case router.Single:
		r, err := router.Resolve(v, p, routerBind(bind, oids))
		if err != nil || len(r.Targets) != 1 || r.Targets[0].Node != m.Shards[r.Targets[0].Shard].Node {
			return false
		}
		return wrote(r.Targets[0].Shard)
	case router.FanOut, router.WriteAll, router.InsertSplit:
		for _, rg := range m.Frozen {
			for slot := rg[0]; slot <= rg[1]; slot++ {
				if !wrote(m.Slots[slot]) {
					return false
				}
			}
		}
		return len(m.Frozen) > 0
	}
	return false
}
