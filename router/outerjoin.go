package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A fan-out runs the statement once per shard, each part reading one
// shard of each tree and the whole of everything else (reference tables,
// VALUES, functions in FROM). An outer join that preserves such a whole
// side against a side with a tree would make every shard add the rows of
// the whole side that find no match in that shard: duplicated, and
// NULL-extended where another shard has the match. Those joins are
// refused over several shards; with the key fixed there is one part, and
// they run as written.

// replicatedPreserved returns the name of a FROM item that an outer join
// of the SELECT s (at any depth) preserves while its other side reads a
// tree, and that reads no tree itself; "" when there is none.
func (p *planner) replicatedPreserved(s *pg.SelectStmt) string {
	ctes := map[string]*pg.Node{}
	var collect func(m protoreflect.Message)
	collect = func(m protoreflect.Message) {
		if c, ok := m.Interface().(*pg.CommonTableExpr); ok {
			ctes[c.Ctename] = c.Ctequery
		}
		eachChild(m, collect)
	}
	collect(s.ProtoReflect())
	found := ""
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if found != "" {
			return
		}
		if j, ok := m.Interface().(*pg.JoinExpr); ok {
			left, right := p.readsTree(j.Larg, ctes), p.readsTree(j.Rarg, ctes)
			switch {
			case (j.Jointype == pg.JoinType_JOIN_LEFT || j.Jointype == pg.JoinType_JOIN_FULL) && !left && right:
				found = fromItemName(j.Larg)
			case (j.Jointype == pg.JoinType_JOIN_RIGHT || j.Jointype == pg.JoinType_JOIN_FULL) && !right && left:
				found = fromItemName(j.Rarg)
			}
			if found != "" {
				return
			}
		}
		eachChild(m, visit)
	}
	visit(s.ProtoReflect())
	return found
}

// readsTree reports whether a FROM item names a tree anywhere inside it,
// directly or through one of the statement's CTEs.
func (p *planner) readsTree(n *pg.Node, ctes map[string]*pg.Node) bool {
	if n == nil {
		return false
	}
	found := false
	seen := map[string]bool{} // a recursive CTE names itself
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if found {
			return
		}
		if rv, ok := m.Interface().(*pg.RangeVar); ok {
			if t, _ := p.lookup(rv); t != nil {
				found = true
			} else if q := ctes[rv.Relname]; q != nil && rv.Schemaname == "" && !seen[rv.Relname] {
				seen[rv.Relname] = true
				visit(q.ProtoReflect())
			}
			return
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	return found
}

// fromItemName names a FROM item for a message: its first table, else
// "a FROM item".
func fromItemName(n *pg.Node) string {
	name := ""
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if name != "" {
			return
		}
		if rv, ok := m.Interface().(*pg.RangeVar); ok {
			name = qn(rv.Relname)
			return
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	if name == "" {
		return "a FROM item"
	}
	return name
}
