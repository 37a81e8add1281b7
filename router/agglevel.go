package router

import (
	"slices"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// PostgreSQL puts an aggregate at the innermost query level that one of
// its arguments' columns comes from, and at its own level when they name
// no column (check_agg_arguments). So in
//
//	SELECT (SELECT max(a.v)) FROM t a
//
// the max aggregates the outer SELECT, which returns one row; run whole
// on every shard, the statement would return a row per shard. The proxy
// reads a column as the subquery's own only when it can tell; otherwise
// the call may belong to the outer level, which is the safe reading: the
// statement is then planned as aggregating (and refused over several
// shards, since its final step cannot carry the subquery).

// fromScope is what one query level's FROM list makes visible.
type fromScope struct {
	names   map[string]bool // the names FROM items are referred to by
	cols    map[string]bool // the columns of the FROM items, where known
	unknown bool            // some FROM item's columns are not known
}

// outerCalls returns the function calls inside the subqueries of nodes,
// parts of s outside its FROM, that may belong to s's level or one around
// it: every column they name may come from outside the subquery. A call
// that names no column belongs to its own level and is left out.
func (p *planner) outerCalls(s *pg.SelectStmt, nodes []*pg.Node) []*pg.FuncCall {
	ctes := map[string]bool{}
	addCTEs(ctes, s.WithClause)
	top := p.scopeOf(s.FromClause, ctes)
	var inner []fromScope // the subqueries' levels around the visit, innermost last
	var out []*pg.FuncCall
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		switch v := m.Interface().(type) {
		case *pg.SelectStmt:
			addCTEs(ctes, v.WithClause)
			inner = append(inner, p.scopeOf(v.FromClause, ctes))
			eachChild(m, visit)
			inner = inner[:len(inner)-1]
			return
		case *pg.FuncCall:
			if len(inner) > 0 && v.Over == nil && !p.namesOwnColumn(v, inner, top, ctes) {
				out = append(out, v)
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

// outerAggregate names an aggregate inside a subquery of nodes that may
// aggregate s itself (outerCalls), or "".
func (p *planner) outerAggregate(s *pg.SelectStmt, nodes []*pg.Node) string {
	for _, fc := range p.outerCalls(s, nodes) {
		if isAggregateCall(fc) {
			return funcName(fc) + "()"
		}
	}
	return ""
}

// withOuterCalls adds to names the functions outerCalls finds, for the
// proxy's check for user-defined aggregates, which names alone cannot
// tell apart from other functions.
func (p *planner) withOuterCalls(s *pg.SelectStmt, nodes []*pg.Node, names []string) []string {
	for _, fc := range p.outerCalls(s, nodes) {
		name := funcName(fc)
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// namesOwnColumn reports whether fc belongs to one of the subquery levels
// inner: it names no column from outside its own subqueries, or one that
// the proxy can tell comes from inner (columnIsInner). A column inside a
// subquery of fc's arguments that is that subquery's own does not place
// fc; one that may come from further out counts like fc's own columns,
// and as not inner when it may also be the subquery's own.
func (p *planner) namesOwnColumn(fc *pg.FuncCall, inner []fromScope, top fromScope, ctes map[string]bool) bool {
	named, own := false, false
	var nested []fromScope
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		switch v := m.Interface().(type) {
		case *pg.SelectStmt:
			addCTEs(ctes, v.WithClause)
			nested = append(nested, p.scopeOf(v.FromClause, ctes))
			eachChild(m, visit)
			nested = nested[:len(nested)-1]
			return
		case *pg.ColumnRef:
			switch columnIn(v, nested) {
			case there:
			case mayBeThere:
				named = true
			default:
				named = true
				own = own || columnIsInner(v, inner, top)
			}
			return
		}
		eachChild(m, visit)
	}
	eachChild(fc.ProtoReflect(), visit)
	return own || !named
}

type likelihood int

const (
	notThere likelihood = iota
	mayBeThere
	there
)

// columnIn tells whether column c comes from one of the levels scopes.
func columnIn(c *pg.ColumnRef, scopes []fromScope) likelihood {
	n := len(c.Fields)
	if n == 0 || len(scopes) == 0 {
		return notThere
	}
	if n >= 2 {
		if rel := c.Fields[n-2].GetString_(); rel != nil {
			for _, sc := range scopes {
				if sc.names[rel.Sval] {
					return there
				}
			}
		}
		return notThere
	}
	col := c.Fields[0].GetString_()
	if col == nil {
		return notThere
	}
	out := notThere
	for _, sc := range scopes {
		if sc.cols[col.Sval] {
			return there
		}
		if sc.unknown {
			out = mayBeThere
		}
	}
	return out
}

// columnIsInner reports whether column c comes from the levels inner:
// it does when one of them names it, or may while top cannot.
func columnIsInner(c *pg.ColumnRef, inner []fromScope, top fromScope) bool {
	switch columnIn(c, inner) {
	case there:
		return true
	case mayBeThere:
		return columnIn(c, []fromScope{top}) == notThere
	}
	return false
}

// scopeOf is the scope a FROM list makes.
func (p *planner) scopeOf(from []*pg.Node, ctes map[string]bool) fromScope {
	sc := fromScope{names: map[string]bool{}, cols: map[string]bool{}}
	for _, item := range from {
		p.addFromItem(&sc, item, ctes)
	}
	return sc
}

func (p *planner) addFromItem(sc *fromScope, item *pg.Node, ctes map[string]bool) {
	if item == nil {
		return
	}
	switch v := item.Node.(type) {
	case *pg.Node_RangeVar:
		rv := v.RangeVar
		name := rv.Relname
		var renamed []*pg.Node
		if rv.Alias != nil {
			name, renamed = rv.Alias.Aliasname, rv.Alias.Colnames
		}
		sc.names[name] = true
		t, _ := p.lookup(rv)
		if t == nil || len(t.Columns) == 0 || rv.Schemaname == "" && ctes[rv.Relname] {
			sc.unknown = true
			addNames(sc.cols, renamed)
			return
		}
		addNames(sc.cols, renamed)
		for _, c := range t.Columns[min(len(renamed), len(t.Columns)):] {
			sc.cols[c] = true
		}
	case *pg.Node_RangeSubselect:
		rs := v.RangeSubselect
		if rs.Alias != nil {
			sc.names[rs.Alias.Aliasname] = true
			addNames(sc.cols, rs.Alias.Colnames)
		}
		sel := rs.Subquery.GetSelectStmt()
		if sel == nil || sel.Op != pg.SetOperation_SETOP_NONE || len(sel.ValuesLists) > 0 {
			sc.unknown = true
			return
		}
		skip := 0
		if rs.Alias != nil {
			skip = len(rs.Alias.Colnames)
		}
		for i, t := range sel.TargetList {
			rt := t.GetResTarget()
			if rt == nil || isStar(rt.Val) {
				sc.unknown = true
				return
			}
			if i < skip {
				continue
			}
			name := rt.Name
			if name == "" {
				var known bool
				if name, known = figureName(rt.Val); !known {
					sc.unknown = true
					continue
				}
			}
			sc.cols[name] = true
		}
	case *pg.Node_JoinExpr:
		j := v.JoinExpr
		sides := fromScope{names: map[string]bool{}, cols: map[string]bool{}}
		p.addFromItem(&sides, j.Larg, ctes)
		p.addFromItem(&sides, j.Rarg, ctes)
		for c := range sides.cols {
			sc.cols[c] = true
		}
		sc.unknown = sc.unknown || sides.unknown
		if j.Alias == nil {
			for n := range sides.names {
				sc.names[n] = true
			}
			return
		}
		// An aliased join hides its sides' names; a column list renames
		// its columns.
		sc.names[j.Alias.Aliasname] = true
		if len(j.Alias.Colnames) > 0 {
			sc.unknown = true
			addNames(sc.cols, j.Alias.Colnames)
		}
	case *pg.Node_RangeFunction:
		rf := v.RangeFunction
		sc.unknown = true
		if rf.Alias != nil {
			sc.names[rf.Alias.Aliasname] = true
			addNames(sc.cols, rf.Alias.Colnames)
			return
		}
		for _, f := range rf.Functions {
			if items := f.GetList().GetItems(); len(items) > 0 {
				if fc := items[0].GetFuncCall(); fc != nil && len(fc.Funcname) > 0 {
					sc.names[funcName(fc)] = true
				}
			}
		}
	case *pg.Node_RangeTableSample:
		p.addFromItem(sc, v.RangeTableSample.Relation, ctes)
	default:
		// XMLTABLE, JSON_TABLE and the like: columns the proxy does not
		// know, and a name it does not read, so that a column qualified
		// by it reads as not the level's own.
		sc.unknown = true
	}
}

func addNames(set map[string]bool, names []*pg.Node) {
	for _, n := range names {
		if s := n.GetString_(); s != nil {
			set[s.Sval] = true
		}
	}
}

func addCTEs(set map[string]bool, w *pg.WithClause) {
	if w == nil {
		return
	}
	for _, c := range w.Ctes {
		if cte := c.GetCommonTableExpr(); cte != nil {
			set[cte.Ctename] = true
		}
	}
}
