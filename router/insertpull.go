package router

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// An INSERT ... SELECT into a tree whose SELECT reads no tree (a
// generate_series, ordinary tables of the catalog node, reference tables)
// cannot run on the shards: which shard takes a row is known only from the
// key value the SELECT computes. The proxy runs the SELECT on the catalog
// node and loads its rows into the tree as a COPY FROM is loaded: split by
// slot, one COPY per shard (with ON CONFLICT, one INSERT ... VALUES under
// the clause), committed together (proxy/insertpull.go).
//
// So does one whose SELECT reads trees the shards cannot insert from where
// they stand (another tree not colocated with the target, a key computed
// anew: copying or re-keying between trees), when that SELECT alone runs
// on one shard or as every shard's rows put together: the proxy reads it
// as it would read it for a client (CopySpec.Source) and loads the rows.

// pullable reports whether an INSERT whose tree references are treeRefs
// reads no tree: the one reference is the INSERT's target.
func pullable(ins *pg.InsertStmt, treeRefs []relRef) bool {
	sel := ins.SelectStmt.GetSelectStmt()
	return sel != nil && len(treeRefs) == 1 && treeRefs[0].target && treeRefs[0].rv == ins.Relation
}

// pullableFromTrees returns the target of an INSERT whose SELECT reads
// trees, when every tree it reads besides the target is in the SELECT (or
// the INSERT's WITH, which moves into it) and every WITH query is a
// SELECT: the proxy reads the SELECT, then writes the rows, so a tree
// named in ON CONFLICT, or written in a WITH, cannot be served that way.
func pullableFromTrees(ins *pg.InsertStmt, treeRefs []relRef) (*relRef, bool) {
	if ins.SelectStmt.GetSelectStmt() == nil {
		return nil, false
	}
	var target *relRef
	for i, r := range treeRefs {
		switch {
		case r.rv == ins.Relation:
			target = &treeRefs[i]
		case ins.OnConflictClause != nil && r.rv.Location >= ins.OnConflictClause.Location:
			return nil, false
		}
	}
	for _, w := range []*pg.WithClause{ins.WithClause, ins.SelectStmt.GetSelectStmt().WithClause} {
		for _, c := range w.GetCtes() {
			if c.GetCommonTableExpr().GetCtequery().GetSelectStmt() == nil {
				return nil, false
			}
		}
	}
	return target, target != nil
}

// insertPullTrees plans ins as a load of the rows its SELECT gives, read
// from the trees it names, when the SELECT alone runs on one shard or as
// every shard's rows put together. A SELECT that needs the proxy to
// combine rows across shards (aggregates, DISTINCT, LIMIT, OFFSET) is
// refused with its own reason. Otherwise (the SELECT is refused on its
// own too) it returns false, and the caller's refusal stands.
func (p *planner) insertPullTrees(ins *pg.InsertStmt, tree *shardmap.Tree) (route, bool) {
	text, e := pullSelect(ins, qn(tree.Name))
	if e != nil {
		return refusedRoute(e), true
	}
	plans, _, e := planFull(text, p.trees, nil, false)
	if e != nil || len(plans) != 1 {
		return route{}, false
	}
	src := plans[0]
	switch {
	case src.Kind == Single:
	case src.Kind == FanOut && src.Agg == nil && src.Limit == nil && src.Offset == nil && src.Hidden == 0:
	case src.Kind == FanOut && colocated(p.trees, tree, src.Tree):
		// The colocated analysis said why the shards cannot do it.
		return route{}, false
	case src.Kind == FanOut:
		return refusedRoute(refused("Fix the shard key of "+qn(src.Tree.Name)+" in the SELECT's WHERE to read one shard, colocate the trees (colocate_with), or run the SELECT on its own and insert its rows.",
			"INSERT ... SELECT into tree %s from tree %s with aggregates, DISTINCT, window functions, LIMIT or OFFSET over several shards is not supported: the proxy loads only a SELECT of one shard or of every shard's rows as they are", qn(tree.Name), qn(src.Tree.Name))), true
	default:
		return route{}, false
	}
	r := p.insertPullText(ins, tree, text)
	if r.kind == Copy {
		r.cp.Source = src
	}
	return r, true
}

// insertPull plans ins as a load of the rows its SELECT gives, run on the
// catalog node, or refuses it with the reason.
func (p *planner) insertPull(ins *pg.InsertStmt, tree *shardmap.Tree) route {
	text, e := pullSelect(ins, qn(tree.Name))
	if e != nil {
		return refusedRoute(e)
	}
	return p.insertPullText(ins, tree, text)
}

// pullSelect is the text of the SELECT of ins, with the INSERT's WITH
// moved into it, as the proxy runs it apart from the INSERT.
func pullSelect(ins *pg.InsertStmt, name string) (string, *sqlstate.Error) {
	sel := proto.Clone(ins.SelectStmt).(*pg.Node)
	if w := ins.WithClause; w != nil {
		ss := sel.GetSelectStmt()
		if ss.WithClause != nil {
			return "", refused("Put every WITH query in one WITH clause, before INSERT.",
				"INSERT ... SELECT into tree %s with WITH clauses both before INSERT and in the SELECT is not supported", name)
		}
		ss.WithClause = proto.Clone(w).(*pg.WithClause)
	}
	text, err := deparseStmt(sel.GetSelectStmt())
	if err != nil {
		return "", &sqlstate.Error{Code: sqlstate.InternalError, Message: "cannot render the SELECT of an INSERT into tree " + name + ": " + err.Error()}
	}
	return text, nil
}

// insertPullText is insertPull once the SELECT's text is known.
func (p *planner) insertPullText(ins *pg.InsertStmt, tree *shardmap.Tree, text string) route {
	name := qn(tree.Name)
	if len(ins.ReturningList) > 0 {
		return refusedRoute(refused("Insert the rows with INSERT ... VALUES, which takes RETURNING, or read them back by key after the INSERT ... SELECT.",
			"INSERT ... SELECT into tree %s with RETURNING is not supported when the proxy loads the SELECT's rows itself", name))
	}
	if ins.Override != pg.OverridingKind_OVERRIDING_NOT_SET {
		return refusedRoute(refused("Leave out OVERRIDING; give the column's values in the SELECT.",
			"INSERT ... SELECT into tree %s with OVERRIDING is not supported", name))
	}
	var names []string
	for _, n := range ins.Cols {
		rt := n.GetResTarget()
		if rt == nil || len(rt.Indirection) > 0 {
			return refusedRoute(refused("Name whole columns in the column list.",
				"INSERT ... SELECT into tree %s assigns a field or an array element of a column", name))
		}
		names = append(names, rt.Name)
	}
	c := &CopySpec{From: true, Select: text, AllColumns: len(names) == 0}
	if oc := ins.OnConflictClause; oc != nil {
		conflict, e := conflictText(ins, tree)
		if e != nil {
			return refusedRoute(e)
		}
		c.Conflict = conflict
		if a := ins.Relation.Alias; a != nil {
			c.alias = " AS " + quoteIdent(a.Aliasname)
		}
	}
	if _, e := c.parseOptions(nil); e != nil {
		return refusedRoute(e)
	}
	if e := c.setColumns(tree, names, "INSERT ... SELECT"); e != nil {
		return refusedRoute(e)
	}
	return route{kind: Copy, tree: tree, rv: ins.Relation, cp: c}
}

// conflictPlaceholder stands for the rows in the INSERT deparsed to find the
// text of its ON CONFLICT clause.
const conflictPlaceholder = "VALUES ('lattice pulled rows')"

// conflictText is the ON CONFLICT clause of ins as text, to follow each
// shard's VALUES: the clause names the target by its table name or alias,
// which are the same on every shard.
func conflictText(ins *pg.InsertStmt, tree *shardmap.Tree) (string, *sqlstate.Error) {
	name := qn(tree.Name)
	if err := upsertKeyRefusal(ins, tree); err != nil {
		return "", err
	}
	values := &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
		ValuesLists: []*pg.Node{pg.MakeListNode([]*pg.Node{pg.MakeAConstStrNode("lattice pulled rows", -1)})},
		Op:          pg.SetOperation_SETOP_NONE,
	}}}
	synth := &pg.InsertStmt{Relation: ins.Relation, Cols: ins.Cols, SelectStmt: values,
		OnConflictClause: ins.OnConflictClause, Override: ins.Override}
	text, err := pg.Deparse(&pg.ParseResult{Version: parseVersion, Stmts: []*pg.RawStmt{{Stmt: &pg.Node{Node: &pg.Node_InsertStmt{InsertStmt: synth}}}}})
	i := strings.Index(text, conflictPlaceholder)
	if err != nil || i < 0 || strings.Count(text, conflictPlaceholder) != 1 {
		return "", &sqlstate.Error{Code: sqlstate.InternalError, Message: "cannot render the ON CONFLICT clause of an INSERT into tree " + name}
	}
	clause := text[i+len(conflictPlaceholder):]
	if strings.Contains(clause, "$") {
		// Each shard's rows go as a Query of their own, without the
		// client's parameters.
		return "", refused("Give the values of ON CONFLICT ... DO UPDATE as constants or from EXCLUDED.",
			"INSERT ... SELECT into tree %s with parameters in ON CONFLICT is not supported when the proxy loads the SELECT's rows itself", name)
	}
	return clause, nil
}
