package router

import (
	"strconv"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A window that is not partitioned by the shard key (window.go) needs rows
// of several shards in one partition, so it runs in the final step of the
// two-step form (aggregate.go) instead of on the shards. Each node returns
// the statement's rows over its shards: its FROM and WHERE, as the partial
// query of an aggregate reads them (aggsource.go), selecting as lattice_c1,
// ... every expression the windows, the select list and ORDER BY read that
// contains no window call and is not a constant or a parameter. The final
// step is the statement itself with each of those expressions replaced by
// its column: select list, windows (inline and the WINDOW clause), ORDER
// BY, LIMIT and OFFSET as written, run by PostgreSQL over the gathered
// rows, so frames, ties and peer groups are PostgreSQL's own. Text columns
// keep their collations through the probe, as an aggregate's keys do. The
// union of the nodes' rows is the statement's FROM and WHERE over every
// shard (aggsource.go), so the final step sees exactly the rows the
// statement would, and the proxy bounds them by --max-merge-memory.
// Volatile and stable expressions (random(), now()) are columns too, so
// they are evaluated once per row on the nodes, inside the statement's
// transaction.

var windowWords = stepWords{in: "in a window function", sel: "a SELECT with window functions", plural: "window functions"}

// windowFanOut plans a fan-out SELECT whose windows run in the final step.
func (p *planner) windowFanOut(r route, s *pg.SelectStmt) route {
	tree := r.tree
	keyHint, no := fanRefusal(tree)
	switch {
	case len(s.LockingClause) > 0:
		return no("Lock rows by shard key: SELECT ... WHERE "+tree.KeyColumn+" = <value> FOR UPDATE.", "FOR UPDATE/SHARE over several shards is not supported")
	}
	if hint, why := stepWithProblem(s.WithClause, windowWords.plural); why != "" {
		return no(keyHint+hint, "%s", why)
	}
	// What the final step computes must not read a table: it runs over
	// the gathered rows only.
	var scan []*pg.Node
	scan = append(scan, s.TargetList...)
	scan = append(scan, s.SortClause...)
	scan = append(scan, s.WindowClause...)
	if hasSubLink(scan) {
		return no(keyHint+", or compute it in the application.", "a subquery beside a window function over several shards is not supported")
	}
	in, bad := stepInput(r, s, windowWords)
	if bad != nil {
		return bad(no, keyHint)
	}

	var shipped []*pg.Node
	ship := func(e *pg.Node) *pg.Node {
		for i, g := range shipped {
			if sameExpr(g, e, r) {
				return columnNode("lattice_c" + strconv.Itoa(i+1))
			}
		}
		shipped = append(shipped, e)
		return columnNode("lattice_c" + strconv.Itoa(len(shipped)))
	}
	var rewrite func(n *pg.Node) *pg.Node
	rewrite = func(n *pg.Node) *pg.Node {
		if n == nil {
			return nil
		}
		if _, constant := asConstant(n); constant {
			return n
		}
		if sb := n.GetSortBy(); sb != nil {
			sb.Node = rewrite(sb.Node)
			return n
		}
		if shippable(n) && !hasWindow(n) {
			return ship(n)
		}
		rewriteChildren(n.ProtoReflect(), rewrite)
		return n
	}
	final := proto.Clone(s).(*pg.SelectStmt)
	final.TargetList = nil
	for _, t := range in.targets {
		t = proto.Clone(t).(*pg.ResTarget)
		t.Val = rewrite(t.Val)
		final.TargetList = append(final.TargetList, &pg.Node{Node: &pg.Node_ResTarget{ResTarget: t}})
	}
	for _, w := range final.WindowClause {
		rewriteChildren(w.ProtoReflect(), rewrite)
	}
	if !finalSort(final.SortClause, in.targets, rewrite) {
		return refusedRoute(fanError(tree.Name))
	}
	final.WhereClause, final.WithClause = nil, nil
	final.FromClause = []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Relname: aggSource, Inh: true, Relpersistence: "p"}}}}

	partial := &pg.SelectStmt{
		WithClause:  s.WithClause,
		FromClause:  in.src,
		WhereClause: in.where,
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
		Op:          pg.SetOperation_SETOP_NONE,
	}
	for i, e := range shipped {
		if hasFuncCall(e) || e.GetAExpr() != nil {
			// PostgreSQL expands a set-returning function of the select
			// list after the windows; on the nodes it would multiply the
			// rows before them. Inside COALESCE it is an error instead
			// ("set-returning functions are not allowed in COALESCE"),
			// and any other value passes unchanged, type and typmod too.
			e = &pg.Node{Node: &pg.Node_CoalesceExpr{CoalesceExpr: &pg.CoalesceExpr{Args: []*pg.Node{e}}}}
		}
		partial.TargetList = append(partial.TargetList, resTarget("lattice_c"+strconv.Itoa(i+1), e))
	}
	if len(shipped) == 0 {
		// Nothing to carry (row_number() OVER ()): the rows still count.
		partial.TargetList = append(partial.TargetList, resTarget("lattice_c1", intConst(1)))
	}
	ap := &AggPlan{refs: in.refs, Columns: len(partial.TargetList), Window: true}
	whole := proto.Clone(s).(*pg.SelectStmt)
	whole.FromClause, whole.WhereClause = in.src, in.where
	if !ap.texts(partial, whole, final) {
		return refusedRoute(fanError(tree.Name))
	}
	if len(shipped) > 0 {
		if ap.CollationProbe = collationProbe(r, shipped); ap.CollationProbe == "" {
			// Without the nodes' collations the final step would order
			// and partition text under the catalog's default.
			return no(keyHint+", or compute it in the application.", "the proxy cannot find the collations of the columns the windows read")
		}
	}
	// The nodes evaluate the shipped expressions: a user-defined
	// aggregate among them would aggregate per node, which the proxy
	// refuses once the catalog tells (the window calls themselves run in
	// the final step, whole).
	r.kind, r.sel, r.fan = FanOut, s, &fanPlan{calls: functionNames(shipped), agg: ap}
	return r
}

// shippable reports whether n is an expression a node can compute as a
// column of its own: not a part of one (a CASE's WHEN, a list, a named
// argument) and not a clause.
func shippable(n *pg.Node) bool {
	switch n.Node.(type) {
	case *pg.Node_ColumnRef, *pg.Node_AExpr, *pg.Node_FuncCall, *pg.Node_TypeCast, *pg.Node_BoolExpr,
		*pg.Node_NullTest, *pg.Node_BooleanTest, *pg.Node_CaseExpr, *pg.Node_CoalesceExpr, *pg.Node_MinMaxExpr,
		*pg.Node_AIndirection, *pg.Node_CollateClause, *pg.Node_RowExpr, *pg.Node_AArrayExpr, *pg.Node_SqlvalueFunction:
		return true
	}
	return false
}

// hasWindow reports whether n calls a window function.
func hasWindow(n *pg.Node) bool {
	return anyNode([]*pg.Node{n}, func(m protoreflect.Message) bool {
		fc, ok := m.Interface().(*pg.FuncCall)
		return ok && fc.Over != nil
	})
}

// hasSubLink reports whether nodes hold a subquery.
func hasSubLink(nodes []*pg.Node) bool {
	return anyNode(nodes, func(m protoreflect.Message) bool {
		_, ok := m.Interface().(*pg.SubLink)
		return ok
	})
}

// anyNode reports whether match holds for a message anywhere in nodes.
func anyNode(nodes []*pg.Node, match func(protoreflect.Message) bool) bool {
	found := false
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if found = found || match(m); !found {
			eachChild(m, visit)
		}
	}
	for _, n := range nodes {
		if n != nil && !found {
			visit(n.ProtoReflect())
		}
	}
	return found
}
