package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A SELECT whose only tree reference is the FROM of a derived table that
// the shards cannot compute apart (it aggregates, groups, is DISTINCT or
// has windows without the key), and whose outer query reads that derived
// table alone, or the one subquery of a SELECT without FROM:
//
//	SELECT count(*) FROM (SELECT DISTINCT region, plan FROM customers) x
//	SELECT (SELECT count(*) FROM customers) AS n
//
// The derived table runs in an aggregate's final step (aggregate.go) or
// the gathered one (windowstep.go), with the outer query around it as
// written, on the catalog node. The outer query reads no
// table (a subquery there is refused): the final step runs on a pooled
// catalog-node backend, which does not see the client's transaction.

// derivedFanOut plans such a statement; false when it is not one, and the
// caller's refusal stands.
func (p *planner) derivedFanOut(root proto.Message, refs []treeRef, cols []*pg.ColumnRef) (route, bool) {
	outer, ok := root.(*pg.SelectStmt)
	if !ok || outer.Op != pg.SetOperation_SETOP_NONE || len(refs) != 1 ||
		outer.WithClause != nil || len(outer.LockingClause) > 0 || outer.IntoClause != nil {
		return route{}, false
	}
	inner, put, link := derivedInner(outer)
	ref := refs[0]
	if inner == nil || inner.Op != pg.SetOperation_SETOP_NONE || len(inner.FromClause) != 1 {
		return route{}, false
	}
	if rv := inner.FromClause[0].GetRangeVar(); rv == nil || rv.Location != ref.rv.Location {
		return route{}, false
	}
	r := route{tree: ref.tree, rv: ref.rv, cols: cols, sel: inner}
	wrap := func(final, whole *pg.SelectStmt) (*pg.SelectStmt, *pg.SelectStmt) {
		around := func(in *pg.SelectStmt) *pg.SelectStmt {
			o := proto.Clone(outer).(*pg.SelectStmt)
			put(o, &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: in}})
			return o
		}
		return around(final), around(whole)
	}
	// A derived table of plain rows runs on the shards when it can; the
	// caller refused this one. With a LIMIT each node returns its first
	// rows; without one, gathering them all is no answer.
	var d route
	switch innerScan := selectScan(inner); {
	case p.aggregating(inner, innerScan, false):
		d = p.aggFanOut(r, inner, wrap)
	case hasWindow(&pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: inner}}) || len(inner.WindowClause) > 0:
		d = p.rowsFanOut(r, inner, windowWords, wrap)
	case inner.LimitCount != nil && len(inner.DistinctClause) == 0 && len(inner.LockingClause) == 0:
		// Each node's first rows, in its order (limitOnNodes).
		d = p.rowsFanOut(r, inner, limitWords, wrap)
	case link != nil && len(inner.DistinctClause) == 0 && len(inner.LockingClause) == 0 && rowsNeeded(link) > 0:
		// EXISTS reads one row and a scalar subquery at most two (a
		// second is an error): so many of each node's rows, gathered,
		// give the subquery's result.
		inner.LimitCount, inner.LimitOption = intConst(rowsNeeded(link)), pg.LimitOption_LIMIT_OPTION_COUNT
		d = p.rowsFanOut(r, inner, limitWords, wrap)
	case link != nil && rowsNeeded(link) == 0:
		// The refusal the caller would give speaks of pairs of
		// references, which this statement does not have.
		return refusedRoute(refused("Test a value with EXISTS (SELECT 1 FROM "+ref.tree.Name+" WHERE ...), collect the rows with an aggregate (SELECT array_agg(...) FROM "+ref.tree.Name+"), or add LIMIT to the subquery.",
			"SELECT without FROM reads tree %s in an IN, ANY, ALL or ARRAY subquery, which needs every row of it over every shard, and the proxy does not gather a tree's rows whole", qn(ref.tree.Name))), true
	default:
		return route{}, false
	}
	if d.kind == Refused {
		return route{}, false
	}
	return d, true
}

// rowsNeeded is how many rows of a subquery without LIMIT decide its
// sublink, or 0 when every row may.
func rowsNeeded(link *pg.SubLink) int {
	switch link.SubLinkType {
	case pg.SubLinkType_EXISTS_SUBLINK:
		return 1
	case pg.SubLinkType_EXPR_SUBLINK:
		return 2
	}
	return 0
}

// derivedInner finds the one subquery of outer that holds its tree: the
// whole FROM, a derived table, with no subquery in outer's clauses; or,
// in a SELECT without FROM, its one subquery (scalar, EXISTS or ARRAY),
// returned with its sublink. put places a rewritten subquery in a copy
// of outer.
func derivedInner(outer *pg.SelectStmt) (*pg.SelectStmt, func(o *pg.SelectStmt, sub *pg.Node), *pg.SubLink) {
	scan := outerClauses(outer)
	if len(outer.FromClause) == 1 {
		rs := outer.FromClause[0].GetRangeSubselect()
		if rs == nil || rs.Lateral || rs.Subquery == nil || hasSubLink(scan) {
			return nil, nil, nil
		}
		return rs.Subquery.GetSelectStmt(), func(o *pg.SelectStmt, sub *pg.Node) {
			o.FromClause[0].GetRangeSubselect().Subquery = sub
		}, nil
	}
	if len(outer.FromClause) != 0 {
		return nil, nil, nil
	}
	var links []*pg.SubLink
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if l, ok := m.Interface().(*pg.SubLink); ok {
			links = append(links, l) // not inside it: its own subqueries are its part
			return
		}
		eachChild(m, visit)
	}
	for _, n := range scan {
		if n != nil {
			visit(n.ProtoReflect())
		}
	}
	if len(links) != 1 {
		return nil, nil, nil
	}
	at := links[0].Location
	return links[0].Subselect.GetSelectStmt(), func(o *pg.SelectStmt, sub *pg.Node) {
		anyNode(outerClauses(o), func(m protoreflect.Message) bool {
			if l, ok := m.Interface().(*pg.SubLink); ok && l.Location == at {
				l.Subselect = sub
				return true
			}
			return false
		})
	}, links[0]
}

// outerClauses are every clause of a SELECT but FROM and WITH: where
// derivedInner looks for the subquery, and where it puts it back.
func outerClauses(s *pg.SelectStmt) []*pg.Node {
	return append(finalClauses(s), s.WhereClause, s.LimitCount, s.LimitOffset)
}
