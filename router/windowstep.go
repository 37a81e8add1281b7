package router

import (
	"slices"
	"strconv"
	"strings"

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

// FETCH FIRST n ROWS WITH TIES over several shards keeps the rows tied
// with the n-th, which no node can tell alone: each node returns its own
// first n (+ OFFSET) rows with their ties, in the statement's order, and
// the final step takes the statement's over them. The rows tied with the
// statement's last one are among them: a node's rows that sort before or
// with it are within that node's first n and ties.
var tiesWords = stepWords{in: "in FETCH FIRST ... WITH TIES", sel: "a SELECT with FETCH FIRST ... WITH TIES", plural: "FETCH FIRST ... WITH TIES"}

// A derived table or subquery of plain rows with LIMIT (derived.go) is
// cut alike: each node's first LIMIT + OFFSET rows in its order.
var limitWords = stepWords{in: "in a subquery with LIMIT", sel: "a subquery with LIMIT", plural: "LIMIT in a subquery"}

// COPY (SELECT ... ORDER BY ... LIMIT ...) over several shards sorts its
// rows in the final step (copy.go), each node's first LIMIT + OFFSET rows
// when the sort keys are in the select list, else all of them.
var copyWords = stepWords{in: "in COPY (SELECT ...)", sel: "a COPY (SELECT ...) with ORDER BY, LIMIT or OFFSET", plural: "ORDER BY, LIMIT or OFFSET in COPY (SELECT ...)"}

// Aggregates the two-step form cannot combine on the nodes (FILTER,
// ORDER BY inside the call, string_agg, bool_and, stddev, percentiles and
// the like), GROUPING SETS, ROLLUP and CUBE, GROUP BY DISTINCT and
// DISTINCT ON run in the same final step over the gathered rows: the
// nodes ship, inside each aggregate, its arguments, FILTER and ORDER BY
// as columns, and the grouping keys as columns; PostgreSQL groups and
// aggregates them once, whole. Outside the aggregates, the final step
// reads only grouping keys, so a column that is neither grouped nor
// aggregated is refused here, as the two-step form refuses it.

// rowsFanOut plans a fan-out SELECT whose final step runs over the
// statement's own rows, gathered: windows (w is windowWords) or
// aggregates and groupings (w is aggWords). wrap, when not nil, puts the
// final step and the whole statement (for one node) inside an outer
// query (derived.go).
func (p *planner) rowsFanOut(r route, s *pg.SelectStmt, w stepWords, wrap func(final, whole *pg.SelectStmt) (*pg.SelectStmt, *pg.SelectStmt)) route {
	tree := r.tree
	keyHint, no := fanRefusal(tree)
	switch {
	case len(s.LockingClause) > 0:
		return no("Lock rows by shard key: SELECT ... WHERE "+tree.KeyColumn+" = <value> FOR UPDATE.", "FOR UPDATE/SHARE over several shards is not supported")
	}
	if hint, why := stepWithProblem(s.WithClause, w.plural); why != "" {
		return no(keyHint+hint, "%s", why)
	}
	// What the final step computes must not read a table: it runs over
	// the gathered rows only.
	if hasSubLink(finalClauses(s)) {
		return no(keyHint+", or compute it in the application.", "a subquery beside %s over several shards is not supported", w.plural)
	}
	in, bad := stepInput(r, s, w)
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
	// A problem found while rewriting: the refusal's hint and reason.
	var problem, problemHint string
	// row rewrites an expression over one row: its largest parts without
	// a window or an aggregate become columns.
	var row func(n *pg.Node) *pg.Node
	row = func(n *pg.Node) *pg.Node {
		if n == nil || problem != "" {
			return n
		}
		if _, constant := asConstant(n); constant {
			return n
		}
		if sb := n.GetSortBy(); sb != nil {
			sb.Node = row(sb.Node)
			return n
		}
		if isStar(n) {
			// A whole row's type is its shard's; the final step has none.
			problem, problemHint = "a whole-row reference ("+deparseOr(n, "*")+") "+w.in+" over several shards is not supported", ", or name the columns"
			return n
		}
		if shippable(n) && !hasWindow(n) && !hasAggregate(n) {
			return ship(n)
		}
		rewriteChildren(n.ProtoReflect(), row)
		return n
	}
	grouped := len(s.GroupClause) > 0 || s.HavingClause != nil
	if !grouped {
		agg, _ := aggregates(append(append(append([]*pg.Node(nil), s.TargetList...), s.SortClause...), s.WindowClause...))
		grouped = agg != ""
	}
	// outer rewrites an expression over groups: a grouping key becomes
	// its final form, an aggregate's inside is rewritten over rows, and
	// any other column is refused.
	outer := row
	type groupKey struct{ expr, final *pg.Node }
	var groups []groupKey
	if grouped {
		outer = func(n *pg.Node) *pg.Node {
			if n == nil || problem != "" {
				return n
			}
			for _, g := range groups {
				if sameExpr(g.expr, n, r) {
					return proto.Clone(g.final).(*pg.Node)
				}
			}
			if sb := n.GetSortBy(); sb != nil {
				sb.Node = outer(sb.Node)
				return n
			}
			if n.GetColumnRef() != nil {
				problem, problemHint = "column "+exprName(n)+" is neither grouped nor aggregated", ". List the column in GROUP BY, or use it inside an aggregate"
				return n
			}
			if fc := n.GetFuncCall(); fc != nil && fc.Over == nil && fc.AggWithinGroup {
				// An ordered-set aggregate's direct arguments are
				// evaluated once per group.
				for i, a := range fc.Args {
					fc.Args[i] = outer(a)
				}
				for _, o := range fc.AggOrder {
					row(o)
				}
				fc.AggFilter = row(fc.AggFilter)
				return n
			}
			if fc := n.GetFuncCall(); fc != nil && fc.Over == nil && isAggregateCall(fc) || n.GetJsonArrayAgg() != nil || n.GetJsonObjectAgg() != nil {
				rewriteChildren(n.ProtoReflect(), row)
				return n
			}
			rewriteChildren(n.ProtoReflect(), outer)
			return n
		}
	}
	// Grouping keys, and DISTINCT ON's items, by position or output name
	// are resolved against the select list as PostgreSQL does: GROUP BY
	// takes an input column first, DISTINCT ON an output name.
	resolve := func(g *pg.Node, inputFirst bool) (*pg.Node, bool) {
		if c := g.GetAConst(); c != nil && c.GetIval() != nil {
			k := int(c.GetIval().Ival)
			if k < 1 || k > len(in.targets) {
				return nil, false
			}
			return in.targets[k-1].Val, true
		}
		name, ok := bareName(g)
		if !ok {
			return g, true
		}
		for _, t := range in.targets {
			if t.Name != name {
				continue
			}
			if inputFirst && (in.joined || len(tree.Columns) == 0) && !sameExpr(t.Val, g, r) {
				return nil, false // another table's column, or an output name: the proxy cannot tell
			}
			if !inputFirst || !slices.Contains(tree.Columns, name) {
				return t.Val, true
			}
		}
		return g, true
	}
	// groupItem rewrites a GROUP BY item; inSet: inside a grouping set,
	// where PostgreSQL reads a parenthesized list (a row constructor) as
	// a set of keys, not one row-valued key.
	var groupItem func(g *pg.Node, inSet bool) *pg.Node
	groupItem = func(g *pg.Node, inSet bool) *pg.Node {
		if gs := g.GetGroupingSet(); gs != nil {
			for i, c := range gs.Content {
				gs.Content[i] = groupItem(c, true)
			}
			return g
		}
		if re := g.GetRowExpr(); re != nil && inSet && re.RowFormat == pg.CoercionForm_COERCE_IMPLICIT_CAST {
			for i, a := range re.Args {
				re.Args[i] = groupItem(a, true)
			}
			return g
		}
		e, ok := resolve(g, true)
		if !ok {
			problem, problemHint = "the proxy cannot tell whether GROUP BY "+exprName(g)+" names an output column", ". Group by the expression instead of the output name or position"
			return g
		}
		// A key that is one shippable expression becomes one column;
		// another (a row constructor) its parts' columns.
		f := row(proto.Clone(e).(*pg.Node))
		groups = append(groups, groupKey{e, f})
		return proto.Clone(f).(*pg.Node)
	}
	final := proto.Clone(s).(*pg.SelectStmt)
	for i, g := range final.GroupClause {
		final.GroupClause[i] = groupItem(g, false)
	}
	final.TargetList = nil
	for _, t := range in.targets {
		t = proto.Clone(t).(*pg.ResTarget)
		t.Val = outer(t.Val)
		final.TargetList = append(final.TargetList, &pg.Node{Node: &pg.Node_ResTarget{ResTarget: t}})
	}
	final.HavingClause = outer(final.HavingClause)
	for i, d := range final.DistinctClause {
		if d.Node == nil {
			continue // plain DISTINCT
		}
		e, ok := resolve(d, false)
		if !ok {
			problem, problemHint = "a DISTINCT ON position is not in the select list", ". Use a position between 1 and the number of output columns"
			break
		}
		if e != d {
			continue // a position or an output name: the final step resolves it alike
		}
		final.DistinctClause[i] = outer(d)
	}
	for _, wc := range final.WindowClause {
		rewriteChildren(wc.ProtoReflect(), outer)
	}
	if !finalSort(final.SortClause, in.targets, outer) {
		return refusedRoute(fanError(tree.Name))
	}
	if problem != "" {
		return no(keyHint+problemHint+".", "%s", problem)
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
		// Nothing to carry (row_number() OVER (), count(*)): the rows
		// still count.
		partial.TargetList = append(partial.TargetList, resTarget("lattice_c1", intConst(1)))
	}
	limited := w == tiesWords || w == limitWords
	if limited && !limitOnNodes(partial, final, s) {
		return no(keyHint+", or order by columns of the select list.", "%s over several shards needs every ORDER BY key in the select list", w.plural)
	}
	if w == copyWords && s.LimitCount != nil {
		// Cut on the nodes when it can be; otherwise the final step
		// sorts and cuts every row.
		if limited = limitOnNodes(partial, final, s); !limited {
			partial.SortClause, partial.LimitCount, partial.LimitOption = nil, nil, pg.LimitOption_LIMIT_OPTION_DEFAULT
		}
	}
	ap := &AggPlan{refs: in.refs, Columns: len(partial.TargetList), Gathered: true, Window: w == windowWords, Limited: limited, Sorted: w == copyWords}
	whole := proto.Clone(s).(*pg.SelectStmt)
	whole.FromClause, whole.WhereClause = in.src, in.where
	if wrap != nil {
		final, whole = wrap(final, whole)
	}
	if !ap.texts(partial, whole, final) {
		return refusedRoute(fanError(tree.Name))
	}
	if len(shipped) > 0 {
		if ap.CollationProbe = collationProbe(r, shipped); ap.CollationProbe == "" {
			// Without the nodes' collations the final step would order,
			// group and partition text under the catalog's default.
			return no(keyHint+", or compute it in the application.", "the proxy cannot find the collations of the columns %s read", w.plural)
		}
	}
	// The nodes evaluate the shipped expressions: a user-defined
	// aggregate among them would aggregate per node, which the proxy
	// refuses once the catalog tells (the window and aggregate calls
	// themselves run in the final step, whole).
	r.kind, r.sel, r.fan = FanOut, s, &fanPlan{calls: functionNames(shipped), agg: ap}
	return r
}

// finalClauses are the clauses of s that the final step computes: the
// select list, ORDER BY, WINDOW, GROUP BY, DISTINCT ON and HAVING.
func finalClauses(s *pg.SelectStmt) []*pg.Node {
	var out []*pg.Node
	out = append(out, s.TargetList...)
	out = append(out, s.SortClause...)
	out = append(out, s.WindowClause...)
	out = append(out, s.GroupClause...)
	out = append(out, s.DistinctClause...)
	if s.HavingClause != nil {
		out = append(out, s.HavingClause)
	}
	return out
}

// limitOnNodes gives the partial query of s the final step's order and
// s's LIMIT (or FETCH FIRST ... WITH TIES) of LIMIT + OFFSET rows, so that
// each node returns only the rows that may be the statement's. Every sort
// key must be a column the partial query outputs; it reports false
// otherwise, and for WITH TIES without ORDER BY.
func limitOnNodes(partial, final, s *pg.SelectStmt) bool {
	for _, sn := range final.SortClause {
		sb := proto.Clone(sn).(*pg.Node).GetSortBy()
		key := sb.Node
		if c := key.GetAConst(); c != nil && c.GetIval() != nil {
			k := int(c.GetIval().Ival)
			if k < 1 || k > len(final.TargetList) {
				return false
			}
			key = final.TargetList[k-1].GetResTarget().Val
		} else if name, ok := bareName(key); ok && !strings.HasPrefix(name, "lattice_c") {
			i := slices.IndexFunc(final.TargetList, func(t *pg.Node) bool { return t.GetResTarget().Name == name })
			if i < 0 {
				return false
			}
			key = final.TargetList[i].GetResTarget().Val
		}
		if name, ok := bareName(key); !ok || !strings.HasPrefix(name, "lattice_c") {
			return false
		}
		sb.Node = proto.Clone(key).(*pg.Node)
		partial.SortClause = append(partial.SortClause, &pg.Node{Node: &pg.Node_SortBy{SortBy: sb}})
	}
	partial.LimitOption = s.LimitOption
	partial.LimitCount = s.LimitCount
	if s.LimitOffset != nil {
		// bigint, as PostgreSQL reads both (parameters of unknown type
		// would leave + unresolved); OFFSET NULL is 0.
		int8 := func(n *pg.Node) *pg.Node {
			return &pg.Node{Node: &pg.Node_TypeCast{TypeCast: &pg.TypeCast{Arg: n, TypeName: &pg.TypeName{
				Names: []*pg.Node{{Node: &pg.Node_String_{String_: &pg.String{Sval: "pg_catalog"}}}, {Node: &pg.Node_String_{String_: &pg.String{Sval: "int8"}}}}, Typemod: -1}}}}
		}
		offset := &pg.Node{Node: &pg.Node_CoalesceExpr{CoalesceExpr: &pg.CoalesceExpr{Args: []*pg.Node{int8(s.LimitOffset), intConst(0)}}}}
		partial.LimitCount = &pg.Node{Node: &pg.Node_AExpr{AExpr: &pg.A_Expr{Kind: pg.A_Expr_Kind_AEXPR_OP,
			Name: []*pg.Node{{Node: &pg.Node_String_{String_: &pg.String{Sval: "+"}}}}, Lexpr: int8(s.LimitCount), Rexpr: offset}}}
	}
	return len(partial.SortClause) > 0 || s.LimitOption != pg.LimitOption_LIMIT_OPTION_WITH_TIES
}

// shippable reports whether n is an expression a node can compute as a
// column of its own: not a part of one (a CASE's WHEN, a list, a named
// argument) and not a clause.
func shippable(n *pg.Node) bool {
	switch n.Node.(type) {
	case *pg.Node_ColumnRef, *pg.Node_AExpr, *pg.Node_FuncCall, *pg.Node_TypeCast, *pg.Node_BoolExpr,
		*pg.Node_NullTest, *pg.Node_BooleanTest, *pg.Node_CaseExpr, *pg.Node_CoalesceExpr, *pg.Node_MinMaxExpr,
		*pg.Node_AIndirection, *pg.Node_CollateClause, *pg.Node_AArrayExpr, *pg.Node_SqlvalueFunction:
		return true
	}
	return false
}

// hasAggregate reports whether n calls an aggregate outside a window.
func hasAggregate(n *pg.Node) bool {
	agg, _ := aggregates([]*pg.Node{n})
	return agg != ""
}

// exprName names expression n in a message: a bare name quoted, as the
// other refusals quote it, else its text.
func exprName(n *pg.Node) string {
	if name, ok := bareName(n); ok {
		return qn(name)
	}
	return deparseOr(n, "?")
}

// deparseOr is the text of expression n, or fallback.
func deparseOr(n *pg.Node, fallback string) string {
	if t, err := deparseExpr(n); err == nil {
		return t
	}
	return fallback
}

// isAggregateCall reports whether fc, not a window call, is an aggregate:
// a built-in one by name, or by the syntax only aggregates take.
func isAggregateCall(fc *pg.FuncCall) bool {
	return aggregateNames[funcName(fc)] || fc.AggStar || fc.AggDistinct || len(fc.AggOrder) > 0 || fc.AggFilter != nil || fc.AggWithinGroup
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
