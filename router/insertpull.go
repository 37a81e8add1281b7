package router

import (
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
// slot, one COPY per shard, committed together (proxy/insertpull.go).

// pullable reports whether an INSERT whose tree references are treeRefs
// reads no tree: the one reference is the INSERT's target.
func pullable(ins *pg.InsertStmt, treeRefs []relRef) bool {
	sel := ins.SelectStmt.GetSelectStmt()
	return sel != nil && len(treeRefs) == 1 && treeRefs[0].target && treeRefs[0].rv == ins.Relation
}

// insertPull plans ins, which reads no tree, as a load of the rows its
// SELECT gives, or refuses it with the reason.
func (p *planner) insertPull(ins *pg.InsertStmt, tree *shardmap.Tree) route {
	name := qn(tree.Name)
	if len(ins.ReturningList) > 0 || ins.OnConflictClause != nil {
		return refusedRoute(refused("Insert the rows with INSERT ... VALUES, which takes ON CONFLICT and RETURNING, or read them back by key after the INSERT ... SELECT.",
			"INSERT ... SELECT into tree %s with ON CONFLICT or RETURNING is not supported when the SELECT reads no tree: the proxy loads its rows as a COPY", name))
	}
	if ins.Override != pg.OverridingKind_OVERRIDING_NOT_SET {
		return refusedRoute(refused("Leave out OVERRIDING; give the column's values in the SELECT.",
			"INSERT ... SELECT into tree %s with OVERRIDING is not supported", name))
	}
	sel := proto.Clone(ins.SelectStmt).(*pg.Node)
	if w := ins.WithClause; w != nil {
		ss := sel.GetSelectStmt()
		if ss.WithClause != nil {
			return refusedRoute(refused("Put every WITH query in one WITH clause, before INSERT.",
				"INSERT ... SELECT into tree %s with WITH clauses both before INSERT and in the SELECT is not supported", name))
		}
		ss.WithClause = proto.Clone(w).(*pg.WithClause)
	}
	text, err := deparseStmt(sel.GetSelectStmt())
	if err != nil {
		return refusedRoute(&sqlstate.Error{Code: sqlstate.InternalError, Message: "cannot render the SELECT of an INSERT into tree " + name + ": " + err.Error()})
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
	if _, e := c.parseOptions(nil); e != nil {
		return refusedRoute(e)
	}
	if e := c.setColumns(tree, names, "INSERT ... SELECT"); e != nil {
		return refusedRoute(e)
	}
	return route{kind: Copy, tree: tree, rv: ins.Relation, cp: c}
}
