package router

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/sqlstate"
)

// A SELECT of one tree that does not fix the shard key runs on every node:
// each node gets the statement once per shard it holds, glued with UNION
// ALL, ordered by the statement's ORDER BY and cut to LIMIT+OFFSET rows;
// the proxy merges the nodes' streams by the same keys and applies OFFSET
// and LIMIT after the merge.
//
// A branch is the statement's own text up to its ORDER BY / LIMIT / OFFSET
// / FETCH, with the tree reference moved to the shard schema and, for each
// sort key that is not an output column, the key expression's text
// appended to the select list as a hidden column (AS lattice_sort_N). The
// branch is re-parsed when it is made and must give exactly the statement's
// parse tree with those changes, or the statement is refused.

// fanPlan is the analysis of a fan-out SELECT.
type fanPlan struct {
	sort          []btreeindex.SortKey
	hidden        int
	limit, offset *Value
	calls         []string
	hiddenKeys    []int    // for each hidden column in order, the index of its ORDER BY item
	probe         string   // the collation probe of the sort keys (collation.go), "" when every key has COLLATE "C"
	agg           *AggPlan // aggregates, GROUP BY, HAVING or DISTINCT: the two-step form
}

// fanRender holds a FanOut plan's per-shard branch and outer ORDER BY.
type fanRender struct {
	branch *renderer
	outer  string // "1 ASC NULLS LAST, 3 DESC NULLS FIRST", or ""
}

// RenderFanOut renders the statement a node runs for the given shard
// schemas: (branch for schema 1) UNION ALL (branch for schema 2) ...,
// then, when the statement has an ORDER BY, ORDER BY the keys' output
// positions with explicit ASC/DESC and NULLS FIRST/LAST, and, when limit
// >= 0, LIMIT limit. limit is the number of rows the node must return
// (LIMIT + OFFSET; -1 for all). Each branch is the statement without its
// ORDER BY, LIMIT, OFFSET and FETCH, the tree qualified by the schema, and
// the hidden sort columns appended to the select list. Parameters keep
// their numbers; a parameter used only in LIMIT or OFFSET no longer
// appears. It panics if the plan is not FanOut or schemas is empty.
func (p *Plan) RenderFanOut(schemas []btreeindex.Source, limit int64) string {
	if p.fan == nil {
		panic("router: RenderFanOut on a " + p.Kind.String() + " plan")
	}
	if len(schemas) == 0 {
		panic("router: RenderFanOut with no schemas")
	}
	var b strings.Builder
	for i, s := range schemas {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteByte('(')
		b.WriteString(p.fan.branch.renderSource(s))
		b.WriteByte(')')
	}
	if p.fan.outer != "" {
		b.WriteString(" ORDER BY ")
		b.WriteString(p.fan.outer)
	}
	if limit >= 0 {
		b.WriteString(" LIMIT ")
		b.WriteString(strconv.FormatInt(limit, 10))
	}
	return b.String()
}

// selectScan lists the parts of a SELECT where aggregates may appear.
func selectScan(s *pg.SelectStmt) []*pg.Node {
	var scan []*pg.Node
	scan = append(scan, s.TargetList...)
	scan = append(scan, s.SortClause...)
	if s.HavingClause != nil {
		scan = append(scan, s.HavingClause)
	}
	return scan
}

// fanOut decides whether a SELECT of one tree without its shard key can
// run on every shard with the results merged in the proxy.
func (p *planner) fanOut(r route, s *pg.SelectStmt) route {
	tree := r.tree
	r.sel = s
	keyHint := "Add " + tree.KeyColumn + " = <value> (or IN with one value) to the WHERE clause to read one shard"
	no := func(hint, format string, args ...any) route {
		return refusedRoute(refused(hint, "SELECT on tree %s does not fix the shard key %s, and %s",
			qn(tree.Name), qn(tree.KeyColumn), fmt.Sprintf(format, args...)))
	}
	if s.Op != pg.SetOperation_SETOP_NONE || len(s.ValuesLists) > 0 {
		return no(keyHint+", or run the parts as separate statements.", "set operations over several shards are not supported yet")
	}
	if from := p.replicatedPreserved(s); from != "" {
		return no(keyHint+", or put the tree on the preserved side of the outer join (an inner join, or "+qn(tree.Name)+" LEFT JOIN "+from+").",
			"an outer join keeps the rows of %s, which every shard holds whole, against the tree: each shard would add its own unmatched rows", from)
	}
	scan := selectScan(s)
	grouped := p.aggregating(s, scan, true)
	// Grouped by the key, what the two steps accept runs whole on the
	// shards: a statement they take reads only grouped or aggregated
	// columns, so it runs alike on a mixed shard, which is a derived table
	// with no primary key for a functional dependency to lean on.
	if grouped && !(p.groupedByKey(r, s) && p.aggAccepts(r, s)) {
		return p.aggFanOut(r, s, nil)
	}
	// A correlated subquery's window over several tree references runs
	// per outer row, on its shard, and one partitioned by the key on the
	// shards (window.go); other windows run in the final step
	// (windowstep.go).
	if r.multi == nil {
		r.keyedWindows = p.treeWindowsByKey(r, s)
	}
	if _, window := findAggregates(scan, r.multi != nil); (window || len(s.WindowClause) > 0) && !r.keyedWindows {
		return p.rowsFanOut(r, s, windowWords, nil)
	}
	switch {
	case len(s.LockingClause) > 0:
		return no("Lock rows by shard key: SELECT ... WHERE "+tree.KeyColumn+" = <value> FOR UPDATE.", "FOR UPDATE/SHARE over several shards is not supported")
	case s.LimitOption == pg.LimitOption_LIMIT_OPTION_WITH_TIES:
		return p.rowsFanOut(r, s, tiesWords, nil)
	}
	// Windows here are partitioned by the key and run whole on each shard:
	// their names are no aggregate to combine (rank is also a
	// hypothetical-set aggregate in the catalog).
	// A subquery's calls run whole on each shard, but those that may
	// belong to this level: the proxy checks them for user-defined
	// aggregates.
	f := &fanPlan{}
	if !grouped {
		f.calls = p.withOuterCalls(s, scan, callNames(scan, true, true))
	}
	var msg string
	if f.limit, msg = limitValue(s.LimitCount, "LIMIT"); msg != "" {
		return no(keyHint+", or give LIMIT as an integer constant or a $n parameter.", "%s", msg)
	}
	if f.offset, msg = limitValue(s.LimitOffset, "OFFSET"); msg != "" {
		return no(keyHint+", or give OFFSET as an integer constant or a $n parameter.", "%s", msg)
	}

	// Output columns, with * expanded when the tree is all the FROM list
	// and its columns are known.
	type outCol struct {
		name  string
		known bool     // name is PostgreSQL's output name
		expr  *pg.Node // nil for an unexpanded *
	}
	expandable := len(s.FromClause) == 1 && s.FromClause[0].GetRangeVar() == r.rv &&
		(r.rv.Alias == nil || len(r.rv.Alias.Colnames) == 0) && len(tree.Columns) > 0
	var cols []outCol
	exact, firstStar := true, -1 // firstStar: the first column that comes from a *
	for _, t := range s.TargetList {
		rt := t.GetResTarget()
		if rt == nil {
			return refusedRoute(fanError(tree.Name))
		}
		if isStar(rt.Val) {
			if firstStar < 0 {
				firstStar = len(cols)
			}
			if expandable {
				for _, c := range tree.Columns {
					cols = append(cols, outCol{name: c, known: true, expr: columnNode(c)})
				}
				continue
			}
			exact = false
			cols = append(cols, outCol{})
			continue
		}
		name, known := rt.Name, true
		if name == "" {
			name, known = figureName(rt.Val)
		}
		cols = append(cols, outCol{name: name, known: known, expr: rt.Val})
	}
	// Positions from the first * on depend on the tree's columns, which the
	// proxy cannot check: keys there are hidden columns instead.
	stable := func(i int) bool { return firstStar < 0 || i < firstStar }
	same := func(a, b *pg.Node) bool { return sameExpr(a, b, r) }

	const posHint = "Sort by output column position (ORDER BY 2) or list the columns instead of *"
	var hiddenExprs []*pg.Node
	var probe []*pg.Node // each key's expression, nil where the proxy does not know it
	for i, n := range s.SortClause {
		sb := n.GetSortBy()
		if sb == nil {
			return refusedRoute(fanError(tree.Name))
		}
		k, ok := sortDirection(sb)
		if !ok {
			return no(keyHint+", or sort with ASC or DESC.", "ORDER BY ... USING over several shards is not supported")
		}
		e := sb.Node
		var resolved *pg.Node
		hidden := false
		if c := e.GetAConst(); c != nil {
			iv := c.GetIval()
			if iv == nil || c.Isnull {
				return no("Sort by an output column position or an expression.", "ORDER BY item %d is a constant that is not a column position", i+1)
			}
			if iv.Ival < 1 || firstStar < 0 && int(iv.Ival) > len(cols) {
				return no("Sort by a position between 1 and the number of output columns.", "ORDER BY position %d is not in the select list", iv.Ival)
			}
			k.Column = int(iv.Ival) - 1
			if k.Column < len(cols) && (exact || k.Column < firstStar) {
				resolved = cols[k.Column].expr
			}
		} else {
			matched := -1
			if name, ok := bareName(e); ok {
				// SQL92: an output column name takes precedence.
				var cands []int
				for j, oc := range cols {
					if oc.expr != nil && !oc.known {
						return no(posHint+", or give every output column an alias.", "the proxy cannot tell whether ORDER BY %s names an output column", qn(name))
					}
					if oc.expr != nil && oc.name == name {
						cands = append(cands, j)
					}
				}
				for _, j := range cands {
					if !same(cols[j].expr, cols[cands[0]].expr) || !exact && !same(cols[j].expr, e) {
						return no(posHint+".", "ORDER BY %s is ambiguous", qn(name))
					}
				}
				if len(cands) > 0 {
					matched = cands[0]
				}
			}
			if matched < 0 {
				// SQL99: an expression equal to an output column's.
				for j, oc := range cols {
					if oc.expr != nil && same(oc.expr, e) {
						matched = j
						break
					}
				}
			}
			switch {
			case matched >= 0 && stable(matched):
				k.Column, resolved = matched, cols[matched].expr
			case matched >= 0 && (!same(cols[matched].expr, e) || hasFuncCall(e)):
				return no(posHint+".", "ORDER BY item %d refers to an output column that follows *, whose position the proxy does not know", i+1)
			default:
				hidden, resolved = true, e
			}
		}
		if hidden {
			if !exact {
				return no(posHint+".", "ORDER BY item %d is not an output column and the select list has *, whose columns the proxy does not know", i+1)
			}
			f.hiddenKeys = append(f.hiddenKeys, i)
			hiddenExprs = append(hiddenExprs, e)
		}
		k.ByteOrder = byteCollation(resolved)
		f.sort = append(f.sort, k)
		probe = append(probe, resolved)
	}
	f.hidden = len(f.hiddenKeys)
	for j, i := range f.hiddenKeys {
		f.sort[i].Column = len(cols) + j
	}
	for _, k := range f.sort {
		if !k.ByteOrder {
			f.probe = collationProbe(r, probe)
			break
		}
	}
	r.kind, r.sel, r.fan = FanOut, s, f
	return r
}

// groupedByKey reports whether an aggregating SELECT groups by the key of
// one of its top-level tree references that is on no nullable side: each
// group's rows then have one key, and so are in one shard (over several
// references, colocated ones joined on the key, each row combines rows of
// one key). The statement runs whole on every shard, aggregates, HAVING
// and any function included, and the groups are merged as the rows of a
// plain fan-out, without the final step on the catalog node. DISTINCT
// (equal rows of groups on different shards), grouping sets (groups
// across keys) and windows (over the groups of every shard) keep the two
// steps.
func (p *planner) groupedByKey(r route, s *pg.SelectStmt) bool {
	if len(s.DistinctClause) > 0 || s.GroupDistinct || len(s.WindowClause) > 0 ||
		hasWindowCall(s) || windowCallIn(s.SortClause...) {
		return false
	}
	isKey := func(g *pg.Node) bool {
		if r.multi == nil {
			return p.isKeyColumn(g, r.rv, r.tree)
		}
		for _, m := range r.multi {
			if m.level == 0 && !m.nullable && !m.derived && p.isKeyColumn(g, m.rv, m.tree) {
				return true
			}
		}
		return false
	}
	key := false
	for _, g := range s.GroupClause {
		if g.GetGroupingSet() != nil {
			return false
		}
		if c := g.GetAConst(); c != nil && c.GetIval() != nil {
			// GROUP BY 1: the output column at that position, counted
			// only where no * before it hides how many columns it has.
			k := int(c.GetIval().Ival)
			if k < 1 || k > len(s.TargetList) {
				return false
			}
			for _, t := range s.TargetList[:k] {
				if t.GetResTarget() == nil || isStar(t.GetResTarget().Val) {
					return false
				}
			}
			g = s.TargetList[k-1].GetResTarget().Val
		}
		key = key || isKey(g)
	}
	return key
}

// sortDirection is an ORDER BY item's direction and NULLS placement as a
// merge key without its column; false for USING.
func sortDirection(sb *pg.SortBy) (btreeindex.SortKey, bool) {
	k := btreeindex.SortKey{Column: -1, Desc: sb.SortbyDir == pg.SortByDir_SORTBY_DESC}
	switch sb.SortbyDir {
	case pg.SortByDir_SORTBY_DEFAULT, pg.SortByDir_SORTBY_ASC, pg.SortByDir_SORTBY_DESC:
	default:
		return k, false
	}
	switch sb.SortbyNulls {
	case pg.SortByNulls_SORTBY_NULLS_FIRST:
		k.NullsFirst = true
	case pg.SortByNulls_SORTBY_NULLS_LAST:
	default:
		k.NullsFirst = k.Desc
	}
	return k, true
}

func fanError(tree string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: "the proxy could not rewrite this SELECT on tree " + qn(tree) + " to run on several shards",
		Hint:    "Write ORDER BY, LIMIT and OFFSET at the end of the statement, outside parentheses, and SELECT ... FROM rather than TABLE; or fix the shard key in WHERE."}
}

// limitValue reads LIMIT or OFFSET: an integer constant or a $n parameter,
// possibly cast to an integer type; LIMIT ALL and NULL are no limit.
func limitValue(n *pg.Node, what string) (*Value, string) {
	if n == nil {
		return nil, ""
	}
	c, ok := asConstant(n)
	if ok && c.cast != nil {
		switch typeName(c.cast) {
		case "int2", "int4", "int8":
		default:
			ok = false
		}
	}
	if !ok {
		return nil, what + " over several shards must be an integer constant or a $n parameter"
	}
	switch c.kind {
	case litNull:
		return nil, ""
	case litParam:
		return &Value{Param: c.param}, ""
	case litInt, litNumeric, litString:
		// A quoted integer is coerced to bigint; drivers that interpolate
		// parameters (pgx's simple protocol) send LIMIT '5'.
		v, err := strconv.ParseInt(strings.TrimSpace(c.text), 10, 64)
		if err != nil {
			return nil, what + " over several shards must be an integer constant or a $n parameter"
		}
		if v < 0 {
			return nil, what + " must not be negative"
		}
		return &Value{Text: strconv.FormatInt(v, 10)}, ""
	}
	return nil, what + " over several shards must be an integer constant or a $n parameter"
}

// functionNames lists the functions nodes call, lower-case and unqualified:
// the proxy asks the catalog which are user-defined aggregates, which the
// names alone cannot tell.
func functionNames(nodes []*pg.Node) []string { return findFunctionNames(nodes, false) }

// findFunctionNames is functionNames, outside subqueries only when top (a
// correlated subquery of a multi-reference statement runs whole per outer
// row: its aggregates need no merge), and then without the window calls (a
// window of such a statement over several shards is partitioned by the
// key: window.go).
func findFunctionNames(nodes []*pg.Node, top bool) []string {
	return callNames(nodes, top, top)
}

// callNames lists the functions nodes call, outside subqueries only when
// top, and without the window calls (which run whole on the shards or in
// the final step) when windowless.
func callNames(nodes []*pg.Node, top, windowless bool) []string {
	seen := map[string]bool{}
	var out []string
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if v, ok := m.Interface().(*pg.SubLink); ok && top {
			if v.Testexpr != nil {
				visit(v.Testexpr.ProtoReflect())
			}
			return
		}
		if v, ok := m.Interface().(*pg.FuncCall); ok && len(v.Funcname) > 0 && !(windowless && v.Over != nil) {
			name := strings.ToLower(v.Funcname[len(v.Funcname)-1].GetString_().GetSval())
			if !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		}
		eachChild(m, visit)
	}
	for _, n := range nodes {
		if n != nil {
			visit(n.ProtoReflect())
		}
	}
	return out
}

// aggregateNames are PostgreSQL's built-in aggregate functions.
var aggregateNames = map[string]bool{
	"avg": true, "bit_and": true, "bit_or": true, "bit_xor": true, "bool_and": true, "bool_or": true,
	"count": true, "every": true, "max": true, "min": true, "sum": true, "string_agg": true,
	"array_agg": true, "json_agg": true, "jsonb_agg": true, "json_agg_strict": true, "jsonb_agg_strict": true,
	"json_object_agg": true, "jsonb_object_agg": true, "json_object_agg_strict": true, "jsonb_object_agg_strict": true,
	"json_object_agg_unique": true, "jsonb_object_agg_unique": true, "json_object_agg_unique_strict": true,
	"jsonb_object_agg_unique_strict": true, "xmlagg": true, "corr": true, "covar_pop": true, "covar_samp": true,
	"regr_avgx": true, "regr_avgy": true, "regr_count": true, "regr_intercept": true, "regr_r2": true,
	"regr_slope": true, "regr_sxx": true, "regr_sxy": true, "regr_syy": true, "stddev": true,
	"stddev_pop": true, "stddev_samp": true, "variance": true, "var_pop": true, "var_samp": true,
	"range_agg": true, "range_intersect_agg": true, "any_value": true, "mode": true,
	"percentile_cont": true, "percentile_disc": true, "rank": true, "dense_rank": true,
	"percent_rank": true, "cume_dist": true, "grouping": true,
}

// aggregateSyntax names the node if it is an aggregate written with its
// own syntax rather than as a function call, else "".
func aggregateSyntax(m protoreflect.Message) string {
	switch m.Interface().(type) {
	case *pg.GroupingFunc:
		return "GROUPING()"
	case *pg.JsonArrayAgg:
		return "JSON_ARRAYAGG()"
	case *pg.JsonObjectAgg:
		return "JSON_OBJECTAGG()"
	}
	return ""
}

// aggregates finds, anywhere in nodes (subqueries included), a call of an
// aggregate (by name or by aggregate-only syntax) and any window function.
func aggregates(nodes []*pg.Node) (agg string, window bool) {
	return findAggregates(nodes, false)
}

// findAggregates is aggregates, outside subqueries only when top: a
// correlated subquery of a multi-reference statement aggregates per outer
// row, on the outer row's shard.
func findAggregates(nodes []*pg.Node, top bool) (agg string, window bool) {
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if agg != "" {
			return
		}
		switch v := m.Interface().(type) {
		case *pg.SubLink:
			if top {
				if v.Testexpr != nil {
					visit(v.Testexpr.ProtoReflect())
				}
				return
			}
		case *pg.FuncCall:
			if v.Over != nil {
				window = true
			}
			name := ""
			if len(v.Funcname) > 0 {
				name = strings.ToLower(v.Funcname[len(v.Funcname)-1].GetString_().GetSval())
			}
			if v.Over == nil && (aggregateNames[name] || v.AggStar || v.AggDistinct || len(v.AggOrder) > 0 || v.AggFilter != nil || v.AggWithinGroup) {
				agg = name + "()"
				return
			}
		}
		if agg = aggregateSyntax(m); agg != "" {
			return
		}
		eachChild(m, visit)
	}
	for _, n := range nodes {
		if n != nil {
			visit(n.ProtoReflect())
		}
	}
	return agg, window
}

// eachChild calls f on every message directly inside m.
func eachChild(m protoreflect.Message, f func(protoreflect.Message)) {
	rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				f(l.Get(i).Message())
			}
			return true
		}
		f(v.Message())
		return true
	})
}

func hasFuncCall(n *pg.Node) bool {
	found := false
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if _, ok := m.Interface().(*pg.FuncCall); ok {
			found = true
		}
		if !found {
			eachChild(m, visit)
		}
	}
	if n != nil {
		visit(n.ProtoReflect())
	}
	return found
}

// byteCollation reports whether a sort expression carries COLLATE "C" or
// "POSIX" on the outside, which orders text as its bytes whatever the
// column's or the database's collation. Any other key's collation is
// found by the collation probe.
func byteCollation(n *pg.Node) bool {
	cc := n.GetCollateClause()
	if cc == nil {
		return false
	}
	k := len(cc.Collname)
	name := cc.Collname[k-1].GetString_().GetSval()
	return (name == "C" || name == "POSIX") && (k == 1 || k == 2 && cc.Collname[0].GetString_().GetSval() == "pg_catalog")
}

func isStar(n *pg.Node) bool {
	c := n.GetColumnRef()
	return c != nil && len(c.Fields) > 0 && c.Fields[len(c.Fields)-1].GetAStar() != nil
}

func columnNode(name string) *pg.Node {
	return &pg.Node{Node: &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{pg.MakeStrNode(name)}}}}
}

// bareName returns the name of an unqualified column reference.
func bareName(n *pg.Node) (string, bool) {
	c := n.GetColumnRef()
	if c == nil || len(c.Fields) != 1 || c.Fields[0].GetString_() == nil {
		return "", false
	}
	return c.Fields[0].GetString_().Sval, true
}

// treeColumn returns the column a reference names when it is a column of
// the tree written as col, ref.col or public.tree.col.
func treeColumn(n *pg.Node, r route) (string, bool) {
	f, ok := columnFields(n)
	if !ok {
		return "", false
	}
	ref := r.rv.Relname
	if r.rv.Alias != nil {
		ref = r.rv.Alias.Aliasname
	}
	switch len(f) {
	case 1:
		return f[0], len(r.sel.FromClause) == 1 && r.sel.FromClause[0].GetRangeVar() == r.rv
	case 2:
		return f[1], f[0] == ref
	case 3:
		return f[2], r.rv.Alias == nil && f[0] == "public" && f[1] == r.rv.Relname
	}
	return "", false
}

// sameExpr reports whether two expressions parse to the same tree (their
// locations aside), or name the same column of the tree.
func sameExpr(a, b *pg.Node, r route) bool {
	if a == nil || b == nil {
		return false
	}
	if ca, ok := treeColumn(a, r); ok {
		cb, ok := treeColumn(b, r)
		return ok && ca == cb
	}
	return sameTree(a, b)
}

// sameTree compares two parse trees without their locations.
func sameTree(a, b proto.Message) bool {
	a, b = proto.Clone(a), proto.Clone(b)
	stripLocations(a.ProtoReflect())
	stripLocations(b.ProtoReflect())
	return proto.Equal(a, b)
}

func stripLocations(m protoreflect.Message) {
	if fd := m.Descriptor().Fields().ByName("location"); fd != nil {
		m.Clear(fd)
	}
	eachChild(m, stripLocations)
}

// figureName is the output name PostgreSQL gives an unaliased select-list
// expression (FigureColname); false when the proxy cannot tell.
func figureName(n *pg.Node) (string, bool) {
	name, strength, ok := figure(n)
	if !ok {
		return "", false
	}
	if strength == 0 {
		return "?column?", true
	}
	return name, true
}

func figure(n *pg.Node) (string, int, bool) {
	if n == nil {
		return "", 0, true
	}
	switch v := n.Node.(type) {
	case *pg.Node_ColumnRef:
		name := ""
		for _, f := range v.ColumnRef.Fields {
			if s := f.GetString_(); s != nil {
				name = s.Sval
			}
		}
		if name != "" {
			return name, 2, true
		}
		return "", 0, true
	case *pg.Node_AIndirection:
		name := ""
		for _, f := range v.AIndirection.Indirection {
			if s := f.GetString_(); s != nil {
				name = s.Sval
			}
		}
		if name != "" {
			return name, 2, true
		}
		return figure(v.AIndirection.Arg)
	case *pg.Node_FuncCall:
		f := v.FuncCall.Funcname
		return f[len(f)-1].GetString_().GetSval(), 2, true
	case *pg.Node_AExpr:
		if v.AExpr.Kind == pg.A_Expr_Kind_AEXPR_NULLIF {
			return "nullif", 2, true
		}
		return "", 0, true
	case *pg.Node_TypeCast:
		name, st, ok := figure(v.TypeCast.Arg)
		if !ok {
			return "", 0, false
		}
		if st <= 1 && v.TypeCast.TypeName != nil && len(v.TypeCast.TypeName.Names) > 0 {
			ns := v.TypeCast.TypeName.Names
			return ns[len(ns)-1].GetString_().GetSval(), 1, true
		}
		return name, st, true
	case *pg.Node_CollateClause:
		return figure(v.CollateClause.Arg)
	case *pg.Node_SubLink:
		switch v.SubLink.SubLinkType {
		case pg.SubLinkType_EXISTS_SUBLINK:
			return "exists", 2, true
		case pg.SubLinkType_ARRAY_SUBLINK:
			return "array", 2, true
		case pg.SubLinkType_EXPR_SUBLINK:
			return "", 0, false
		}
		return "", 0, true
	case *pg.Node_CaseExpr:
		name, st, ok := figure(v.CaseExpr.Defresult)
		if !ok {
			return "", 0, false
		}
		if st <= 1 {
			return "case", 1, true
		}
		return name, st, true
	case *pg.Node_AArrayExpr:
		return "array", 2, true
	case *pg.Node_GroupingFunc:
		return "grouping", 2, true
	case *pg.Node_RowExpr:
		return "row", 2, true
	case *pg.Node_CoalesceExpr:
		return "coalesce", 2, true
	case *pg.Node_MinMaxExpr:
		if v.MinMaxExpr.Op == pg.MinMaxOp_IS_GREATEST {
			return "greatest", 2, true
		}
		return "least", 2, true
	case *pg.Node_SqlvalueFunction:
		op := strings.TrimPrefix(v.SqlvalueFunction.Op.String(), "SVFOP_")
		return strings.ToLower(strings.TrimSuffix(op, "_N")), 2, true
	case *pg.Node_AConst, *pg.Node_ParamRef, *pg.Node_BoolExpr, *pg.Node_NullTest, *pg.Node_BooleanTest:
		return "", 0, true
	}
	return "", 0, false
}

// fanRenderer cuts the statement sql[start:end] into its per-shard branch
// and checks the branch by parsing it.
func (p *planner) fanRenderer(r route, start, end int) (*fanRender, *sqlstate.Error) {
	s, f, tree := r.sel, r.fan, r.tree
	bad := fanError(tree.Name)
	var refs []span
	var holes []refHole
	var err *sqlstate.Error
	if r.multi != nil {
		refs, holes, err = p.multiSpans(r)
	} else {
		refs, err = p.refSpans(r)
	}
	if err != nil {
		return nil, err
	}
	all := p.tokens()
	lo := sort.Search(len(all), func(i int) bool { return int(all[i].start) >= start })
	hi := lo
	for hi < len(all) && int(all[hi].end) <= end {
		hi++
	}
	toks := all[lo:hi]
	next := func(i int) int {
		for i++; i < len(toks); i++ {
			if !isComment(toks[i]) {
				return i
			}
		}
		return -1
	}

	// The tail: ORDER BY, LIMIT, OFFSET, FETCH at the top level.
	tail, depth := -1, 0
	for i, t := range toks {
		switch t.kind {
		case pg.Token_ASCII_40, pg.Token_ASCII_91:
			depth++
		case pg.Token_ASCII_41, pg.Token_ASCII_93:
			depth--
		case pg.Token_ORDER, pg.Token_LIMIT, pg.Token_OFFSET, pg.Token_FETCH:
			if depth == 0 && tail < 0 {
				tail = i
			}
		}
	}
	if need := len(s.SortClause) > 0 || s.LimitCount != nil || s.LimitOffset != nil; need != (tail >= 0) {
		return nil, bad
	}
	// The branch ends at its last token: no trailing comment may swallow
	// the ) that closes it.
	if strings.IndexByte(p.sql[start:end], 0) >= 0 {
		return nil, bad
	}
	branchEnd, stop := start, tail
	if tail < 0 {
		stop = len(toks)
	}
	{
		for i := stop - 1; i >= 0; i-- {
			if !isComment(toks[i]) {
				branchEnd = int(toks[i].end)
				break
			}
		}
	}

	// The ORDER BY items' expressions.
	var items []span
	if len(s.SortClause) > 0 {
		if toks[tail].kind != pg.Token_ORDER {
			return nil, bad
		}
		i := next(tail)
		if i < 0 || toks[i].kind != pg.Token_BY {
			return nil, bad
		}
		var cur []int
		depth = 0
		flush := func() bool {
			if len(cur) == 0 {
				return false
			}
			k := len(items)
			if k >= len(s.SortClause) {
				return false
			}
			sb := s.SortClause[k].GetSortBy()
			word := func(j int, words ...string) bool {
				t := toks[cur[j]]
				text := p.sql[t.start:t.end]
				for _, w := range words {
					if strings.EqualFold(text, w) {
						return true
					}
				}
				return false
			}
			n := len(cur)
			if sb.SortbyNulls != pg.SortByNulls_SORTBY_NULLS_DEFAULT {
				if n < 3 || !word(n-2, "nulls") || !word(n-1, "first", "last") {
					return false
				}
				n -= 2
			}
			if sb.SortbyDir != pg.SortByDir_SORTBY_DEFAULT {
				if n < 2 || !word(n-1, "asc", "desc") {
					return false
				}
				n--
			}
			items = append(items, span{int(toks[cur[0]].start), int(toks[cur[n-1]].end)})
			cur = nil
			return true
		}
		for i = next(i); i >= 0; i = next(i) {
			t := toks[i]
			switch t.kind {
			case pg.Token_ASCII_40, pg.Token_ASCII_91:
				depth++
			case pg.Token_ASCII_41, pg.Token_ASCII_93:
				depth--
			}
			if depth == 0 && (t.kind == pg.Token_LIMIT || t.kind == pg.Token_OFFSET || t.kind == pg.Token_FETCH) {
				break
			}
			if depth == 0 && t.kind == pg.Token_ASCII_44 {
				if !flush() {
					return nil, bad
				}
				continue
			}
			cur = append(cur, i)
		}
		if !flush() || len(items) != len(s.SortClause) {
			return nil, bad
		}
	}

	// Where the hidden columns go: after the last token of the select
	// list, before a FROM keyword. Candidates are tried until one gives
	// the intended parse tree.
	inserts := []int{-1}
	if f.hidden > 0 {
		inserts = nil
		if len(s.TargetList) == 0 {
			return nil, bad
		}
		lastTarget := int(s.TargetList[len(s.TargetList)-1].GetResTarget().GetLocation())
		for i, t := range toks {
			if t.kind != pg.Token_FROM || int(t.start) <= lastTarget || int(t.start) >= int(r.rv.Location) || lastTarget < start {
				continue
			}
			for j := i - 1; j >= 0; j-- {
				if !isComment(toks[j]) {
					if int(toks[j].end) > lastTarget {
						inserts = append(inserts, int(toks[j].end))
					}
					break
				}
			}
			if len(inserts) == 8 {
				break
			}
		}
	}
	const verifySchema = "lattice_s0001"
	want := p.expectedBranch(r, verifySchema)
	for _, ins := range inserts {
		var b strings.Builder
		var spans []span
		var branchHoles []refHole
		rel, table := -1, -1
		copyText := func(from, to int) {
			at := b.Len()
			for k, rf := range refs {
				if rf.start >= from && rf.end <= to {
					if rf.start == int(r.rv.Location) {
						rel = len(spans)
						table = tableKeyword(toks, rf.start, from, to, at)
					}
					spans = append(spans, span{rf.start - from + at, rf.end - from + at})
					if holes != nil {
						branchHoles = append(branchHoles, holes[k])
					}
				}
			}
			b.WriteString(p.sql[from:to])
		}
		if ins < 0 {
			copyText(start, branchEnd)
		} else {
			copyText(start, ins)
			for k, i := range f.hiddenKeys {
				b.WriteString(", ")
				copyText(items[i].start, items[i].end)
				b.WriteString(" AS lattice_sort_" + strconv.Itoa(k+1))
			}
			if ins < branchEnd && !isSpace(p.sql[ins]) {
				b.WriteByte(' ')
			}
			copyText(ins, branchEnd)
		}
		q := &planner{sql: b.String()}
		rd, err := q.renderer(tree, spans, 0, len(q.sql))
		if err != nil {
			continue
		}
		// TABLE tree has no other reference before the tree's: the
		// keyword's offset in b is its offset in texts[0].
		rd.rel, rd.aliased, rd.table = rel, r.rv.Alias != nil, table
		if holes != nil {
			if len(branchHoles) != len(holes) {
				continue
			}
			rd.multi, rd.base = branchHoles, tree
		}
		res, perr := pg.Parse(rd.render(verifySchema))
		if perr != nil || len(res.Stmts) != 1 {
			continue
		}
		got := res.Stmts[0].Stmt.GetSelectStmt()
		if got == nil || !sameTree(got, want) {
			continue
		}
		fr := &fanRender{branch: rd}
		var outer []string
		for _, k := range f.sort {
			outer = append(outer, strconv.Itoa(k.Column+1)+" "+k.Order())
		}
		fr.outer = strings.Join(outer, ", ")
		return fr, nil
	}
	return nil, bad
}

// tableKeyword returns, for a reference at ref copied from [from, to) to
// offset at of the branch text, the branch offset of a TABLE keyword right
// before it (the TABLE name form), or -1.
func tableKeyword(toks []token, ref, from, to, at int) int {
	prev := -1
	for i, t := range toks {
		if int(t.start) >= ref {
			break
		}
		if !isComment(t) {
			prev = i
		}
	}
	if prev < 0 || toks[prev].kind != pg.Token_TABLE || int(toks[prev].start) < from || int(toks[prev].end) > to {
		return -1
	}
	return int(toks[prev].start) - from + at
}

// expectedBranch is the parse tree a branch for schema must have: the
// statement with the tree (and public.tree.col references) in schema, the
// hidden sort expressions appended to the select list, and no ORDER BY,
// LIMIT or OFFSET.
func (p *planner) expectedBranch(r route, schema string) *pg.SelectStmt {
	s := proto.Clone(r.sel).(*pg.SelectStmt)
	colLocs := make(map[int32]bool)
	for _, c := range r.cols {
		colLocs[c.Location] = true
	}
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		switch v := m.Interface().(type) {
		case *pg.RangeVar:
			if t := r.refTree(v); t != nil {
				v.Schemaname, v.Catalogname, v.Relname = schema, "", t.Name
			}
			return
		case *pg.ColumnRef:
			if colLocs[v.Location] && len(v.Fields) >= 3 {
				v.Fields[0] = pg.MakeStrNode(schema)
			}
			return
		}
		eachChild(m, visit)
	}
	visit(s.ProtoReflect())
	for k, i := range r.fan.hiddenKeys {
		s.TargetList = append(s.TargetList, &pg.Node{Node: &pg.Node_ResTarget{ResTarget: &pg.ResTarget{
			Name: "lattice_sort_" + strconv.Itoa(k+1),
			Val:  s.SortClause[i].GetSortBy().Node,
		}}})
	}
	s.SortClause, s.LimitCount, s.LimitOffset = nil, nil, nil
	s.LimitOption = pg.LimitOption_LIMIT_OPTION_DEFAULT
	return s
}
