package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/lattice-db/lattice/sqlstate"
)

// Writes over several tree references without the shard key fixed
// (UPDATE ... FROM, DELETE ... USING, correlated EXISTS and IN, INSERT ...
// SELECT) run as the keyless write of one tree does: a WriteAll, one part
// per owning shard, every tree name in that shard's schema, committed
// together. Each part joins only within its shard, which is right because
// of the colocation analysis (colocate.go): the written row's references
// are linked to it by equal keys, directly or through a chain, so every
// row it is joined or correlated with has its key (or is NULL) and lives
// in its shard. On a mixed shard the written table is written through the
// predicate on the shard's own slots (RenderFiltered) and every read
// reference reads through the predicate of its own tree's key, so no part
// sees or writes a row its shard does not own.

// writeTarget is the written relation of an UPDATE or DELETE.
func writeTarget(root proto.Message) (writeStmt, bool) {
	switch s := root.(type) {
	case *pg.UpdateStmt:
		return writeStmt{rel: s.Relation, where: s.WhereClause}, true
	case *pg.DeleteStmt:
		return writeStmt{rel: s.Relation, where: s.WhereClause}, true
	}
	return writeStmt{}, false
}

type writeStmt struct {
	rel   *pg.RangeVar
	where *pg.Node
}

// writeEveryShard plans an UPDATE or DELETE over several references whose
// parts the analysis found correlated on the key (c concluded fanOut).
func writeEveryShard(c *colocation, r route, w writeStmt, name string) route {
	if w.where.GetCurrentOfExpr() != nil {
		return refusedRoute(refused("Name the row by its shard key in WHERE instead of a cursor.",
			"%s ... WHERE CURRENT OF over several tree references is not supported", name))
	}
	for _, ref := range c.refs {
		if ref.rv == w.rel {
			r.kind, r.tree, r.rv = WriteAll, ref.tree, ref.rv
			return r
		}
	}
	return refusedRoute(internalError(r.tree.Name))
}

// insertEveryShard plans INSERT INTO tree (...) SELECT ... whose SELECT
// (level src) runs over every shard. Each shard's part inserts what its
// part of the SELECT gives, so every row must carry a key that shard
// owns: the key column must be the key of a tree the SELECT reads at its
// own level, on no nullable side (never NULL, read on its own shard
// only), and the SELECT must not pick rows across shards (LIMIT, OFFSET,
// DISTINCT ON, windows, or groups that are not within one key).
func insertEveryShard(c *colocation, s *pg.InsertStmt, target treeRef, src, keyIdx int) route {
	tree := target.tree
	sel := s.SelectStmt.GetSelectStmt()
	refuse := func(format string, args ...any) route {
		return refusedRoute(refused("Give "+tree.KeyColumn+" from the shard key of a tree the SELECT reads (SELECT u.key, ... FROM u ...), or fix it with key = <value> in the SELECT's WHERE.", format, args...))
	}
	onShard := func(n *pg.Node) bool {
		i, key := c.resolve(n, src)
		return i >= 0 && key && c.refs[i].level == src && !c.refs[i].nullable && !c.refs[i].derived
	}
	if !onShard(sel.TargetList[keyIdx].GetResTarget().GetVal()) {
		return refuse("INSERT ... SELECT into tree %s over every shard gives the shard key %s from something other than the key of a tree the SELECT reads", qn(tree.Name), qn(tree.KeyColumn))
	}
	if sel.LimitCount != nil || sel.LimitOffset != nil || len(sel.DistinctClause) > 0 && sel.DistinctClause[0].Node != nil ||
		len(sel.WindowClause) > 0 || hasWindowCall(sel) {
		return refuse("INSERT ... SELECT into tree %s over every shard with LIMIT, OFFSET, DISTINCT ON or a window function is not supported: they choose rows across shards", qn(tree.Name))
	}
	if len(sel.GroupClause) > 0 {
		grouped := false
		for _, g := range sel.GroupClause {
			grouped = grouped || onShard(g)
		}
		if !grouped {
			return refuse("INSERT ... SELECT into tree %s over every shard groups by something other than the shard key of a tree it reads", qn(tree.Name))
		}
	}
	return route{kind: WriteAll, tree: tree, rv: target.rv, multi: c.trees(), cols: publicRefs(walkStmt(s).cols, c.trees()), insert: true}
}

// multiWriteRenderer cuts a WriteAll over several references at each of
// them and, for an UPDATE or DELETE, around its WHERE condition.
func (p *planner) multiWriteRenderer(r route, start, end int) (*writeRenderer, *sqlstate.Error) {
	spans, holes, err := p.multiSpans(r)
	if err != nil {
		return nil, err
	}
	w, err := p.writeRenderer(r, spans, start, end, !r.insert)
	if err != nil {
		return nil, err
	}
	w.refs, w.target = holes, -1
	for i, s := range spans {
		if holes[i].rel && s.start == int(r.rv.Location) {
			w.target = i
		}
	}
	if w.target < 0 {
		return nil, internalError(r.tree.Name)
	}
	return w, nil
}
