package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A window function over several shards sees only its shard's rows. Over
// several tree references without the key fixed, every row of the top
// level's FROM combines rows of one key, or of one key and NULLs
// (colocate.go). A window partitioned by the key of a top-level tree
// reference that is on no nullable side, or by the keys of all of them (a
// row has at least one that is not NULL: an outer join that would
// NULL-extend every tree is refused), puts rows of one key, and so of one
// shard, in each partition: each shard computes its partitions whole, and
// the parts merge as a plain fan-out. Windows inside a correlated subquery
// see the rows of the outer row's key only. Other windows are refused.

// windowsByKey reports whether every window of the top-level SELECT s (in
// its select list, ORDER BY and WINDOW clause) is partitioned so.
func (c *colocation) windowsByKey(s *pg.SelectStmt) bool {
	if len(c.levels) == 0 || len(c.levels[0].refs) == 0 {
		return false
	}
	return windowsPartitioned(s, c.partitionedByKey)
}

// treeWindowsByKey is windowsByKey for one tree reference in the FROM
// list (beside reference tables, which are never NULL-extended against
// it: fanout.go refuses that), whose rows are never NULL-extended either.
func (p *planner) treeWindowsByKey(r route, s *pg.SelectStmt) bool {
	return windowsPartitioned(s, func(parts []*pg.Node) bool {
		for _, n := range parts {
			if p.isKeyColumn(n, r.rv, r.tree) {
				return true
			}
		}
		return false
	})
}

// windowsPartitioned reports whether every window of s (in its select
// list, ORDER BY and WINDOW clause) has a PARTITION BY that keyed accepts.
func windowsPartitioned(s *pg.SelectStmt, byKey func([]*pg.Node) bool) bool {
	named := map[string]*pg.WindowDef{}
	for _, n := range s.WindowClause {
		w := n.GetWindowDef()
		if w == nil {
			return false
		}
		named[w.Name] = w
	}
	// A window that copies another (w AS (base ORDER BY ...)) takes the
	// base's PARTITION BY, having none of its own.
	keyed := func(w *pg.WindowDef) bool {
		for i := 0; w.Refname != ""; i++ {
			if w = named[w.Refname]; w == nil || i > len(named) {
				return false
			}
		}
		return byKey(w.PartitionClause)
	}
	for _, w := range named {
		if !keyed(w) {
			return false
		}
	}
	ok := true
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		switch v := m.Interface().(type) {
		case *pg.SubLink:
			return
		case *pg.FuncCall:
			if w := v.Over; w != nil {
				if w.Name != "" {
					// OVER name: a window of the WINDOW clause, checked above.
					ok = ok && named[w.Name] != nil
				} else {
					ok = ok && keyed(w)
				}
			}
		}
		eachChild(m, visit)
	}
	for _, n := range append(append([]*pg.Node(nil), s.TargetList...), s.SortClause...) {
		visit(n.ProtoReflect())
	}
	return ok
}

// partitionedByKey reports whether a PARTITION BY list names the key of a
// top-level tree reference on no nullable side, or the keys of all of them.
func (c *colocation) partitionedByKey(parts []*pg.Node) bool {
	covered := map[int]bool{}
	for _, p := range parts {
		if i, key := c.resolve(p, 0); i >= 0 && key && c.refs[i].level == 0 {
			if !c.refs[i].nullable {
				return true
			}
			covered[i] = true
		}
	}
	for _, i := range c.levels[0].refs {
		if !covered[i] {
			return false
		}
	}
	return true
}
