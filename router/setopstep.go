package router

import (
	"strconv"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// A set operation that compares rows without a shared shard key position
// (setop.go) cannot be decided per shard: equal rows may come from
// different shards. It runs in the final step of the two-step form
// (aggregate.go), as windows that are not partitioned by the key do
// (windowstep.go). Each node returns every branch's rows over its shards,
// each row tagged with its branch's number: the set operation with every
// operator made UNION ALL, which keeps PostgreSQL's type resolution of the
// branches, each tree reference read as the union of the node's shards
// (aggsource.go). Every branch is the union of its per-shard parts
// (setOpBranch), so the nodes' rows are each branch's rows exactly. The
// final step is the set operation itself, as written (operators, ALL,
// parentheses, ORDER BY, LIMIT and OFFSET), each branch reading the
// gathered rows of its number, so duplicates, NULLs, text equality under
// each column's collation (which the probe finds, nondeterministic ICU
// ones included) and the result's types and names are PostgreSQL's own.
// The proxy bounds the gathered rows by --max-merge-memory.

// setOpRows is the name the final step gives the gathered rows, read by
// every branch.
const setOpRows = "lattice_rows"

// setOpStep plans a set operation whose comparisons run in the final step.
func (p *planner) setOpStep(r route, s *pg.SelectStmt, arm setOpArm, no func(hint, format string, args ...any) route) route {
	keyHint := "Add " + r.tree.KeyColumn + " = <value> to the WHERE clause of each branch to read one shard"
	switch {
	case arm.star:
		return no(keyHint+", or list the columns instead of *.", "the proxy does not know the columns of * in a set operation compared over several shards")
	case len(r.cols) > 0:
		return no(keyHint+", or name columns without the schema (tree.column).", "schema-qualified column references in a set operation compared over several shards are not supported")
	}
	_, rvs := aggRefs(r)
	for _, rv := range rvs {
		if rv.Alias != nil && len(rv.Alias.Colnames) > 0 {
			return no(keyHint+", or leave out the column aliases of the table alias.", "column aliases on a tree in a set operation compared over several shards are not supported")
		}
	}
	for _, name := range arm.names {
		if name == "" {
			return no(keyHint+", or give every output column of the first branch an alias.", "the proxy cannot tell the name of an output column")
		}
	}
	width := len(arm.names)

	// The partial query: the branches as they are, tagged, under UNION ALL.
	partial := proto.Clone(s).(*pg.SelectStmt)
	partial.SortClause, partial.LimitCount, partial.LimitOffset = nil, nil, nil
	partial.LimitOption = pg.LimitOption_LIMIT_OPTION_DEFAULT
	// The final step: the same operators over the branches' gathered rows.
	final := &pg.SelectStmt{
		SortClause:  s.SortClause,
		LimitCount:  s.LimitCount,
		LimitOffset: s.LimitOffset,
		LimitOption: s.LimitOption,
		WithClause: &pg.WithClause{Ctes: []*pg.Node{{Node: &pg.Node_CommonTableExpr{CommonTableExpr: &pg.CommonTableExpr{
			Ctename: setOpRows, Ctematerialized: pg.CTEMaterialize_CTEMaterializeDefault,
			Ctequery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
				TargetList:  []*pg.Node{starTarget()},
				FromClause:  []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Relname: aggSource, Inh: true, Relpersistence: "p"}}}},
				LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
				Op:          pg.SetOperation_SETOP_NONE,
			}}},
		}}}}},
	}
	branch := 0
	var tag func(part, fin *pg.SelectStmt)
	tag = func(part, fin *pg.SelectStmt) {
		fin.Op, fin.All = part.Op, part.All
		if part.Op != pg.SetOperation_SETOP_NONE {
			part.All, part.Op = true, pg.SetOperation_SETOP_UNION
			fin.Larg = &pg.SelectStmt{LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}
			fin.Rarg = &pg.SelectStmt{LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT}
			tag(part.Larg, fin.Larg)
			tag(part.Rarg, fin.Rarg)
			return
		}
		branch++
		targets := []*pg.Node{resTarget("lattice_c1", intConst(branch))}
		for i, t := range part.TargetList {
			targets = append(targets, resTarget(partialColumn(i), t.GetResTarget().Val))
		}
		part.TargetList = targets
		for i := range width {
			name := ""
			if branch == 1 {
				name = arm.names[i]
			}
			fin.TargetList = append(fin.TargetList, resTarget(name, columnNode(partialColumn(i))))
		}
		fin.FromClause = []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Relname: setOpRows, Inh: true, Relpersistence: "p"}}}}
		fin.WhereClause = &pg.Node{Node: &pg.Node_AExpr{AExpr: &pg.A_Expr{Kind: pg.A_Expr_Kind_AEXPR_OP,
			Name: []*pg.Node{pg.MakeStrNode("=")}, Lexpr: columnNode("lattice_c1"), Rexpr: intConst(branch)}}}
	}
	tag(partial, final)

	placer := newRefPlacer(rvs, true)
	partial = placer.place(&pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: partial}}).GetSelectStmt()
	if !placer.once() {
		return no(keyHint+".", "a tree reference outside FROM and WHERE in a set operation compared over several shards is not supported")
	}
	wholer := newRefPlacer(rvs, true)
	whole := wholer.place(&pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: s}}).GetSelectStmt()
	refs, _ := aggRefs(r)
	ap := &AggPlan{refs: refs, Columns: width + 1, SetOp: true}
	if !wholer.once() || !wholer.sampleRefs(refs) || !ap.texts(partial, whole, final) {
		return refusedRoute(fanError(r.tree.Name))
	}
	// The tag has no collation; each output column has the one the set
	// operation gives it.
	cols := []int{-1}
	for i := range width {
		cols = append(cols, i)
	}
	if ap.CollationProbe = setOpProbe(r, s, cols); ap.CollationProbe == "" {
		return no(keyHint+", or compute it in the application.", "the proxy cannot find the collations of the set operation's columns")
	}
	r.kind, r.sel, r.fan = FanOut, s, &fanPlan{calls: arm.calls, agg: ap}
	return r
}

// partialColumn names output column i (0-based) of a set operation among
// the gathered rows, after the branch tag lattice_c1.
func partialColumn(i int) string { return "lattice_c" + strconv.Itoa(i+2) }
