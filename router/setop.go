package router

import (
	"fmt"
	"slices"
	"strconv"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// A set operation (UNION, INTERSECT, EXCEPT, with or without ALL) whose
// branches read colocated trees without fixing the key runs per node as a
// fan-out: each shard's part is the whole set operation over that shard's
// schema, the parts are concatenated, and the statement's ORDER BY, LIMIT
// and OFFSET are merged at the top as for any fan-out. That is exact when
// the set operation over all rows is the union of its per-shard parts:
//
//   - every branch is: each of its rows comes from the rows of one shard
//     (its tree references joined on their keys, its subqueries
//     correlated: colocate.go), and it neither groups, aggregates,
//     removes duplicates, windows nor limits rows across shards;
//   - UNION ALL of such parts is their concatenation, whatever the shards;
//   - UNION, INTERSECT and EXCEPT compare whole rows. Where both sides
//     output, at one position, the shard key of a tree reference of their
//     own FROM that is on no nullable side, equal rows carry an equal key,
//     so every copy of a row, in either side, was read in one shard (the
//     trees share one map; a mixed shard reads only the slots it owns).
//     Each shard then decides the row's presence and count exactly.
//
// A set operation that compares rows without such a shared key position
// runs its comparisons in a final step over each branch's gathered rows
// (setopstep.go).

// setOpArm is what one side of a set operation is known to output.
type setOpArm struct {
	keyed []int    // output positions (0-based) that are always a shard key
	names []string // the leftmost branch's output names, "" where unknown
	star  bool     // the leftmost branch's select list has *
	calls []string // functions the branches call
	// gather: an operator compares rows that may come from different
	// shards, so the set operation runs in the final step.
	gather bool
}

// setOpFanOut plans a set operation over every shard.
func (p *planner) setOpFanOut(c *colocation, r route, s *pg.SelectStmt) route {
	k := r.tree.KeyColumn
	keyHint := "Add " + k + " = <value> to the WHERE clause of each branch to read one shard"
	no := func(hint, format string, args ...any) route {
		return refusedRoute(refused(hint, "set operation on tree %s does not fix the shard key %s, and %s",
			qn(r.tree.Name), qn(k), fmt.Sprintf(format, args...)))
	}
	switch {
	case s.WithClause != nil:
		return no(keyHint+", or run the CTE as its own statement.", "WITH over a set operation over several shards is not supported")
	case len(s.LockingClause) > 0:
		return no("Lock rows by shard key: SELECT ... WHERE "+k+" = <value> FOR UPDATE.", "FOR UPDATE/SHARE over several shards is not supported")
	case s.LimitOption == pg.LimitOption_LIMIT_OPTION_WITH_TIES:
		return no(keyHint+", or use LIMIT without WITH TIES.", "FETCH FIRST ... WITH TIES over several shards is not supported")
	}
	if from := p.replicatedPreserved(s); from != "" {
		return no(keyHint+", or put the tree on the preserved side of the outer join.",
			"an outer join keeps the rows of %s, which every shard holds whole, against the tree: each shard would add its own unmatched rows", from)
	}
	arm, why, hint := c.setOpSide(s, true)
	if why != "" {
		if hint == "" {
			hint = keyHint + ", or compute it in the application."
		}
		return no(hint, "%s", why)
	}
	if arm.gather {
		return p.setOpStep(r, s, arm, no)
	}
	f := &fanPlan{calls: arm.calls}
	var msg string
	if f.limit, msg = limitValue(s.LimitCount, "LIMIT"); msg != "" {
		return no(keyHint+", or give LIMIT as an integer constant or a $n parameter.", "%s", msg)
	}
	if f.offset, msg = limitValue(s.LimitOffset, "OFFSET"); msg != "" {
		return no(keyHint+", or give OFFSET as an integer constant or a $n parameter.", "%s", msg)
	}
	// A set operation's ORDER BY names output columns only, by position
	// or by the leftmost branch's output name (PostgreSQL refuses
	// expressions there).
	const posHint = "Sort by output column position (ORDER BY 2)."
	for i, n := range s.SortClause {
		sb := n.GetSortBy()
		if sb == nil {
			return refusedRoute(fanError(r.tree.Name))
		}
		key, ok := sortDirection(sb)
		if !ok {
			return no(keyHint+", or sort with ASC or DESC.", "ORDER BY ... USING over several shards is not supported")
		}
		if cn := sb.Node.GetAConst(); cn != nil && cn.GetIval() != nil && !cn.Isnull {
			key.Column = int(cn.GetIval().Ival) - 1
		} else if name, ok := bareName(sb.Node); ok && !arm.star {
			for j, out := range arm.names {
				if out == "" {
					return no(posHint+" Or give every output column of the first branch an alias.", "the proxy cannot tell whether ORDER BY %s names an output column", qn(name))
				}
				if out == name {
					if key.Column >= 0 {
						return no(posHint, "ORDER BY %s is ambiguous", qn(name))
					}
					key.Column = j
				}
			}
		}
		if key.Column < 0 || !arm.star && key.Column >= len(arm.names) {
			return no(posHint, "ORDER BY item %d is not an output column of the set operation", i+1)
		}
		f.sort = append(f.sort, key)
	}
	if len(f.sort) > 0 {
		cols := make([]int, len(f.sort))
		for i, k := range f.sort {
			cols[i] = k.Column
		}
		f.probe = setOpProbe(r, s, cols)
	}
	r.kind, r.sel, r.fan = FanOut, s, f
	return r
}

// setOpSide checks one side of a set operation (a branch, or a nested set
// operation) and says what it outputs; why is the refusal, with its hint
// when it is not the general one.
func (c *colocation) setOpSide(s *pg.SelectStmt, root bool) (arm setOpArm, why, hint string) {
	if s.Op == pg.SetOperation_SETOP_NONE {
		return c.setOpBranch(s)
	}
	if !root && (s.WithClause != nil || len(s.SortClause) > 0 || s.LimitCount != nil || s.LimitOffset != nil || len(s.LockingClause) > 0) {
		return arm, "WITH, ORDER BY, LIMIT, OFFSET or FOR UPDATE inside a set operation over several shards is not supported", ""
	}
	l, why, hint := c.setOpSide(s.Larg, false)
	if why != "" {
		return arm, why, hint
	}
	rt, why, hint := c.setOpSide(s.Rarg, false)
	if why != "" {
		return arm, why, hint
	}
	arm = l
	arm.calls = append(slices.Clone(l.calls), rt.calls...)
	arm.keyed = nil
	for _, i := range l.keyed {
		if slices.Contains(rt.keyed, i) {
			arm.keyed = append(arm.keyed, i)
		}
	}
	arm.gather = l.gather || rt.gather || !(s.Op == pg.SetOperation_SETOP_UNION && s.All) && len(arm.keyed) == 0
	return arm, "", ""
}

// setOpBranch checks one branch: its rows must be the union of its
// per-shard parts.
func (c *colocation) setOpBranch(s *pg.SelectStmt) (arm setOpArm, why, hint string) {
	lv := slices.IndexFunc(c.levels, func(l level) bool { return l.stmt == proto.Message(s) })
	if lv < 0 || !slices.ContainsFunc(c.levels[lv].refs, func(i int) bool { return !c.refs[i].nullable }) {
		// Every shard would return the branch's rows again.
		return arm, "a branch of the set operation reads no tree in its own FROM", "Read a tree in every branch, or run the branch as its own statement."
	}
	scan := selectScan(s)
	agg, window := findAggregates(scan, true)
	if agg == "" {
		agg = c.p.outerAggregate(s, scan)
	}
	switch {
	case agg != "" || len(s.GroupClause) > 0 || s.HavingClause != nil:
		return arm, "aggregates or GROUP BY in a branch of a set operation over several shards are not supported", ""
	case len(s.DistinctClause) > 0:
		return arm, "DISTINCT in a branch of a set operation over several shards is not supported", ""
	case window || len(s.WindowClause) > 0:
		return arm, "window functions in a branch of a set operation over several shards are not supported", ""
	case s.WithClause != nil || len(s.SortClause) > 0 || s.LimitCount != nil || s.LimitOffset != nil || len(s.LockingClause) > 0 || s.IntoClause != nil:
		return arm, "WITH, ORDER BY, LIMIT, OFFSET, FOR UPDATE or INTO inside a set operation over several shards is not supported", ""
	}
	arm.calls = c.p.withOuterCalls(s, scan, findFunctionNames(scan, true))
	for i, t := range s.TargetList {
		rt := t.GetResTarget()
		if rt == nil || isStar(rt.Val) {
			// Positions from here on depend on the tables' columns.
			arm.star = true
			break
		}
		name, known := rt.Name, true
		if name == "" {
			name, known = figureName(rt.Val)
		}
		if !known {
			name = ""
		}
		arm.names = append(arm.names, name)
		if ref, key := c.resolve(rt.Val, lv); ref >= 0 && key && c.refs[ref].level == lv && !c.refs[ref].nullable && !c.refs[ref].derived {
			arm.keyed = append(arm.keyed, i)
		}
	}
	return arm, "", ""
}

func setOpName(s *pg.SelectStmt) string {
	name := map[pg.SetOperation]string{pg.SetOperation_SETOP_UNION: "UNION", pg.SetOperation_SETOP_INTERSECT: "INTERSECT", pg.SetOperation_SETOP_EXCEPT: "EXCEPT"}[s.Op]
	if s.All {
		name += " ALL"
	}
	return name
}

// setOpProbe is the collation probe of a set operation's output columns
// cols (0-based; -1 probes nothing): the set operation itself, without
// ORDER BY and LIMIT, as a derived table whose first columns are renamed
// so that each can be named.
func setOpProbe(r route, s *pg.SelectStmt, cols []int) string {
	inner := proto.Clone(s).(*pg.SelectStmt)
	inner.SortClause, inner.LimitCount, inner.LimitOffset = nil, nil, nil
	inner.LimitOption = pg.LimitOption_LIMIT_OPTION_DEFAULT
	// The probe runs without the statement's parameters. A branch's WHERE
	// cannot change the collation of what it outputs, and is where they
	// usually are.
	var unfilter func(b *pg.SelectStmt)
	unfilter = func(b *pg.SelectStmt) {
		if b.Op == pg.SetOperation_SETOP_NONE {
			b.WhereClause = nil
			return
		}
		unfilter(b.Larg)
		unfilter(b.Rarg)
	}
	unfilter(inner)
	last := 0
	for _, c := range cols {
		last = max(last, c+1)
	}
	alias := &pg.Alias{Aliasname: "lattice_q"}
	for i := range last {
		alias.Colnames = append(alias.Colnames, pg.MakeStrNode("lattice_k"+strconv.Itoa(i+1)))
	}
	probe := r
	probe.sel = &pg.SelectStmt{LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT, Op: pg.SetOperation_SETOP_NONE,
		FromClause: []*pg.Node{{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
			Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: inner}}, Alias: alias}}}}}
	exprs := make([]*pg.Node, len(cols))
	for i, c := range cols {
		if c >= 0 {
			exprs[i] = &pg.Node{Node: &pg.Node_ColumnRef{ColumnRef: &pg.ColumnRef{Fields: []*pg.Node{
				pg.MakeStrNode("lattice_q"), pg.MakeStrNode("lattice_k" + strconv.Itoa(c+1))}}}}
		}
	}
	return collationProbe(probe, exprs)
}

// markArms marks the branches of the set operation s, the statement
// itself, and the nested set operations between them: their rows are the
// statement's rows, so they need no correlation (conclude), only what
// setOpSide checks.
func (c *colocation) markArms(s *pg.SelectStmt) {
	for i := range c.levels {
		if c.levels[i].stmt == proto.Message(s) {
			c.levels[i].arm = true
		}
	}
	if s.Op != pg.SetOperation_SETOP_NONE {
		c.markArms(s.Larg)
		c.markArms(s.Rarg)
	}
}
