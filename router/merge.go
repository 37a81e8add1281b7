package router

import (
	"fmt"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// MERGE INTO a tree runs on one shard when its ON condition fixes the
// target's key, in an AND, to one value: a constant or $n, or a column of
// a source of one row of constants (USING (VALUES ($1, $2)) s(k, v), or
// USING (SELECT $1 AS k, ...) s), the upsert that drivers and query
// builders write. Every row it can touch then has that key: a matched row
// by the condition, an inserted one because its key must be that value too
// (checked here), and an updated key must stay it. WHEN NOT MATCHED BY
// SOURCE would touch every other row of the tree, on every shard: refused.
// A source that reads a tree is refused with the other multi-tree MERGEs
// (colocate.go). The key's value is compared here, so the plan is never
// derived from a shape (keyByConstants).

// mergeRefusal is the refusal of a MERGE whose key is not fixed.
func mergeRefusal(format string, args ...any) route {
	return refusedRoute(refused("Fix the target's shard key in ON (ON t.key = <value>, or = a column of a one-row source of constants or $n), and insert and set only that key.", format, args...))
}

// merge routes MERGE INTO the tree of r.
func (p *planner) merge(r route, s *pg.MergeStmt) route {
	t := r.tree
	if r.rv != s.Relation {
		return mergeRefusal("MERGE from tree %s into another table is not supported", qn(t.Name))
	}
	src := mergeSource(s.SourceRelation)
	// resolve is the constant or $n an expression of the source stands
	// for: itself, or a source column's value.
	resolve := func(n *pg.Node, qualifiedOnly bool) (constant, bool) {
		if c, ok := asConstant(n); ok {
			return c, true
		}
		if v := src.column(n, qualifiedOnly); v != nil {
			return asConstant(v)
		}
		return constant{}, false
	}
	var key constant
	var found bool
	for _, n := range conjuncts(s.JoinCondition, nil) {
		e := n.GetAExpr()
		if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || !isPlainEq(e.Name) {
			continue
		}
		for _, x := range [][2]*pg.Node{{e.Lexpr, e.Rexpr}, {e.Rexpr, e.Lexpr}} {
			if !found && p.isKeyColumn(x[0], s.Relation, t) {
				key, found = resolve(x[1], true)
			}
		}
	}
	if !found {
		return mergeRefusal("MERGE into tree %s does not fix the shard key %s in its ON condition", qn(t.Name), qn(t.KeyColumn))
	}
	v, msg := keyValue(t, key)
	if msg != "" {
		return refusedRoute(refused("", "MERGE on tree %s: %s", qn(t.Name), msg))
	}
	same := func(n *pg.Node, qualifiedOnly bool) bool {
		c, ok := resolve(n, qualifiedOnly)
		if !ok {
			return false
		}
		w, msg := keyValue(t, c)
		return msg == "" && w == v
	}
	for _, x := range s.MergeWhenClauses {
		wc := x.GetMergeWhenClause()
		if wc == nil {
			return mergeRefusal("MERGE into tree %s has a WHEN clause the proxy cannot read", qn(t.Name))
		}
		if wc.MatchKind == pg.MergeMatchKind_MERGE_WHEN_NOT_MATCHED_BY_SOURCE {
			return mergeRefusal("MERGE into tree %s with WHEN NOT MATCHED BY SOURCE would change rows of every shard", qn(t.Name))
		}
		switch wc.CommandType {
		case pg.CmdType_CMD_UPDATE:
			for _, y := range wc.TargetList {
				if rt := y.GetResTarget(); rt != nil && rt.Name == t.KeyColumn &&
					(len(rt.Indirection) > 0 || !namesKey(rt.Val, s.Relation, t.KeyColumn) && !same(rt.Val, true)) {
					return refusedRoute(keyAssignRefusal(t))
				}
			}
		case pg.CmdType_CMD_INSERT:
			cols := make([]string, 0, len(wc.TargetList))
			for _, y := range wc.TargetList {
				cols = append(cols, y.GetResTarget().GetName())
			}
			if len(cols) == 0 {
				cols = t.Columns
			}
			k := -1
			for i, c := range cols {
				if c == t.KeyColumn {
					k = i
				}
			}
			// In WHEN NOT MATCHED only the source's columns are seen: a
			// bare name is the source's.
			if k < 0 || k >= len(wc.Values) || !same(wc.Values[k], false) {
				return mergeRefusal("MERGE into tree %s inserts a row whose shard key %s is not the value its ON condition fixes", qn(t.Name), qn(t.KeyColumn))
			}
		}
	}
	r.kind, r.key = Single, v
	r.keyByConstants = true
	return r
}

// mergeSourceRow is a MERGE source of one row of expressions, by column
// name, under its alias.
type mergeSourceRow struct {
	alias string
	cols  map[string]*pg.Node
}

// mergeSource reads a source of one row: VALUES (...) with a column list
// in its alias, or a SELECT without FROM; the zero value for any other.
func mergeSource(n *pg.Node) mergeSourceRow {
	rs := n.GetRangeSubselect()
	if rs == nil || rs.Alias == nil || rs.Lateral {
		return mergeSourceRow{}
	}
	sel := rs.Subquery.GetSelectStmt()
	if sel == nil || sel.Op != pg.SetOperation_SETOP_NONE || len(sel.FromClause) > 0 || sel.WhereClause != nil || sel.WithClause != nil ||
		len(sel.GroupClause) > 0 || sel.HavingClause != nil || sel.LimitCount != nil || sel.LimitOffset != nil || len(sel.DistinctClause) > 0 {
		return mergeSourceRow{}
	}
	row := mergeSourceRow{alias: rs.Alias.Aliasname, cols: map[string]*pg.Node{}}
	var exprs []*pg.Node
	var names []string
	switch {
	case len(sel.ValuesLists) == 1:
		exprs = sel.ValuesLists[0].GetList().GetItems()
		for i := range exprs {
			names = append(names, fmt.Sprintf("column%d", i+1))
		}
	case len(sel.ValuesLists) == 0:
		for _, x := range sel.TargetList {
			rt := x.GetResTarget()
			if rt == nil {
				return mergeSourceRow{}
			}
			exprs, names = append(exprs, rt.Val), append(names, rt.Name)
		}
	default:
		return mergeSourceRow{}
	}
	for i, c := range rs.Alias.Colnames {
		if i < len(names) {
			names[i] = c.GetString_().GetSval()
		}
	}
	for i, name := range names {
		if name == "" {
			continue // an unnamed output column is not named ?column? by us
		}
		if _, dup := row.cols[name]; dup {
			row.cols[name] = nil // ambiguous: PostgreSQL refuses it
			continue
		}
		row.cols[name] = exprs[i]
	}
	return row
}

// column is the expression of the source column n names (alias.col, or a
// bare col unless qualifiedOnly), nil when n names none.
func (s mergeSourceRow) column(n *pg.Node, qualifiedOnly bool) *pg.Node {
	f, ok := columnFields(n)
	if !ok || s.cols == nil {
		return nil
	}
	switch {
	case len(f) == 2 && f[0] == s.alias:
		return s.cols[f[1]]
	case len(f) == 1 && !qualifiedOnly:
		return s.cols[f[0]]
	}
	return nil
}
