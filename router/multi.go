package router

import (
	"fmt"
	"sort"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Statements over several tree references (a self-join, a subquery or CTE
// over a tree, trees of one colocation group) are planned from the
// colocation analysis (colocate.go): on one shard when the key is fixed,
// pushed down to every shard and merged when every part is correlated on
// the key, refused otherwise.

const (
	colocateHint  = "Colocate the trees with colocate_with (lattice_create_tree(..., colocate_with => 'tree')) so that their rows with equal keys share a shard, or query each tree in its own statement."
	referenceHint = "Make the small table a reference table (SELECT lattice_create_reference_table('%s')), which keeps a copy on every node, or query it in its own statement."
	joinKeyHint   = "Join or correlate every pair of tree references on equal shard keys (a.%s = b.%s), or fix the shard key with %s = <value> in the WHERE of each part."
)

// multiRoute plans a statement that names trees more than once or inside
// subqueries, CTEs or set operations.
func (p *planner) multiRoute(root proto.Message, w *walker, name string, trees []*shardmap.Tree, ordinary *pg.RangeVar) route {
	base := trees[0]
	for _, t := range trees[1:] {
		if !colocated(p.trees, base, t) {
			return refusedRoute(refused(colocateHint,
				"%s uses trees %s and %s, which are not in one colocation group", name, qn(base.Name), qn(t.Name)))
		}
	}
	if ordinary != nil {
		return refusedRoute(refused(fmt.Sprintf(referenceHint, ordinary.Relname),
			"%s uses tree %s together with %s, which is neither a tree of its group nor a reference table", name, qn(base.Name), relText(ordinary)))
	}
	for _, c := range w.cols {
		for _, t := range trees {
			if isDatabaseTreeRef(c, t) {
				return refusedRoute(refused("Leave out the database name: "+qn(t.Name)+".col or public."+qn(t.Name)+".col.",
					"%s names a column of tree %s with a database qualifier (%s), which the proxy cannot route", name, qn(t.Name), c.Fields[0].GetString_().GetSval()))
			}
		}
	}
	c := p.colocation(root, w)
	if c.problem != nil {
		return refusedRoute(c.problem)
	}
	ins, isInsert := root.(*pg.InsertStmt)
	if isInsert {
		return p.insertSelect(c, ins, name)
	}
	setOp, _ := root.(*pg.SelectStmt)
	if setOp != nil && setOp.Op != pg.SetOperation_SETOP_NONE {
		c.markArms(setOp)
	}
	res := c.conclude()
	if err := c.singleWriteCTE(res, name); err != nil {
		return refusedRoute(err)
	}
	refs := c.trees()
	first := refs[0]
	for _, ref := range refs {
		if ref.level == 0 {
			first = ref // the plan names the tree of the top-level FROM
			break
		}
	}
	r := route{tree: first.tree, rv: first.rv, multi: refs, cols: publicRefs(w.cols, refs), keyByConstants: c.keyByConstants}
	if res.single {
		r.kind, r.key, r.keyAlso = Single, res.key, res.also
		return r
	}
	if res.fanOut {
		if s, ok := root.(*pg.SelectStmt); ok && s.Op == pg.SetOperation_SETOP_NONE {
			r.keyedWindows = c.windowsByKey(s)
			return p.fanOut(r, s)
		}
		if setOp != nil && setOp.Op != pg.SetOperation_SETOP_NONE {
			return p.setOpFanOut(c, r, setOp)
		}
		if write, ok := writeTarget(root); ok {
			return writeEveryShard(c, r, write, name)
		}
		k := base.KeyColumn
		return refusedRoute(refused("Add "+k+" = <value> to the WHERE clause of each part so that the statement runs on one shard.",
			"%s over several tree references that does not fix the shard key %s is not supported yet (only SELECT runs over every shard)", name, qn(k)))
	}
	if d, ok := p.derivedFanOut(root, refs, r.cols); ok {
		return d
	}
	return refusedRoute(c.refusal(name, res))
}

// refusal says which references break the rule, and how to fix it.
func (c *colocation) refusal(name string, res colocResult) *sqlstate.Error {
	k := c.refs[0].tree.KeyColumn
	hint := fmt.Sprintf(joinKeyHint, k, k, k)
	desc := func(i int) string {
		r := c.refs[i]
		if r.rv.Alias != nil {
			return qn(r.tree.Name) + " AS " + qn(r.rv.Alias.Aliasname)
		}
		return qn(r.tree.Name)
	}
	if res.nullIn {
		a, b := c.refs[res.a], c.refs[res.b]
		inner := b.name()
		if inner == a.name() {
			inner = "x" // the subquery's own name would hide the outer one
		}
		from := qn(b.tree.Name)
		if inner != b.tree.Name {
			from += " " + qn(inner)
		}
		return refused(fmt.Sprintf("Write NOT EXISTS (SELECT 1 FROM %s WHERE %s.%s = %s.%s ...) instead of NOT IN, which treats a NULL key the same on every shard, or test IN only in a WHERE or ON condition, where a NULL answer drops the row as false does.",
			from, qn(inner), qn(b.tree.KeyColumn), qn(a.name()), qn(a.tree.KeyColumn)),
			"%s: the key of tree reference %s, on the nullable side of an outer join, is tested with IN (SELECT ... FROM %s) outside a row filter: for a NULL key that answer differs shard by shard",
			name, desc(res.a), desc(res.b))
	}
	if res.a >= 0 && res.b >= 0 {
		if res.nonKey {
			hint = "Join the trees on their shard keys (a." + k + " = b." + k + "); rows with equal values of other columns may live on different shards. To join on another column, make the smaller table a reference table."
		}
		return refused(hint, "%s: tree references %s and %s are %s", name, desc(res.a), desc(res.b), res.why)
	}
	i := res.a
	if i < 0 {
		i = res.b
	}
	return refused(hint, "%s: tree reference %s inside a subquery, CTE or set operation is not correlated with an outer tree reference on equal shard keys, and the statement does not fix the shard key", name, desc(i))
}

// publicRefs are the public.tree.col references among cols that name one
// of the tree references (which then has no alias).
func publicRefs(cols []*pg.ColumnRef, refs []treeRef) []*pg.ColumnRef {
	var out []*pg.ColumnRef
	for _, c := range cols {
		for _, r := range refs {
			if r.rv.Alias == nil && isPublicTreeRef(c, r.tree) && r.rv.Relname == r.tree.Name {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// insertSelect plans INSERT INTO tree (...) SELECT ...: on one shard when
// the SELECT is, and every row it gives carries the key the shard owns (the
// key column comes from that key, or is that key's value).
func (p *planner) insertSelect(c *colocation, s *pg.InsertStmt, name string) route {
	target := c.refs[0]
	tree := target.tree
	refuse := func(format string, args ...any) route {
		return refusedRoute(refused("Select the rows with "+tree.KeyColumn+" = <value> in the SELECT's WHERE and give the key column from it, or send the rows with INSERT ... VALUES.", format, args...))
	}
	sel := s.SelectStmt.GetSelectStmt()
	if sel == nil || len(sel.ValuesLists) > 0 || sel.Op != pg.SetOperation_SETOP_NONE || len(s.Cols) == 0 {
		return refuse("INSERT ... SELECT into tree %s from a set operation, VALUES or without a column list is not supported", qn(tree.Name))
	}
	keyIdx := -1
	for i, col := range s.Cols {
		if rt := col.GetResTarget(); rt != nil && rt.Name == tree.KeyColumn && len(rt.Indirection) == 0 {
			keyIdx = i
		}
	}
	if keyIdx < 0 || keyIdx >= len(sel.TargetList) {
		return refuse("INSERT ... SELECT into tree %s does not name the shard key %s in its column list", qn(tree.Name), qn(tree.KeyColumn))
	}
	if err := upsertKeyRefusal(s, tree); err != nil {
		return refusedRoute(err)
	}
	// The target is written, not read: it needs no anchor of its own.
	c.levels[target.level].refs = c.levels[target.level].refs[1:]
	src := len(c.levels) // the SELECT's level: the first after the INSERT's
	for i, l := range c.levels {
		if l.stmt == proto.Message(sel) {
			src = i
		}
	}
	if src < len(c.levels) {
		c.source = src
	}
	res := c.conclude()
	if err := c.singleWriteCTE(res, name); err != nil {
		return refusedRoute(err)
	}
	val := sel.TargetList[keyIdx].GetResTarget().GetVal()
	k, isConst := asConstant(val)
	if !res.single && res.why == "" && isConst && len(c.refs) == 1 {
		// No tree is read: the constant key is where every row goes.
		v, msg := keyValue(tree, k)
		if msg != "" {
			return refusedRoute(refused("", "INSERT on tree %s: %s", qn(tree.Name), msg))
		}
		res.single, res.key = true, v
	}
	if !res.single && res.fanOut && src < len(c.levels) {
		return insertEveryShard(c, s, target, src, keyIdx)
	}
	if !res.single {
		if res.nonKey {
			return refusedRoute(c.refusal(name, res))
		}
		return refuse("INSERT ... SELECT into tree %s does not fix the shard key %s in the SELECT", qn(tree.Name), qn(tree.KeyColumn))
	}
	ok := false
	if isConst {
		v, msg := keyValue(tree, k)
		ok = msg == "" && v == res.key
	} else if i, key := c.resolve(val, src); i >= 0 && key && c.refs[i].level == src && !c.refs[i].nullable {
		ok = true
	}
	if !ok {
		return refuse("INSERT ... SELECT into tree %s gives the shard key %s from something other than the key the SELECT fixes", qn(tree.Name), qn(tree.KeyColumn))
	}
	return route{kind: Single, tree: tree, rv: target.rv, key: res.key, keyAlso: res.also, multi: c.trees(), cols: publicRefs(c.p.walkCols(s), c.trees())}
}

func (p *planner) walkCols(s *pg.InsertStmt) []*pg.ColumnRef { return walkStmt(s).cols }

// multiSpans returns the spans of every tree reference of a multi-reference
// route in order, with what each is.
func (p *planner) multiSpans(r route) ([]span, []refHole, *sqlstate.Error) {
	type hit struct {
		s span
		h refHole
	}
	var hits []hit
	for _, ref := range r.multi {
		want := []string{ref.rv.Relname}
		if ref.rv.Schemaname != "" {
			want = []string{ref.rv.Schemaname, ref.rv.Relname}
		}
		s, ok := p.nameSpan(int(ref.rv.Location), want)
		if !ok {
			return nil, nil, internalError(ref.tree.Name)
		}
		hits = append(hits, hit{s, refHole{tree: ref.tree, qname: quoteIdent(ref.tree.Name), rel: true, aliased: ref.rv.Alias != nil}})
	}
	for _, c := range r.cols {
		tname := c.Fields[1].GetString_().GetSval()
		var t *shardmap.Tree
		for _, ref := range r.multi {
			if ref.tree.Name == tname {
				t = ref.tree
			}
		}
		s, ok := p.nameSpan(int(c.Location), []string{"public", tname})
		if !ok || t == nil {
			return nil, nil, internalError(tname)
		}
		hits = append(hits, hit{s, refHole{tree: t, qname: quoteIdent(t.Name)}})
	}
	sort.Slice(hits, func(i, j int) bool { return hits[i].s.start < hits[j].s.start })
	spans := make([]span, len(hits))
	holes := make([]refHole, len(hits))
	for i, h := range hits {
		if i > 0 && h.s.start < hits[i-1].s.end {
			return nil, nil, internalError(r.tree.Name)
		}
		spans[i], holes[i] = h.s, h.h
	}
	return spans, holes, nil
}

// multiRenderer cuts sql[start:end] at every tree reference of r.
func (p *planner) multiRenderer(r route, start, end int) (*renderer, *sqlstate.Error) {
	spans, holes, err := p.multiSpans(r)
	if err != nil {
		return nil, err
	}
	rd, err := p.renderer(r.tree, spans, start, end)
	if err != nil {
		return nil, err
	}
	rd.multi, rd.base = holes, r.tree
	return rd, nil
}
