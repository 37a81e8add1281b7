package router

import (
	"slices"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// A statement over several tree references runs on the shards only when
// every part of it can be answered from the rows of one shard. The analysis
// here cuts the statement into levels (each SELECT, INSERT, UPDATE or
// DELETE is one, with the tree references of its own FROM) and accepts it
// when:
//
//   - the tree references of each level are joined pairwise on equal shard
//     keys (a.k = b.k in WHERE or in any JOIN's ON, or JOIN ... USING (k)),
//     directly or through a chain: then every row the level's FROM yields
//     combines rows of one key, or rows of one key with NULLs, whatever the
//     join type, and the level is the union of its per-shard parts;
//   - each level below the top is anchored: its WHERE equates the key of
//     one of its references with the key of a reference of an enclosing
//     level (a correlation), or it is the subquery of key IN (SELECT b.key
//     ...); so each evaluation reads the rows of the outer row's key only;
//   - for a statement on one shard, a level may instead be pinned: its
//     WHERE fixes one of its keys to the statement's key value.
//
// Columns are resolved by name through the levels' scopes, as PostgreSQL
// resolves them; what the analysis cannot resolve gives no link, and an
// unanchored level refuses the statement: never a wrong answer.

// Groups is implemented by a Trees that knows colocation groups. Trees of
// one group share one slot map and placement: shard N of every member is
// schema lattice_sNNNN on one node, and equal keys hash to one slot.
type Groups interface {
	// Group is the tree's colocation group, "" when it has none.
	Group(t *shardmap.Tree) string
}

// References is implemented by a Trees that knows reference tables: small
// tables with a full copy, under their own name, in the tenant's database
// on every node.
type References interface {
	Reference(name string) bool
}

// colocated reports whether two trees live shard by shard together.
func colocated(trees Trees, a, b *shardmap.Tree) bool {
	if a.Name == b.Name {
		return true
	}
	g, ok := trees.(Groups)
	if !ok {
		return false
	}
	ga := g.Group(a)
	return ga != "" && ga == g.Group(b)
}

// isReference reports whether rv names a reference table.
func (p *planner) isReference(rv *pg.RangeVar) bool {
	if rv.Catalogname != "" || rv.Schemaname != "" && rv.Schemaname != "public" {
		return false
	}
	r, ok := p.trees.(References)
	return ok && r.Reference(rv.Relname)
}

// levelKind says whose scope a level's column references see besides its
// own FROM.
type levelKind int

const (
	levelTop     levelKind = iota // the statement itself
	levelSub                      // a sublink or LATERAL subquery: sees the enclosing level's FROM
	levelDerived                  // a CTE body, a non-LATERAL derived table, an INSERT's source: skips it
)

type treeRef struct {
	rv       *pg.RangeVar
	tree     *shardmap.Tree
	level    int
	nullable bool // on the nullable side of an outer join within its level
	// derived marks a keyed derived table (keyedDerived): not a relation
	// of its own but the rows of one in its parent's FROM, named by its
	// alias, keyed on the output column that is its tree's key.
	derived bool
}

func (r treeRef) name() string {
	if r.rv.Alias != nil {
		return r.rv.Alias.Aliasname
	}
	return r.rv.Relname
}

type level struct {
	parent int // -1 for the top
	kind   levelKind
	stmt   proto.Message
	where  *pg.Node
	quals  []*pg.Node     // JOIN ... ON conditions of its FROM
	names  map[string]int // FROM item names seen here: a tree reference's index, or noName
	refs   []int          // its own tree references
	pins   []Value        // key values its WHERE fixes
	pinned []int          // the references those pins are on
	in     []inLink
	keyed  bool // a derived table or writing CTE of per-shard rows: anchored by the joins of asRef's level (keyedDerived, writecte.go)
	arm    bool // a branch of the statement's own set operation: its rows are top-level rows (setop.go)
	asRef  int  // with keyed: its reference in the level that reads it
}

// inLink is key IN (SELECT b.key ...) found in level outer.
type inLink struct {
	link *pg.SubLink
	test *pg.Node
	sub  int
}

// colocation is the analysis of one statement.
type colocation struct {
	p      *planner
	refs   []treeRef
	levels []level
	ctes   map[*pg.RangeVar]bool
	using  []usingLink
	// cteBodies are the levels of the statement's CTE bodies by name
	// (-1 for a name defined twice), cteRefs the references to CTEs
	// (writecte.go).
	cteBodies   map[string]int
	cteRefs     []cteRef
	writeBodies []int // the levels of the keyed writing CTEs
	// unpinnedWrite names the tree of a writing CTE read by the statement
	// that is not keyed for want of its own key (writecte.go).
	unpinnedWrite string
	// joins are the statement's JOINs, for the USING and NATURAL joins of
	// a writing CTE, keyed after the walk.
	joins []joinAt
	// keyByConstants: an UPDATE's SET of the key is allowed by two
	// constants being alike (keyassign.go).
	keyByConstants bool
	// source is the level of an INSERT's SELECT (0 for none): over every
	// shard its rows stand alone, as the top level's do, since each
	// shard's part inserts what that shard's part of the SELECT gives.
	source int
	// problem is what the analysis refuses outright (nil for nothing).
	problem *sqlstate.Error
}

type usingLink struct {
	level int
	a, b  int // ref indexes
}

func (c *colocation) fail(e *sqlstate.Error) {
	if c.problem == nil {
		c.problem = e
	}
}

// noName marks a FROM item that is not a tree reference.
const noName = -1

func (p *planner) colocation(root proto.Message, w *walker) *colocation {
	c := &colocation{p: p, ctes: map[*pg.RangeVar]bool{}}
	for _, r := range w.rels {
		if r.cte {
			c.ctes[r.rv] = true
		}
	}
	c.visit(root.ProtoReflect(), -1, levelTop, false)
	c.keyWriteCTEs()
	return c
}

func (c *colocation) newLevel(parent int, kind levelKind, stmt proto.Message, where *pg.Node) int {
	c.levels = append(c.levels, level{parent: parent, kind: kind, stmt: stmt, where: where, names: map[string]int{}})
	return len(c.levels) - 1
}

func (c *colocation) addName(lv int, name string, ref int) {
	if lv < 0 || name == "" {
		return
	}
	if _, dup := c.levels[lv].names[name]; dup {
		ref = noName // PostgreSQL refuses a repeated name; never link through it
	}
	c.levels[lv].names[name] = ref
}

// visit walks m inside level lv; kind is the kind a statement met here gets.
func (c *colocation) visit(m protoreflect.Message, lv int, kind levelKind, nullable bool) {
	switch v := m.Interface().(type) {
	case *pg.SelectStmt:
		nl := c.newLevel(lv, kind, v, v.WhereClause)
		c.stmtChildren(m, nl, nullable)
		return
	case *pg.UpdateStmt:
		if t, _ := c.p.lookup(v.Relation); t != nil {
			for _, x := range v.TargetList {
				if rt := x.GetResTarget(); rt != nil && rt.Name == t.KeyColumn {
					kept, byConstants := keyKept(rt, v.Relation, t.KeyColumn, v.WhereClause)
					if !kept {
						c.fail(keyAssignRefusal(t))
					}
					c.keyByConstants = c.keyByConstants || byConstants
				}
			}
		}
		nl := c.newLevel(lv, kind, v, v.WhereClause)
		c.stmtChildren(m, nl, nullable)
		return
	case *pg.DeleteStmt:
		nl := c.newLevel(lv, kind, v, v.WhereClause)
		c.stmtChildren(m, nl, nullable)
		return
	case *pg.InsertStmt:
		nl := c.newLevel(lv, kind, v, nil)
		c.stmtChildren(m, nl, nullable)
		return
	case *pg.MergeStmt:
		c.fail(refused("MERGE into a tree from a source that reads no tree (a one-row VALUES or SELECT, a reference table), with the key fixed in ON; or use INSERT ... ON CONFLICT, UPDATE or DELETE.",
			"MERGE whose source reads a tree is not supported"))
		return
	case *pg.RangeVar:
		c.rangeVar(v, lv, nullable)
		return
	case *pg.RangeSubselect:
		k := levelDerived
		if v.Lateral {
			k = levelSub
		}
		sub := len(c.levels)
		c.node(v.Subquery, lv, k, nullable)
		if v.Alias != nil {
			c.addName(lv, v.Alias.Aliasname, c.keyedDerived(v, lv, sub, nullable))
		}
		return
	case *pg.RangeFunction:
		if v.Alias != nil {
			c.addName(lv, v.Alias.Aliasname, noName)
		} else {
			// Without an alias a function in FROM is named after itself.
			for _, f := range v.Functions {
				if items := f.GetList().GetItems(); len(items) > 0 {
					if fc := items[0].GetFuncCall(); fc != nil && len(fc.Funcname) > 0 {
						c.addName(lv, fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval(), noName)
					}
				}
			}
		}
		// A function in FROM is named after itself; its arguments may
		// hold subqueries, which see the enclosing FROM only if LATERAL.
		c.children(m, lv, levelSub, nullable)
		return
	case *pg.JoinExpr:
		c.join(v, lv, nullable)
		return
	case *pg.CommonTableExpr:
		c.defineCTE(v.Ctename, len(c.levels), len(v.Aliascolnames) > 0)
		c.node(v.Ctequery, lv, levelDerived, false)
		return
	case *pg.SubLink:
		c.node(v.Testexpr, lv, levelSub, nullable)
		sub := len(c.levels)
		c.node(v.Subselect, lv, levelSub, false)
		if v.SubLinkType == pg.SubLinkType_ANY_SUBLINK && (len(v.OperName) == 0 || isPlainEq(v.OperName)) && lv >= 0 {
			c.levels[lv].in = append(c.levels[lv].in, inLink{link: v, test: v.Testexpr, sub: sub})
		}
		return
	}
	c.children(m, lv, kind, nullable)
}

func (c *colocation) node(n *pg.Node, lv int, kind levelKind, nullable bool) {
	if n != nil {
		c.visit(n.ProtoReflect(), lv, kind, nullable)
	}
}

func (c *colocation) children(m protoreflect.Message, lv int, kind levelKind, nullable bool) {
	rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				c.visit(l.Get(i).Message(), lv, kind, nullable)
			}
			return true
		}
		c.visit(v.Message(), lv, kind, nullable)
		return true
	})
}

// stmtChildren walks a statement's parts inside its own level: the WITH
// list's bodies and an INSERT's source are derived levels, subqueries
// elsewhere see this level.
func (c *colocation) stmtChildren(m protoreflect.Message, lv int, nullable bool) {
	rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			return true
		}
		kind := levelSub
		switch fd.Name() {
		case "with_clause", "select_stmt":
			kind = levelDerived
		case "locking_clause":
			return true // FOR UPDATE OF names FROM items, not relations
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				c.visit(l.Get(i).Message(), lv, kind, false)
			}
			return true
		}
		c.visit(v.Message(), lv, kind, false)
		return true
	})
}

func (c *colocation) rangeVar(v *pg.RangeVar, lv int, nullable bool) {
	name := v.Relname
	if v.Alias != nil {
		name = v.Alias.Aliasname
	}
	if c.ctes[v] || lv < 0 {
		if c.ctes[v] && lv >= 0 {
			c.cteRefs = append(c.cteRefs, cteRef{rv: v, level: lv, nullable: nullable})
		}
		c.addName(lv, name, noName)
		return
	}
	t, _ := c.p.lookup(v)
	if t == nil {
		c.addName(lv, name, noName)
		return
	}
	c.refs = append(c.refs, treeRef{rv: v, tree: t, level: lv, nullable: nullable})
	i := len(c.refs) - 1
	c.levels[lv].refs = append(c.levels[lv].refs, i)
	c.addName(lv, name, i)
}

// keyedDerived makes a derived table in level lv's FROM a reference of lv
// when its rows are the union of per-shard parts, each row of one key, not
// on a nullable side: a plain SELECT without LIMIT, OFFSET, DISTINCT ON or
// window functions that is either grouped by (at least) the key of one of
// its own tree references (TPC-C's consistency checks join such tables,
// grouped by the warehouse, to the warehouse's rows), or that neither
// groups nor aggregates, so that each row is a row of its FROM (a CTE over
// a tree, inlined, takes this form). It is keyed on the output column that
// is that reference's key, named by the alias's column list where it has
// one; joined on that column it is anchored as a tree reference would be.
// A grouped table must output its key; one that does not group may leave
// it out, and then stands alone. It returns the new reference's index, or
// noName.
func (c *colocation) keyedDerived(v *pg.RangeSubselect, lv, sub int, nullable bool) int {
	if v.Lateral || lv < 0 || sub >= len(c.levels) {
		return noName
	}
	s, ok := c.levels[sub].stmt.(*pg.SelectStmt)
	if !ok || s != v.Subquery.GetSelectStmt() || s.Op != pg.SetOperation_SETOP_NONE || len(s.ValuesLists) > 0 || s.LimitCount != nil || s.LimitOffset != nil ||
		len(s.WindowClause) > 0 || len(s.DistinctClause) > 0 && s.DistinctClause[0].Node != nil || hasWindowCall(s) {
		return noName
	}
	own := -1 // the reference whose key each row is of
	grouped := c.p.aggregating(s, append(append([]*pg.Node{s.HavingClause}, s.TargetList...), s.SortClause...), true)
	if grouped {
		for _, g := range s.GroupClause {
			if i, key := c.resolve(g, sub); i >= 0 && key && c.refs[i].level == sub && !c.refs[i].nullable && !c.refs[i].derived {
				own = i
				break
			}
		}
	} else {
		for _, i := range c.levels[sub].refs {
			if !c.refs[i].nullable {
				own = i
				break
			}
		}
	}
	if own < 0 {
		return noName
	}
	key := ""
	for k, t := range s.TargetList {
		rt := t.GetResTarget()
		if rt == nil {
			continue
		}
		if i, isKey := c.resolve(rt.Val, sub); i != own || !isKey {
			continue
		}
		key = rt.Name
		if key == "" {
			f := rt.Val.GetColumnRef().Fields
			key = f[len(f)-1].GetString_().GetSval()
		}
		if k < len(v.Alias.Colnames) {
			key = v.Alias.Colnames[k].GetString_().GetSval()
		}
		break
	}
	if key == "" && grouped {
		return noName
	}
	tree := *c.refs[own].tree
	tree.KeyColumn = key
	c.refs = append(c.refs, treeRef{rv: &pg.RangeVar{Relname: v.Alias.Aliasname, Alias: v.Alias}, tree: &tree, level: lv, nullable: nullable, derived: true})
	c.levels[lv].refs = append(c.levels[lv].refs, len(c.refs)-1)
	c.levels[sub].keyed, c.levels[sub].asRef = true, len(c.refs)-1
	return len(c.refs) - 1
}

// hasWindowCall reports whether a SELECT's own target list or HAVING calls
// a window function (f(...) OVER ...).
func hasWindowCall(s *pg.SelectStmt) bool {
	return windowCallIn(s.TargetList...) || windowCallIn(s.HavingClause)
}

// windowCallIn reports whether nodes call a window function outside their
// subqueries, whose windows are their own level's.
func windowCallIn(nodes ...*pg.Node) bool {
	found := false
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		if fc, ok := m.Interface().(*pg.FuncCall); ok && fc.Over != nil {
			found = true
		}
		if _, ok := m.Interface().(*pg.SubLink); found || ok {
			return
		}
		rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
				return true
			}
			if fd.IsList() {
				for i := 0; i < v.List().Len(); i++ {
					walk(v.List().Get(i).Message())
				}
				return true
			}
			walk(v.Message())
			return true
		})
	}
	for _, n := range nodes {
		if n != nil {
			walk(n.ProtoReflect())
		}
	}
	return found
}

// trees are the statement's tree references without the keyed derived
// tables: what is rendered in shard schemas.
func (c *colocation) trees() []treeRef {
	out := make([]treeRef, 0, len(c.refs))
	for _, r := range c.refs {
		if !r.derived {
			out = append(out, r)
		}
	}
	return out
}

// join walks a JOIN: its sides (a side is nullable under an outer join),
// its ON condition and its USING columns.
func (c *colocation) join(j *pg.JoinExpr, lv int, nullable bool) {
	ln, rn := nullable, nullable
	switch j.Jointype {
	case pg.JoinType_JOIN_LEFT:
		rn = true
	case pg.JoinType_JOIN_RIGHT:
		ln = true
	case pg.JoinType_JOIN_FULL:
		ln, rn = true, true
	}
	before := len(c.refs)
	c.node(j.Larg, lv, levelDerived, ln)
	mid := len(c.refs)
	c.node(j.Rarg, lv, levelDerived, rn)
	if j.Alias != nil {
		c.addName(lv, j.Alias.Aliasname, noName)
		if len(c.refs) > before {
			// An aliased join hides its items' names from the rest of the
			// statement, which the scopes here do not model.
			c.fail(refused("Leave out the alias of the join, or name the trees' columns through their own aliases.",
				"a tree inside an aliased JOIN (... JOIN ...) AS %s in a statement over several tree references is not supported", qn(j.Alias.Aliasname)))
		}
	}
	if j.Quals != nil {
		c.levels[lv].quals = append(c.levels[lv].quals, j.Quals)
		c.node(j.Quals, lv, levelSub, nullable)
	}
	// USING (k) joins the two sides' k: each side's k is its one tree
	// reference with key k when the side is that reference itself.
	c.joins = append(c.joins, joinAt{j: j, level: lv})
	for _, u := range j.UsingClause {
		c.linkUsing(j, lv, before, mid, u.GetString_().GetSval())
	}
	// NATURAL joins every column name the two sides share: when a tree
	// reference's key on the left has the name of one on the right, the
	// two keys are among them.
	if j.IsNatural {
		for i := before; i < mid; i++ {
			if c.linkUsing(j, lv, before, mid, c.refs[i].tree.KeyColumn) {
				break
			}
		}
	}
}

// linkUsing records that j joins its two sides' column col, when each
// side's col is a tree reference's key; it reports whether it did.
func (c *colocation) linkUsing(j *pg.JoinExpr, lv, before, mid int, col string) bool {
	a, b := c.usingSide(j.Larg, before, mid, col), c.usingSide(j.Rarg, mid, len(c.refs), col)
	if a < 0 || b < 0 {
		return false
	}
	c.using = append(c.using, usingLink{level: lv, a: a, b: b})
	return true
}

// usingSide is the tree reference whose key is a JOIN side's column col:
// the side is a tree reference (sampled or not) or a keyed derived table keyed on col, or
// an inner or left join by USING (col) or NATURAL whose left side is one.
func (c *colocation) usingSide(n *pg.Node, from, to int, col string) int {
	if ts := n.GetRangeTableSample(); ts != nil {
		n = ts.Relation // a sampled tree reference is still the reference
	}
	if rv := n.GetRangeVar(); rv != nil {
		for i := from; i < to; i++ {
			if c.refs[i].rv == rv && c.refs[i].tree.KeyColumn == col {
				return i
			}
		}
		return -1
	}
	if d := n.GetRangeSubselect(); d != nil && d.Alias != nil {
		for i := from; i < to; i++ {
			if c.refs[i].derived && c.refs[i].rv.Alias == d.Alias && c.refs[i].tree.KeyColumn == col {
				return i
			}
		}
		return -1
	}
	if j := n.GetJoinExpr(); j != nil && j.Alias == nil && (j.Jointype == pg.JoinType_JOIN_INNER || j.Jointype == pg.JoinType_JOIN_LEFT) {
		// Under NATURAL, col is the left side's whether or not the right
		// has one too.
		if j.IsNatural {
			return c.usingSide(j.Larg, from, to, col)
		}
		for _, u := range j.UsingClause {
			if u.GetString_().GetSval() == col {
				return c.usingSide(j.Larg, from, to, col)
			}
		}
	}
	return -1
}

// resolve finds the tree reference a column reference names as seen from
// level lv, and reports whether it names that reference's shard key.
func (c *colocation) resolve(n *pg.Node, lv int) (int, bool) {
	f, ok := columnFields(n)
	if !ok {
		return -1, false
	}
	var name, column string
	switch len(f) {
	case 1:
		// An unqualified column is the level's own when the level has one
		// tree reference: its key column is there (or PostgreSQL reports
		// it ambiguous). With several, a name that is the key column of
		// exactly one of them is that one's key, for the same reason
		// (TPC-C's tables name their keys o_w_id, no_w_id, ...).
		if lv < 0 || len(c.levels[lv].refs) == 0 {
			return -1, false
		}
		refs := c.levels[lv].refs
		if len(refs) == 1 {
			return refs[0], f[0] == c.refs[refs[0]].tree.KeyColumn
		}
		found := -1
		for _, i := range refs {
			if c.refs[i].tree.KeyColumn == f[0] {
				if found >= 0 {
					return -1, false
				}
				found = i
			}
		}
		return found, found >= 0
	case 2:
		name, column = f[0], f[1]
	case 3:
		if f[0] != "public" {
			return -1, false
		}
		name, column = f[1], f[2]
	default:
		return -1, false
	}
	for l := lv; l >= 0; {
		if i, ok := c.levels[l].names[name]; ok {
			if i == noName || len(f) == 3 && c.refs[i].rv.Alias != nil {
				return -1, false
			}
			return i, column == c.refs[i].tree.KeyColumn
		}
		if c.levels[l].kind == levelDerived {
			l = c.levels[l].parent
			if l < 0 {
				break
			}
		}
		l = c.levels[l].parent
	}
	return -1, false
}

// conjuncts splits an AND tree.
func conjuncts(n *pg.Node, out []*pg.Node) []*pg.Node {
	if n == nil {
		return out
	}
	if b := n.GetBoolExpr(); b != nil && b.Boolop == pg.BoolExprType_AND_EXPR {
		for _, a := range b.Args {
			out = conjuncts(a, out)
		}
		return out
	}
	return append(out, n)
}

// inExact reports whether key IN (SELECT b.key ...), in, answers on a
// shard what it answers over every shard, for the outer rows of the shard;
// x is the reference whose key is tested. A shard's part of the subquery
// holds every row of the outer row's key, and no NULL (a tree's key is in
// its primary key, and inTarget takes no reference on a nullable side), so
// for a key that is not NULL the answers agree: x's key is one unless x is
// on a nullable side (a keyed derived table's key is that of a reference on
// no nullable side inside it). A NULL key, which a
// reference on the nullable side of an outer join gives, is NULL IN (the
// subquery's rows): false on a shard where the subquery is empty, NULL
// where it is not, so shards disagree with the whole unless the test is
// one of the level's row filters (filters), where false and NULL alike
// drop the row. key NOT IN (...) over such a reference is refused: its
// NULL rows would pass on the shards whose part of the subquery is empty.
func (c *colocation) inExact(l level, in inLink, x int) bool {
	return !c.refs[x].nullable || filters(l, in.link)
}

// filters reports whether link is one of the level's row filters: reached
// from its WHERE or a JOIN's ON through AND and OR alone. A filter keeps
// only true rows, under AND and OR too, so false and NULL are alike there;
// under NOT, in a target list or in a CASE they are not.
func filters(l level, link *pg.SubLink) bool {
	var found bool
	var walk func(n *pg.Node)
	walk = func(n *pg.Node) {
		if n == nil || found {
			return
		}
		if b := n.GetBoolExpr(); b != nil && b.Boolop != pg.BoolExprType_NOT_EXPR {
			for _, a := range b.Args {
				walk(a)
			}
			return
		}
		found = n.GetSubLink() == link
	}
	walk(l.where)
	for _, q := range l.quals {
		walk(q)
	}
	return found
}

// keyEquality reads a = b where both sides name shard keys of tree
// references seen from level lv.
func (c *colocation) keyEquality(n *pg.Node, lv int) (int, int, bool) {
	e := n.GetAExpr()
	if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || !isPlainEq(e.Name) {
		return 0, 0, false
	}
	a, ka := c.resolve(e.Lexpr, lv)
	b, kb := c.resolve(e.Rexpr, lv)
	if a < 0 || b < 0 || !ka || !kb {
		return 0, 0, false
	}
	return a, b, true
}

// nonKeyJoin reports a = b between columns of two tree references where
// at least one is not a shard key: the join the refusal names.
func (c *colocation) nonKeyJoin(n *pg.Node, lv int) (int, int, bool) {
	e := n.GetAExpr()
	if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || !isPlainEq(e.Name) {
		return 0, 0, false
	}
	a, ka := c.resolve(e.Lexpr, lv)
	b, kb := c.resolve(e.Rexpr, lv)
	if a < 0 || b < 0 || a == b || ka && kb {
		return 0, 0, false
	}
	return a, b, true
}

// pin reads key = constant (or key IN (constant)) for a tree reference of
// level lv itself.
func (c *colocation) pin(n *pg.Node, lv int) (Value, int, bool) {
	e := n.GetAExpr()
	if e == nil || !isPlainEq(e.Name) {
		return Value{}, -1, false
	}
	var col, operand *pg.Node
	switch e.Kind {
	case pg.A_Expr_Kind_AEXPR_OP:
		col, operand = e.Lexpr, e.Rexpr
		if _, ok := asConstant(operand); !ok {
			col, operand = e.Rexpr, e.Lexpr
		}
	case pg.A_Expr_Kind_AEXPR_IN:
		if l := e.Rexpr.GetList(); l != nil && len(l.Items) == 1 {
			col, operand = e.Lexpr, l.Items[0]
		}
	}
	if col == nil {
		return Value{}, -1, false
	}
	i, key := c.resolve(col, lv)
	if i < 0 || !key || c.refs[i].level != lv {
		return Value{}, -1, false
	}
	k, ok := asConstant(operand)
	if !ok {
		return Value{}, -1, false
	}
	v, msg := keyValue(c.refs[i].tree, k)
	if msg != "" {
		return Value{}, -1, false
	}
	return v, i, true
}

// unionFind joins reference indexes.
type unionFind []int

func newUnionFind(n int) unionFind {
	u := make(unionFind, n)
	for i := range u {
		u[i] = i
	}
	return u
}

func (u unionFind) find(i int) int {
	for u[i] != i {
		u[i] = u[u[i]]
		i = u[i]
	}
	return i
}

func (u unionFind) join(a, b int) { u[u.find(a)] = u.find(b) }

// colocResult is what the analysis concludes.
type colocResult struct {
	// single: the statement runs whole on the shard of key. also are the
	// other values levels are pinned to (distinct $n, or other literals):
	// the statement runs there only if they share key's slot (Resolve).
	single bool
	key    Value
	also   []Value
	// fanOut: the top level's rows are the union of the shards' parts.
	fanOut bool
	// why is the first reason neither holds, for the refusal.
	why string
	// a and b are the references the refusal names (b may be -1).
	a, b int
	// nonKey marks a join of trees on columns that are not their keys.
	nonKey bool
	// nullIn marks a key IN (SELECT ...) of reference a that would have
	// anchored subquery reference b but for inExact.
	nullIn bool
}

// conclude decides, from the levels' links, whether the statement runs on
// one shard (every level anchored, the pinned ones on one key value) or
// over every shard (every level but the top correlated).
func (c *colocation) conclude() colocResult {
	u := newUnionFind(len(c.refs))
	for _, l := range c.using {
		u.join(l.a, l.b)
	}
	corr := make([]bool, len(c.levels)) // level correlated to an enclosing reference (which one: corrTo)
	corrTo := make([][]int, len(c.levels))
	inexact := map[int]int{} // a subquery's level -> the reference whose key IN it is not exact
	res := colocResult{a: -1, b: -1}
	// Equalities of other columns are fine beside a key link; they name
	// the problem when the references end up unlinked.
	var nonKey [][2]int
	note := func(why string, a, b int, nk bool) {
		if nk {
			nonKey = append(nonKey, [2]int{a, b})
			return
		}
		if res.why == "" {
			res.why, res.a, res.b = why, a, b
			for _, p := range nonKey {
				if p[0] == a || p[1] == a || p[0] == b || p[1] == b {
					res.why, res.a, res.b, res.nonKey = "joined on columns that are not their shard keys", p[0], p[1], true
					break
				}
			}
		}
	}
	for lv := range c.levels {
		l := &c.levels[lv]
		for _, q := range l.quals {
			for _, n := range conjuncts(q, nil) {
				if a, b, ok := c.keyEquality(n, lv); ok && c.refs[a].level == lv && c.refs[b].level == lv {
					u.join(a, b)
				} else if a, b, ok := c.nonKeyJoin(n, lv); ok {
					note("joined on columns that are not their shard keys", a, b, true)
				}
			}
		}
		for _, n := range conjuncts(l.where, nil) {
			if a, b, ok := c.keyEquality(n, lv); ok {
				switch {
				case c.refs[a].level == lv && c.refs[b].level == lv:
					u.join(a, b)
				case c.refs[a].level == lv && c.refs[b].level < lv:
					corr[lv], corrTo[lv] = true, append(corrTo[lv], b)
				case c.refs[b].level == lv && c.refs[a].level < lv:
					corr[lv], corrTo[lv] = true, append(corrTo[lv], a)
				}
				continue
			}
			if a, b, ok := c.nonKeyJoin(n, lv); ok {
				note("joined on columns that are not their shard keys", a, b, true)
				continue
			}
			if v, i, ok := c.pin(n, lv); ok {
				l.pins, l.pinned = append(l.pins, v), append(l.pinned, i)
			}
		}
		for _, in := range l.in {
			// (a, b) IN (SELECT x, y ...) compares by position: a row
			// whose key differs from the outer row's compares false
			// whatever the other columns hold, so a key at one position
			// anchors the subquery as key IN (SELECT key ...) does.
			tests := []*pg.Node{in.test}
			if r := in.test.GetRowExpr(); r != nil {
				tests = r.Args
			}
			for i, test := range tests {
				x, key := c.resolve(test, lv)
				if x < 0 || !key {
					continue
				}
				if !c.inExact(*l, in, x) {
					inexact[in.sub] = x
					break
				}
				if y, ok := c.inTarget(in.sub, i, len(tests)); ok {
					corr[in.sub], corrTo[in.sub] = true, append(corrTo[in.sub], x)
					break
				} else if y >= 0 {
					note("compared by IN on a column that is not the subquery tree's shard key", x, y, true)
				}
			}
		}
	}
	// A keyed derived table pinned to a value has only rows of that key:
	// its reference pins its parent level as key = value in the parent's
	// WHERE would, unless it is on a nullable side there (then the
	// parent's other rows are not restricted). Deepest levels first, so
	// pins travel up a chain of them.
	for lv := len(c.levels) - 1; lv > 0; lv-- {
		if l := c.levels[lv]; l.keyed && !c.refs[l.asRef].nullable {
			at := c.refs[l.asRef].level
			c.levels[at].pins = append(c.levels[at].pins, l.pins...)
			if len(l.pins) > 0 {
				c.levels[at].pinned = append(c.levels[at].pinned, l.asRef)
			}
		}
	}
	// Each level's own references must form one joined component, or,
	// for a statement on one shard, components each pinned to a key
	// (TPC-C's Stock-Level fixes ol_w_id and s_w_id apart): each then
	// reads rows of its pinned key only, all in one slot (Resolve).
	pinnedComp := func(lv, i int) bool {
		for _, p := range c.levels[lv].pinned {
			if u.find(p) == u.find(i) {
				return true
			}
		}
		return false
	}
	apart := [2]int{-1, -1} // two components joined only by their pins
	for lv := range c.levels {
		refs := c.levels[lv].refs
		for _, i := range refs[min(1, len(refs)):] {
			if u.find(i) != u.find(refs[0]) {
				if pinnedComp(lv, refs[0]) && pinnedComp(lv, i) {
					if apart[0] < 0 {
						apart = [2]int{refs[0], i}
					}
					continue
				}
				note("not joined on equal shard keys", refs[0], i, false)
			}
		}
	}
	if res.why != "" {
		return res
	}

	// One shard: every level with references pinned to one value, or
	// correlated to an anchored reference.
	anchored := make([]bool, len(c.levels))
	single, havePin := true, false
	var key Value
	var also []Value
	skipped := false // a pin on another literal than key's
	for lv := range c.levels {
		l := c.levels[lv]
		if len(l.refs) == 0 {
			anchored[lv] = true
			continue
		}
		for _, x := range corrTo[lv] {
			if anchored[c.refs[x].level] {
				anchored[lv] = true
			}
		}
		if l.keyed && anchored[c.refs[l.asRef].level] {
			anchored[lv] = true
		}
		for _, v := range l.pins {
			if !havePin {
				key, havePin = v, true
			}
			switch {
			case v == key:
			case v.Param == 0 && key.Param == 0:
				// Two literals: two keys, most likely of two shards.
				skipped = true
				continue
			case !slices.Contains(also, v):
				// A parameter (kits pass the key once per level, as $1
				// and $2) anchors the level too, on condition that its
				// value falls in key's slot, which only the Bind tells.
				also = append(also, v)
			}
			anchored[lv] = true
		}
		if !anchored[lv] {
			single = false
		}
	}
	// Components pinned apart each need their pin on this shard: none may
	// be a literal of another key.
	if single && havePin && !(apart[0] >= 0 && skipped) {
		return colocResult{single: true, key: key, also: also}
	}
	if apart[0] >= 0 {
		note("not joined on equal shard keys", apart[0], apart[1], false)
		return res
	}
	// Every shard: the top level's references are joined; each level
	// below is correlated.
	for lv := 1; lv < len(c.levels); lv++ {
		if len(c.levels[lv].refs) > 0 && !corr[lv] && !c.levels[lv].keyed && !c.levels[lv].arm && lv != c.source {
			r := c.levels[lv].refs[0]
			if x, ok := inexact[lv]; ok {
				return colocResult{a: x, b: r, nullIn: true}
			}
			other := -1
			if len(c.refs) > 0 && c.refs[0].level != lv {
				other = 0
			}
			res = colocResult{a: -1, b: -1}
			note("not correlated on equal shard keys", other, r, false)
			return res
		}
	}
	return colocResult{fanOut: true}
}

// inTarget is, for the subquery of key IN (SELECT ...), or of a row of
// width columns IN it with the key at pos, the tree reference whose key is
// its output column at pos, when the subquery's rows are its
// FROM's rows as they are: no grouping, limit or window may pick rows
// across shards. It returns false and the reference of a non-key column
// (or -1) otherwise.
func (c *colocation) inTarget(sub, pos, width int) (int, bool) {
	if sub >= len(c.levels) {
		return -1, false
	}
	s, ok := c.levels[sub].stmt.(*pg.SelectStmt)
	if !ok || s.Op != pg.SetOperation_SETOP_NONE || len(s.TargetList) != width || len(s.GroupClause) > 0 || s.HavingClause != nil ||
		s.LimitCount != nil || s.LimitOffset != nil || len(s.WindowClause) > 0 || len(s.DistinctClause) > 0 && s.DistinctClause[0].Node != nil {
		return -1, false
	}
	rt := s.TargetList[pos].GetResTarget()
	if rt == nil {
		return -1, false
	}
	y, key := c.resolve(rt.Val, sub)
	if y < 0 || c.refs[y].level != sub {
		return -1, false
	}
	if !key || c.refs[y].nullable {
		return y, false
	}
	return y, true
}
