package router

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/sqlstate"
)

// An aggregating fan-out (aggregates, GROUP BY, HAVING or DISTINCT) runs in
// two steps. Each node computes partial aggregates over its shards in one
// query: the GROUP BY keys (and the arguments of DISTINCT aggregates),
// then per aggregate its partial state, as columns lattice_c1, ..., over
// the statement's FROM and WHERE with each tree reference read as (SELECT
// * FROM shard1 UNION ALL ...) under its name or alias (aggsource.go).
// The final step is the statement itself, run by PostgreSQL over
// the partial rows: FROM and WHERE replaced by the partial rows, each GROUP
// BY key by its column, each aggregate by the aggregate that combines its
// partial states. HAVING, DISTINCT, ORDER BY, LIMIT and OFFSET stay as
// written, so their semantics are PostgreSQL's own. Both queries are built
// on the parse tree and deparsed; each is parsed again and must give the
// tree it was made from.

// AggKind is what an aggregate's partial state is.
type AggKind int

const (
	AggCount    AggKind = iota // count(*) / count(x): partial count, combined by sum
	AggSum                     // sum(x): partial sum, combined by sum in the partial's type
	AggMin                     // min(x)
	AggMax                     // max(x)
	AggAvg                     // avg(x): partial sum and count
	AggDistinct                // agg(DISTINCT x): x is a grouping column, the aggregate runs in the final step
)

// aggCall is one aggregate of the statement.
type aggCall struct {
	kind AggKind
	col  int    // first partial column (0-based) of its state
	text string // AggDistinct: the final aggregate call over its column
}

// AggPlan is the two-step form of an aggregating FanOut plan.
type AggPlan struct {
	partial aggText  // the partial query around its tree references
	whole   aggText  // the statement itself around them: all shards on one node
	refs    []aggRef // the tree references the holes of partial and whole stand for
	final   []string // final query text around its holes: source, then one per aggregate in order of appearance
	holes   []int    // for each hole after final[0]: -1 source, else the aggregate index
	aggs    []aggCall
	Columns int // partial result columns
	// Params are the parameter numbers the partial and the final query
	// reference: a parameter one of them does not use must still be typed
	// there.
	PartialParams, FinalParams []int
	// CollationProbe gives the collation of each partial column
	// (collation.go), so that the final step groups, compares and sorts
	// text as the nodes do; "" when no partial column can have one.
	CollationProbe string
	// Gathered marks a final step over the statement's own rows rather
	// than one partial row per group (windowstep.go): windows, aggregates
	// the partial rows could not combine, or each node's first rows for
	// a LIMIT or FETCH FIRST ... WITH TIES. Window and Limited tell which.
	Gathered, Window, Limited bool
	// Sorted marks a final step that only orders and cuts the gathered
	// rows, for a COPY (copy.go).
	Sorted bool
	// SetOp marks the final step of a set operation (setopstep.go): the
	// partial rows are its branches' rows, tagged.
	SetOp bool
	// CopyTo, for a COPY (query) TO STDOUT (copy.go), is its options:
	// the final step, or the statement run whole on one node, is
	// COPY (...) TO STDOUT with them, and the proxy never puts rows in
	// parameters of the final query, which COPY does not take.
	CopyTo string
}

const aggSource = "lattice_src"

// RenderPartial is the partial query a node runs over the given shard
// schemas.
func (p *Plan) RenderPartial(schemas []btreeindex.Source) string {
	return p.renderRefs(p.Agg.partial, schemas)
}

// RenderWhole is the statement itself over the given shard schemas, for a
// node that holds every shard of the tree: no final step is needed.
func (p *Plan) RenderWhole(schemas []btreeindex.Source) string {
	return p.Agg.copyTo(p.renderRefs(p.Agg.whole, schemas))
}

// copyTo is query as the COPY the plan is, if it is one.
func (a *AggPlan) copyTo(query string) string {
	if a.CopyTo == "" {
		return query
	}
	return "COPY (" + query + ") TO STDOUT" + a.CopyTo
}

// RenderFinal is the final query over source (a FROM item ending in
// SourceColumns), given the type OIDs of the partial
// columns. It fails when a partial state has a type the proxy cannot
// combine exactly.
func (a *AggPlan) RenderFinal(oids []uint32, source string) (string, *sqlstate.Error) {
	var b strings.Builder
	b.WriteString(a.final[0])
	for i, h := range a.holes {
		if h < 0 {
			b.WriteString(source)
		} else {
			t, err := a.combine(h, oids)
			if err != nil {
				return "", err
			}
			b.WriteString(t)
		}
		b.WriteString(a.final[i+1])
	}
	return a.copyTo(b.String()), nil
}

const (
	oidInt8     = 20
	oidFloat4   = 700
	oidFloat8   = 701
	oidMoney    = 790
	oidInterval = 1186
	oidNumeric  = 1700
)

func (a *AggPlan) combine(i int, oids []uint32) (string, *sqlstate.Error) {
	c := a.aggs[i]
	col := func(k int) string { return "lattice_c" + strconv.Itoa(k+1) }
	var oid uint32
	if c.col < len(oids) {
		oid = oids[c.col]
	}
	switch c.kind {
	case AggCount:
		// No partial rows at all (a DISTINCT aggregate beside it groups
		// the partial query) is a count of 0.
		return "COALESCE(CAST(sum(" + col(c.col) + ") AS bigint), 0)", nil
	case AggMin:
		return "min(" + col(c.col) + ")", nil
	case AggMax:
		return "max(" + col(c.col) + ")", nil
	case AggDistinct:
		return c.text, nil
	case AggSum:
		switch oid {
		case oidInt8:
			// sum(int2/int4) is bigint; a sum of bigints would be numeric.
			return "CAST(sum(" + col(c.col) + ") AS bigint)", nil
		case oidNumeric, oidFloat4, oidFloat8, oidMoney, oidInterval:
			return "sum(" + col(c.col) + ")", nil
		}
	case AggAvg:
		s, n := "sum("+col(c.col)+")", "NULLIF(sum("+col(c.col+1)+"), 0)"
		switch oid {
		case oidInt8, oidNumeric:
			// PostgreSQL's avg of integers and numerics is numeric_div(sum, count).
			return "(CAST(" + s + " AS numeric) / CAST(" + n + " AS numeric))", nil
		case oidFloat8, oidInterval:
			return "(" + s + " / CAST(" + n + " AS double precision))", nil
		}
	}
	e := refused("Fix the shard key in WHERE to read one shard, or aggregate in the application.",
		"this aggregate over several shards is not supported for a value of type oid %d", oid)
	return "", e
}

// aggregating reports whether a SELECT needs the two-step form; top
// leaves out the aggregates that belong to its subqueries (a correlated
// subquery of a statement over several tree references aggregates per
// outer row), but not those that aggregate s from inside one
// (outerAggregate).
func (p *planner) aggregating(s *pg.SelectStmt, scan []*pg.Node, top bool) bool {
	agg, _ := findAggregates(scan, top)
	if agg == "" && top {
		agg = p.outerAggregate(s, scan)
	}
	return agg != "" || len(s.GroupClause) > 0 || s.GroupDistinct || s.HavingClause != nil || len(s.DistinctClause) > 0
}

// aggFanOut plans an aggregating fan-out SELECT; wrap, when not nil, puts
// its final step and whole statement inside an outer query (derived.go).
func (p *planner) aggFanOut(r route, s *pg.SelectStmt, wrap func(final, whole *pg.SelectStmt) (*pg.SelectStmt, *pg.SelectStmt)) route {
	return p.aggSteps(r, s, wrap, false)
}

// aggAccepts reports whether the two steps take s: whether it reads only
// grouped or aggregated columns (whether its aggregates combine or not),
// with none of the constructs they refuse. It renders nothing.
func (p *planner) aggAccepts(r route, s *pg.SelectStmt) bool {
	return p.aggSteps(r, s, nil, true).kind == FanOut
}

// aggSteps is aggFanOut, or with check aggAccepts: a FanOut route with no
// plan when the statement passes the checks.
func (p *planner) aggSteps(r route, s *pg.SelectStmt, wrap func(final, whole *pg.SelectStmt) (*pg.SelectStmt, *pg.SelectStmt), check bool) route {
	tree := r.tree
	keyHint, no := fanRefusal(tree)
	switch {
	case len(s.DistinctClause) > 1 || len(s.DistinctClause) == 1 && s.DistinctClause[0].Node != nil, s.GroupDistinct:
		// DISTINCT ON and GROUP BY DISTINCT run in a final step over
		// the gathered rows (windowstep.go).
		return p.rowsFanOut(r, s, aggWords, wrap)
	case len(s.LockingClause) > 0:
		return no("Lock rows by shard key: SELECT ... WHERE "+tree.KeyColumn+" = <value> FOR UPDATE.", "FOR UPDATE/SHARE over several shards is not supported")
	}
	if hint, why := stepWithProblem(s.WithClause, aggWords.plural); why != "" {
		return no(keyHint+hint, "%s", why)
	}
	multi := r.multi != nil
	for _, g := range s.GroupClause {
		if g.GetGroupingSet() != nil {
			return p.rowsFanOut(r, s, aggWords, wrap)
		}
	}
	var scan []*pg.Node
	scan = append(scan, s.TargetList...)
	scan = append(scan, s.SortClause...)
	scan = append(scan, s.GroupClause...)
	scan = append(scan, s.WindowClause...)
	if s.HavingClause != nil {
		scan = append(scan, s.HavingClause)
	}
	if s.WhereClause != nil && !multi {
		// Over several tree references WHERE runs in the partial query,
		// subqueries and all (correlated on the key, they read the
		// node's rows of the outer row's key).
		scan = append(scan, s.WhereClause)
	}
	if s.LimitCount != nil {
		scan = append(scan, s.LimitCount)
	}
	if s.LimitOffset != nil {
		scan = append(scan, s.LimitOffset)
	}
	if bad := unsupportedNode(scan); bad != "" {
		// The final step runs over the partial rows alone, so a subquery
		// there would read no tree; a join brings its rows into the
		// partial query instead.
		return no(keyHint+", join the subquery's table and group by its columns instead (FROM a JOIN b ON b.key = a.key ... GROUP BY ..., b.col), or compute it in the application.",
			"%s over several shards is not supported", bad)
	}
	in, bad := stepInput(r, s, aggWords)
	if bad != nil {
		return bad(no, keyHint)
	}
	refs, src, where, targets, joined := in.refs, in.src, in.where, in.targets, in.joined

	// The grouping keys of the partial query.
	var groups []*pg.Node
	addGroup := func(e *pg.Node) int {
		for i, g := range groups {
			if sameExpr(g, e, r) {
				return i
			}
		}
		groups = append(groups, e)
		return len(groups) - 1
	}
	finalGroup := make([]int, 0, len(s.GroupClause))
	for _, g := range s.GroupClause {
		e := g
		if c := g.GetAConst(); c != nil && c.GetIval() != nil {
			k := int(c.GetIval().Ival)
			if k < 1 || k > len(targets) {
				return no("Group by a position between 1 and the number of output columns.", "GROUP BY position %d is not in the select list", k)
			}
			e = targets[k-1].Val
		} else if name, ok := bareName(g); ok && (multi || !slices.Contains(tree.Columns, name)) {
			// Not an input column: an output column name (SQL92). Without
			// the columns of every table the proxy cannot tell which it is.
			for _, t := range targets {
				if t.Name == name {
					// Joined, the name may be a column of another table,
					// which PostgreSQL takes before an output name.
					if (len(tree.Columns) == 0 || joined) && !sameExpr(t.Val, g, r) {
						return no("Group by the expression or its position instead of the output name.", "the proxy cannot tell whether GROUP BY %s names an output column", qn(name))
					}
					e = t.Val
					break
				}
			}
		}
		finalGroup = append(finalGroup, addGroup(e))
	}
	distinctOnly := len(s.GroupClause) == 0 && len(s.DistinctClause) > 0
	if agg, window := findAggregates(scan, multi); agg == "" && distinctOnly {
		if window || len(s.WindowClause) > 0 {
			// Without grouping, windows run over every row before
			// DISTINCT, not over groups the final step could see.
			return no(keyHint+", or remove duplicates in an outer SELECT over a subquery with the windows.", "window functions beside DISTINCT over several shards are not supported")
		}
		for _, t := range targets {
			addGroup(t.Val)
		}
	}

	// Replace aggregates and grouping keys in the final statement.
	var aggs []aggCall
	var partialAggs []*pg.Node
	type pending struct {
		fc   *pg.FuncCall
		call int
	}
	var distinctCalls []pending
	var calls []*pg.FuncCall // each aggregate call once
	var problem string
	var rewrite func(n *pg.Node) *pg.Node
	rewrite = func(n *pg.Node) *pg.Node {
		if n == nil || problem != "" {
			return n
		}
		for i, g := range groups {
			if sameExpr(g, n, r) {
				return columnNode("lattice_c" + strconv.Itoa(i+1))
			}
		}
		if fc := n.GetFuncCall(); fc != nil && fc.Over != nil {
			// A window runs in the final step over the groups; its
			// arguments and its window's expressions are the groups'.
			rewriteChildren(n.ProtoReflect(), rewrite)
			return n
		}
		if fc := n.GetFuncCall(); fc != nil {
			if kind, ok := aggKind(fc); ok {
				for i, seen := range calls {
					if sameTree(seen, fc) {
						return columnNode("lattice_agg_" + strconv.Itoa(i+1))
					}
				}
				calls = append(calls, fc)
				call := len(aggs)
				switch {
				case check:
					// Only the columns outside aggregates matter.
				case kind == AggDistinct && fc.Args[0].GetRowExpr() != nil:
					// A row value cannot be a partial column: it has no
					// type the final step could read back.
					problem = funcName(fc) + "()"
					return n
				case kind == AggDistinct:
					aggs = append(aggs, aggCall{kind: kind})
					distinctCalls = append(distinctCalls, pending{fc, call})
				case kind == AggAvg:
					aggs = append(aggs, aggCall{kind: kind, col: len(partialAggs)})
					partialAggs = append(partialAggs, funcNode("sum", fc.Args, false), funcNode("count", fc.Args, false))
				default:
					name := map[AggKind]string{AggCount: "count", AggSum: "sum", AggMin: "min", AggMax: "max"}[kind]
					aggs = append(aggs, aggCall{kind: kind, col: len(partialAggs)})
					partialAggs = append(partialAggs, funcNode(name, fc.Args, fc.AggStar))
				}
				return columnNode("lattice_agg_" + strconv.Itoa(call+1))
			}
			if name := funcName(fc); aggregateNames[name] || fc.AggStar || fc.AggDistinct || len(fc.AggOrder) > 0 || fc.AggFilter != nil || fc.AggWithinGroup {
				if check {
					return columnNode("lattice_agg_0")
				}
				problem = name + "()"
				return n
			}
		}
		rewriteChildren(n.ProtoReflect(), rewrite)
		return n
	}
	final := proto.Clone(s).(*pg.SelectStmt)
	final.TargetList = nil
	for _, t := range targets {
		t = proto.Clone(t).(*pg.ResTarget)
		t.Val = rewrite(t.Val)
		final.TargetList = append(final.TargetList, &pg.Node{Node: &pg.Node_ResTarget{ResTarget: t}})
	}
	final.HavingClause = rewrite(final.HavingClause)
	for _, w := range final.WindowClause {
		rewriteChildren(w.ProtoReflect(), rewrite)
	}
	if !finalSort(final.SortClause, targets, rewrite) {
		return refusedRoute(fanError(tree.Name))
	}
	if problem != "" {
		// An aggregate the partial rows cannot combine runs whole, over
		// the gathered rows.
		return p.rowsFanOut(r, s, aggWords, wrap)
	}
	// What is left of a column outside the aggregates must be a grouping
	// key: PostgreSQL would also accept columns that depend on a grouped
	// primary key, which the final step cannot see.
	var outside []*pg.Node
	for _, t := range final.TargetList {
		outside = append(outside, t.GetResTarget().Val)
	}
	outside = append(outside, final.HavingClause)
	outside = append(outside, final.WindowClause...)
	if col := strayColumn(outside); col != "" {
		return no("List the column in GROUP BY, or use it inside an aggregate.", "column %s is neither grouped nor aggregated", qn(col))
	}
	if check {
		r.kind = FanOut
		return r
	}
	for _, d := range distinctCalls {
		g := addGroup(d.fc.Args[0])
		fc := proto.Clone(d.fc).(*pg.FuncCall)
		fc.Args = []*pg.Node{columnNode("lattice_c" + strconv.Itoa(g+1))}
		txt, err := deparseExpr(&pg.Node{Node: &pg.Node_FuncCall{FuncCall: fc}})
		if err != nil {
			return refusedRoute(fanError(tree.Name))
		}
		aggs[d.call].text = txt
	}
	// Partial columns: grouping keys first, then aggregate states.
	for i := range aggs {
		if aggs[i].kind != AggDistinct {
			aggs[i].col += len(groups)
		}
	}
	final.GroupClause = nil
	for _, g := range finalGroup {
		final.GroupClause = append(final.GroupClause, columnNode("lattice_c"+strconv.Itoa(g+1)))
	}
	final.WhereClause, final.WithClause = nil, nil
	final.FromClause = []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Relname: aggSource, Inh: true, Relpersistence: "p"}}}}

	partial := &pg.SelectStmt{
		WithClause:  s.WithClause,
		FromClause:  src,
		WhereClause: where,
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
		Op:          pg.SetOperation_SETOP_NONE,
	}
	for i, g := range groups {
		partial.TargetList = append(partial.TargetList, resTarget("lattice_c"+strconv.Itoa(i+1), g))
		partial.GroupClause = append(partial.GroupClause, intConst(i+1))
	}
	for i, a := range partialAggs {
		partial.TargetList = append(partial.TargetList, resTarget("lattice_c"+strconv.Itoa(len(groups)+i+1), a))
	}
	if len(partial.TargetList) == 0 {
		// Nothing to carry (SELECT 1 ... HAVING true): one row per node
		// still tells the final step there was a group.
		partial.TargetList = append(partial.TargetList, resTarget("lattice_c1", funcNode("count", nil, true)))
	}

	ap := &AggPlan{aggs: aggs, refs: refs, Columns: len(partial.TargetList)}
	whole := proto.Clone(s).(*pg.SelectStmt)
	whole.FromClause, whole.WhereClause = src, where
	if wrap != nil {
		final, whole = wrap(final, whole)
	}
	if !ap.texts(partial, whole, final) {
		return refusedRoute(fanError(tree.Name))
	}
	// Grouping keys and the arguments of min and max carry a collation;
	// counts, sums and averages do not.
	probe := append([]*pg.Node(nil), groups...)
	collated := len(groups) > 0
	for _, a := range partialAggs {
		var arg *pg.Node
		if fc := a.GetFuncCall(); fc != nil && len(fc.Args) == 1 {
			if n := funcName(fc); n == "min" || n == "max" {
				arg, collated = fc.Args[0], true
			}
		}
		probe = append(probe, arg)
	}
	if collated && len(probe) == ap.Columns {
		if ap.CollationProbe = collationProbe(r, probe); ap.CollationProbe == "" {
			// Without the nodes' collations the final step would group
			// and compare text under the catalog's default.
			return no(keyHint+", or aggregate in the application.", "the proxy cannot find the collations of the grouped and compared columns")
		}
	}
	// The catalog check for user-defined aggregates skips the built-in
	// ones the two-step form combines, and window calls, which run whole
	// in the final step.
	var names []string
	for _, c := range callNames(scan, multi, true) {
		switch c {
		case "count", "sum", "min", "max", "avg":
		default:
			names = append(names, c)
		}
	}
	r.kind, r.sel, r.fan = FanOut, s, &fanPlan{calls: names, agg: ap}
	return r
}

// aggRefs are the tree references an aggregating fan-out reads, and
// their RangeVars: the tree's one, or each of several.
func aggRefs(r route) ([]aggRef, []*pg.RangeVar) {
	if r.multi == nil {
		return []aggRef{{tree: r.tree, alias: treeRef{rv: r.rv}.name()}}, []*pg.RangeVar{r.rv}
	}
	refs := make([]aggRef, len(r.multi))
	rvs := make([]*pg.RangeVar, len(r.multi))
	for i, m := range r.multi {
		refs[i], rvs[i] = aggRef{tree: m.tree, alias: m.name()}, m.rv
	}
	return refs, rvs
}

func funcName(fc *pg.FuncCall) string {
	if len(fc.Funcname) == 0 {
		return ""
	}
	return strings.ToLower(fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval())
}

// SourceColumns is the column list the final query's source must have:
// lattice_p(lattice_c1, ..., lattice_cN).
func (a *AggPlan) SourceColumns() string {
	var b strings.Builder
	b.WriteString("lattice_p(")
	for i := range a.Columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("lattice_c" + strconv.Itoa(i+1))
	}
	b.WriteByte(')')
	return b.String()
}

// strayColumn returns a column reference in nodes that is not a partial
// column, or "".
func strayColumn(nodes []*pg.Node) string {
	stray := ""
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if c, ok := m.Interface().(*pg.ColumnRef); ok && stray == "" {
			if name, ok := bareName(&pg.Node{Node: &pg.Node_ColumnRef{ColumnRef: c}}); ok &&
				(strings.HasPrefix(name, "lattice_c") || strings.HasPrefix(name, "lattice_agg_")) {
				return
			}
			stray = "*"
			if last := c.Fields[len(c.Fields)-1].GetString_(); last != nil {
				stray = last.Sval
			}
			return
		}
		eachChild(m, visit)
	}
	for _, n := range nodes {
		if n != nil {
			visit(n.ProtoReflect())
		}
	}
	return stray
}

// unsupportedNode names the first construct in nodes the two-step form
// cannot carry: subqueries. Windows run in its final step, over the
// groups, as PostgreSQL runs them after grouping.
func unsupportedNode(nodes []*pg.Node) string {
	bad := ""
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if bad != "" {
			return
		}
		if _, ok := m.Interface().(*pg.SubLink); ok {
			bad = "a subquery in an aggregating SELECT"
			return
		}
		if bad = aggregateSyntax(m); bad != "" {
			return
		}
		eachChild(m, visit)
	}
	for _, n := range nodes {
		if n != nil {
			visit(n.ProtoReflect())
		}
	}
	return bad
}

// aggKind recognizes count, sum, min, max and avg (unqualified or
// pg_catalog), with DISTINCT or not, without FILTER, ORDER BY or WITHIN
// GROUP.
func aggKind(fc *pg.FuncCall) (AggKind, bool) {
	names := make([]string, len(fc.Funcname))
	for i, n := range fc.Funcname {
		names[i] = n.GetString_().GetSval()
	}
	if len(names) == 2 && names[0] == "pg_catalog" {
		names = names[1:]
	}
	if len(names) != 1 || fc.Over != nil || fc.AggFilter != nil || len(fc.AggOrder) > 0 || fc.AggWithinGroup || fc.FuncVariadic {
		return 0, false
	}
	if fc.AggStar {
		return AggCount, names[0] == "count" && len(fc.Args) == 0 && !fc.AggDistinct
	}
	if len(fc.Args) != 1 || fc.Args[0].GetNamedArgExpr() != nil {
		return 0, false
	}
	kind, ok := map[string]AggKind{"count": AggCount, "sum": AggSum, "min": AggMin, "max": AggMax, "avg": AggAvg}[names[0]]
	if !ok {
		return 0, false
	}
	if fc.AggDistinct {
		return AggDistinct, true
	}
	return kind, true
}

// rewriteChildren replaces every Node directly inside m by f's answer.
func rewriteChildren(m protoreflect.Message, f func(*pg.Node) *pg.Node) {
	rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				if n, ok := l.Get(i).Message().Interface().(*pg.Node); ok {
					l.Set(i, protoreflect.ValueOfMessage(f(n).ProtoReflect()))
				} else {
					rewriteChildren(l.Get(i).Message(), f)
				}
			}
			return true
		}
		if n, ok := v.Message().Interface().(*pg.Node); ok {
			m.Set(fd, protoreflect.ValueOfMessage(f(n).ProtoReflect()))
		} else {
			rewriteChildren(v.Message(), f)
		}
		return true
	})
}

func funcNode(name string, args []*pg.Node, star bool) *pg.Node {
	fc := &pg.FuncCall{Funcname: []*pg.Node{pg.MakeStrNode(name)}, AggStar: star, Funcformat: pg.CoercionForm_COERCE_EXPLICIT_CALL}
	for _, a := range args {
		fc.Args = append(fc.Args, proto.Clone(a).(*pg.Node))
	}
	return &pg.Node{Node: &pg.Node_FuncCall{FuncCall: fc}}
}

func resTarget(name string, val *pg.Node) *pg.Node {
	return &pg.Node{Node: &pg.Node_ResTarget{ResTarget: &pg.ResTarget{Name: name, Val: val}}}
}

// starTarget is a select list's *.
func starTarget() *pg.Node {
	return resTarget("", &pg.Node{Node: &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{{Node: &pg.Node_AStar{AStar: &pg.A_Star{}}}}}}})
}

func intConst(i int) *pg.Node {
	return &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Ival{Ival: &pg.Integer{Ival: int32(i)}}}}}
}

// parseVersion is the parse tree version the deparser expects: the
// parser's own.
var parseVersion = func() int32 {
	res, err := pg.Parse("SELECT")
	if err != nil {
		panic(err)
	}
	return res.Version
}()

// deparseStmt deparses a SELECT and checks that parsing the text again
// gives the same tree.
func deparseStmt(s *pg.SelectStmt) (string, error) {
	res := &pg.ParseResult{Version: parseVersion, Stmts: []*pg.RawStmt{{Stmt: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: s}}}}}
	text, err := pg.Deparse(res)
	if err != nil {
		return "", err
	}
	back, err := pg.Parse(text)
	if err != nil {
		return "", err
	}
	if len(back.Stmts) != 1 || !sameTree(back.Stmts[0].Stmt.GetSelectStmt(), s) {
		return "", fmt.Errorf("deparsed statement does not parse back to itself: %s", text)
	}
	return text, nil
}

func deparseExpr(n *pg.Node) (string, error) {
	text, err := deparseStmt(&pg.SelectStmt{TargetList: []*pg.Node{resTarget("", n)},
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT, Op: pg.SetOperation_SETOP_NONE})
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(text, "SELECT "), nil
}

// finalPieces cuts the deparsed final statement at its source and at each
// lattice_agg_N placeholder.
func finalPieces(text string, naggs int) ([]string, []int, bool) {
	toks, _, ok := scan(text)
	if !ok {
		return nil, nil, false
	}
	var pieces []string
	var holes []int
	last, seen, sources := 0, make([]bool, naggs), 0
	for _, t := range toks {
		if t.kind != pg.Token_IDENT {
			continue
		}
		word := t.text(text)
		h := -2
		if word == aggSource {
			h = -1
			sources++
		} else if n, ok := strings.CutPrefix(word, "lattice_agg_"); ok {
			k, err := strconv.Atoi(n)
			if err != nil || k < 1 || k > naggs {
				return nil, nil, false
			}
			h = k - 1
			seen[h] = true
		}
		if h == -2 {
			continue
		}
		pieces = append(pieces, text[last:t.start])
		holes = append(holes, h)
		last = int(t.end)
	}
	pieces = append(pieces, text[last:])
	for _, s := range seen {
		if !s {
			return nil, nil, false
		}
	}
	return pieces, holes, sources == 1
}

// paramNumbers lists the $n the statements or clauses reference, in
// increasing order.
func paramNumbers(ms ...proto.Message) []int {
	seen := map[int]bool{}
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if v, ok := m.Interface().(*pg.ParamRef); ok && v.Number > 0 {
			seen[int(v.Number)] = true
		}
		eachChild(m, visit)
	}
	for _, m := range ms {
		visit(m.ProtoReflect())
	}
	var out []int
	for n := 1; len(out) < len(seen); n++ {
		if seen[n] {
			out = append(out, n)
		}
	}
	return out
}

// texts deparses the two steps and the whole statement into the plan, cut
// at their holes; false when one of them does not parse back to itself.
func (a *AggPlan) texts(partial, whole, final *pg.SelectStmt) bool {
	ptext, err := deparseStmt(partial)
	if err != nil {
		return false
	}
	var ok bool
	if a.partial, ok = cutRefs(ptext, len(a.refs)); !ok {
		return false
	}
	wtext, err := deparseStmt(whole)
	if err != nil {
		return false
	}
	if a.whole, ok = cutRefs(wtext, len(a.refs)); !ok {
		return false
	}
	ftext, err := deparseStmt(final)
	if err != nil {
		return false
	}
	if a.final, a.holes, ok = finalPieces(ftext, len(a.aggs)); !ok {
		return false
	}
	// A sampled reference's clause is in the partial query's text only.
	partials := []proto.Message{partial}
	for _, r := range a.refs {
		if r.sampled != nil {
			partials = append(partials, r.sampled)
		}
	}
	a.PartialParams, a.FinalParams = paramNumbers(partials...), paramNumbers(final)
	return true
}
