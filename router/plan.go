package router

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// planner plans the statements of one SQL string.
type planner struct {
	sql     string
	trees   Trees
	toks    []token
	scanned bool
}

// planFull parses sql once and plans each statement. toks, when not nil,
// is the scan of sql. With wantTemplate it also returns the shape template
// of a single-statement string whose plan can be derived from its tokens
// (nil when there is none).
func planFull(sql string, trees Trees, toks []token, wantTemplate bool) ([]*Plan, *shapeTemplate, *sqlstate.Error) {
	res, err := pg.Parse(sql)
	if err != nil {
		return nil, nil, syntaxError(err)
	}
	p := &planner{sql: sql, trees: trees}
	if toks != nil {
		p.toks, p.scanned = toks, true
	}
	plans := make([]*Plan, 0, len(res.Stmts))
	for _, raw := range res.Stmts {
		start := int(raw.StmtLocation)
		end := len(sql)
		if raw.StmtLen > 0 {
			end = start + int(raw.StmtLen)
		}
		start, end = p.trim(start, end)
		plans = append(plans, p.plan(raw.Stmt, start, end))
	}
	var tmpl *shapeTemplate
	if wantTemplate && len(plans) == 1 {
		tmpl = p.template(res.Stmts[0].Stmt, plans[0])
	}
	for _, pl := range plans {
		pl.src = nil
	}
	return plans, tmpl, nil
}

// tokens scans the whole string once, on first need.
func (p *planner) tokens() []token {
	if !p.scanned {
		p.scanned = true
		p.toks, _, _ = scan(p.sql)
	}
	return p.toks
}

// tokenAt returns the index of the token that starts at byte offset loc, or -1.
func (p *planner) tokenAt(loc int) int {
	toks := p.tokens()
	i := sort.Search(len(toks), func(i int) bool { return int(toks[i].start) >= loc })
	if i < len(toks) && int(toks[i].start) == loc {
		return i
	}
	return -1
}

func isComment(t token) bool {
	return t.kind == pg.Token_SQL_COMMENT || t.kind == pg.Token_C_COMMENT
}

// trim drops the white space around a statement, and a trailing -- comment
// (which would swallow anything the proxy appends after the statement).
func (p *planner) trim(start, end int) (int, int) {
	for start < end && isSpace(p.sql[start]) {
		start++
	}
	for end > start && isSpace(p.sql[end-1]) {
		end--
	}
	if strings.Contains(p.sql[start:end], "--") {
		last := -1
		for _, t := range p.tokens() {
			if int(t.start) >= start && int(t.end) <= end && !isComment(t) {
				last = int(t.end)
			}
		}
		if last > start {
			end = last
		}
	}
	return start, end
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// plan plans one statement occupying sql[start:end]: as written, or, when
// that is refused, with a CTE over a tree inlined (inline.go).
func (p *planner) plan(n *pg.Node, start, end int) *Plan {
	pl := p.planWritten(n, start, end)
	if pl.Kind == Refused {
		if in := p.planInlined(n, start, end); in != nil && in.Kind != Refused {
			return in
		}
	}
	return pl
}

// planWritten plans the statement as written.
func (p *planner) planWritten(n *pg.Node, start, end int) *Plan {
	pl := &Plan{SQL: p.sql[start:end]}
	if err := p.tempShadow(n); err != nil {
		pl.Kind, pl.Err = Refused, err
		return pl
	}
	switch s := n.Node.(type) {
	case *pg.Node_TransactionStmt:
		p.transaction(pl, s.TransactionStmt)
	case *pg.Node_VariableSetStmt:
		p.variableSet(pl, s.VariableSetStmt)
	case *pg.Node_ConstraintsSetStmt:
		pl.Kind, pl.Tag = LocalSet, "SET CONSTRAINTS"
	case *pg.Node_DiscardStmt:
		if s.DiscardStmt.Target == pg.DiscardMode_DISCARD_ALL {
			pl.Kind, pl.Tag = Discard, "DISCARD ALL"
		}
	case *pg.Node_DeclareCursorStmt:
		p.declareCursor(pl, s.DeclareCursorStmt, n, start, end)
	case *pg.Node_ExplainStmt:
		r := p.route(s.ExplainStmt.Query)
		switch r.kind {
		case Single:
			// In text, the shard and node head PostgreSQL's plan; other
			// formats are PostgreSQL's alone, for the tools that read them.
			if _, format := explainOptions(s.ExplainStmt.Options); format == "text" {
				p.explain(pl, s.ExplainStmt, r, start, end)
			} else {
				p.apply(pl, r, start, end)
			}
		case Function:
			fn := r.fn
			if r.comp != nil {
				fn = r.comp.Calls[0].Call
			}
			pl.Kind, pl.Err = Refused, refused("Call the function without EXPLAIN.",
				"EXPLAIN of %s is not supported: lattice functions run in the proxy", fn.Name)
		case FanOut, WriteAll, InsertSplit:
			p.explain(pl, s.ExplainStmt, r, start, end)
		case Copy:
			// Only an INSERT ... SELECT the proxy loads routes so here:
			// the load is the proxy's, with no plan of PostgreSQL's.
			pl.Kind, pl.Err = Refused, refused("EXPLAIN the SELECT on its own: the proxy reads its rows and loads them as COPY FROM STDIN does.",
				"EXPLAIN of INSERT ... SELECT into tree %s whose rows the proxy loads itself is not supported", qn(r.tree.Name))
		default:
			p.apply(pl, r, start, end)
		}
	default:
		if !p.ddl(pl, n, start, end) {
			p.apply(pl, p.route(n), start, end)
			if pl.Kind == Catalog {
				pl.Cursor = cursorStatement(n)
			}
		}
	}
	if pl.Kind != Cursor {
		// The proxy holds a cursor over trees: no backend keeps state.
		applyPins(pl, n)
	}
	pl.Reparse = pl.Kind == Catalog && reparsed(n)
	if pl.Kind != Refused {
		path, replay := pathConfig(n)
		named, err := guardSetConfig(n, path)
		if err == nil && path != nil {
			// Recorded and replayed as SET search_path is: nothing to pin.
			pl.SetPath, pl.Pin = replay, pl.Pin&^PinSetConfig
		}
		if err == nil && len(named) > 0 {
			if pl.Kind != Catalog {
				err = &sqlstate.Error{Code: sqlstate.CantChangeRuntimeParam,
					Message: "set_config with a setting name read from pg_settings is supported through the Lattice proxy only in a statement over catalog tables",
					Hint:    "Name the setting with a string literal, or use SET."}
			} else if sql, ok := nameSettings(p.sql, start, end, named); ok {
				pl.SQL = sql
			} else {
				err = &sqlstate.Error{Code: sqlstate.CantChangeRuntimeParam,
					Message: "set_config with a setting name that is not a string constant is not supported through the Lattice proxy",
					Hint:    "Name the setting with a string literal, as in set_config('work_mem', $1, false), or use SET."}
			}
		}
		if err != nil {
			*pl = Plan{Kind: Refused, SQL: pl.SQL, Err: err}
		}
	}
	applyReach(pl, n)
	return pl
}

func (p *planner) apply(pl *Plan, r route, start, end int) {
	pl.Kind, pl.Anywhere, pl.Notify, pl.References = r.kind, r.anywhere, r.notify, r.refs
	switch r.kind {
	case Refused:
		pl.Err = r.err
	case Function:
		pl.Func, pl.Compose, pl.Tag = r.fn, r.comp, "SELECT"
	case FanOut:
		pl.Keys, pl.KeyArray = r.keys, r.keyArray
		pl.every = new(allShards)
		if r.fan.agg != nil {
			pl.Tree, pl.Agg, pl.Calls = r.tree, r.fan.agg, r.fan.calls
			return
		}
		fr, err := p.fanRenderer(r, start, end)
		if err != nil {
			pl.Kind, pl.Err = Refused, err
			return
		}
		pl.Tree, pl.fan = r.tree, fr
		pl.Sort, pl.Hidden, pl.Limit, pl.Offset, pl.Calls = r.fan.sort, r.fan.hidden, r.fan.limit, r.fan.offset, r.fan.calls
		pl.CollationProbe = r.fan.probe
	case Copy:
		p.applyCopy(pl, r, start, end)
	case RefWrite:
		pl.Copy = r.cp
	case Single, InsertSplit, WriteAll:
		pl.Tree, pl.Key, pl.Rows, pl.KeyAlso = r.tree, r.key, r.rows, r.keyAlso
		if r.multi != nil {
			rd, err := p.multiRenderer(r, start, end)
			if err != nil {
				pl.Kind, pl.Tree, pl.Key, pl.Err = Refused, nil, Value{}, err
				return
			}
			pl.render = rd
			if r.kind == WriteAll {
				if pl.write, err = p.multiWriteRenderer(r, start, end); err != nil {
					pl.Kind, pl.Tree, pl.render, pl.Err = Refused, nil, nil, err
				}
			}
			return
		}
		refs, err := p.refSpans(r)
		var rd *renderer
		if err == nil {
			rd, err = p.renderer(r.tree, refs, start, end)
		}
		if err != nil {
			pl.Kind, pl.Tree, pl.Key, pl.Rows, pl.Err = Refused, nil, Value{}, nil, err
			return
		}
		pl.render = rd
		if r.kind == WriteAll {
			if pl.write, err = p.writeRenderer(r, refs, start, end, true); err != nil {
				pl.Kind, pl.Tree, pl.render, pl.Err = Refused, nil, nil, err
				return
			}
		}
		pl.src = &planSource{refs: refs, keyLocs: r.keyLocs, keyCasts: r.keyCasts, keyByConstants: r.keyByConstants}
		if r.kind == InsertSplit {
			pl.InOrder = r.inOrder
			rows, err := p.valuesRows(r)
			var sp *splitter
			if err == nil {
				sp, err = p.splitter(r.tree, rows, refs, start, end)
			}
			if err != nil {
				pl.Kind, pl.Tree, pl.Rows, pl.render, pl.src, pl.Err = Refused, nil, nil, nil, nil, err
				return
			}
			pl.split = sp
			pl.src.rows = rows
		}
	}
}

// planSource is what the shape template of a routed plan is made from;
// it lives only until the template is built.
type planSource struct {
	refs     []span         // references to the tree
	rows     []span         // InsertSplit: the VALUES rows
	keyLocs  []int32        // location of each key constant or parameter
	keyCasts []*pg.TypeName // the cast over each key, or nil
	// keyByConstants: an UPDATE that sets the key is allowed by two
	// constants being alike (keyassign.go).
	keyByConstants bool
}

// route is the routing decision for one statement (before rendering).
type route struct {
	kind Kind
	// anywhere marks a read that names no relation (SELECT 1, SHOW): any
	// node answers it, so inside a transaction it follows the transaction.
	anywhere bool
	notify   bool // Catalog: sends a notification (NOTIFY, pg_notify)
	tree     *shardmap.Tree
	key      Value
	keyAlso  []Value // Single over several levels: the other values levels are pinned to
	// keyByConstants: see planSource.
	keyByConstants bool
	rows           []Value
	fn             *FuncCall
	comp           *ComposePlan // Function: a composed statement (fn is nil)
	err            *sqlstate.Error

	rv       *pg.RangeVar    // the tree reference
	cols     []*pg.ColumnRef // public.tree.col references to requalify
	keyLocs  []int32         // location of the key constant of the statement (Single) or of each row (InsertSplit)
	keyCasts []*pg.TypeName  // the cast over each key constant, or nil

	noKey    bool           // Refused because WHERE does not fix the shard key
	keys     []Value        // with noKey: WHERE restricts the key to these values (IN, = ANY(ARRAY[...]))
	keyArray *Value         // with noKey: WHERE restricts the key to the elements of this array (= ANY($1), = ANY('{...}'))
	sel      *pg.SelectStmt // FanOut: the statement
	fan      *fanPlan       // FanOut: sort keys, limit and offset
	cp       *CopySpec      // Copy

	// multi are the tree references of a statement that names trees more
	// than once or inside subqueries (colocate.go); rv is the first.
	multi []treeRef
	// keyedWindows marks a FanOut over several references whose windows
	// are all partitioned by the key (window.go): they run on the shards.
	keyedWindows bool
	// insert marks a WriteAll of INSERT ... SELECT (multiwrite.go): its
	// rows' keys come from filtered reads, so its WHERE takes no filter.
	insert bool
	refs   []string // the reference tables named (reference.go)
	// inOrder: an InsertSplit whose RETURNING rows go back in VALUES
	// order (Plan.InOrder).
	inOrder bool
}

// refTree is the tree of rv when rv is one of the route's tree references.
func (r route) refTree(rv *pg.RangeVar) *shardmap.Tree {
	if r.multi == nil {
		if rv.Location == r.rv.Location && rv.Relname == r.rv.Relname {
			return r.tree
		}
		return nil
	}
	for _, m := range r.multi {
		if m.rv.Location == rv.Location && m.rv.Relname == rv.Relname {
			return m.tree
		}
	}
	return nil
}

func refusedRoute(e *sqlstate.Error) route { return route{kind: Refused, err: e} }

// lookup resolves a RangeVar to a tree: unqualified or public-qualified
// names only. It reports whether the name is a tree named with a database
// qualifier (which is refused).
func (p *planner) lookup(rv *pg.RangeVar) (*shardmap.Tree, bool) {
	if rv.Schemaname != "" && rv.Schemaname != "public" {
		return nil, false
	}
	if p.trees == nil {
		return nil, false
	}
	t, ok := p.trees.Tree(rv.Relname)
	if !ok || t == nil {
		return nil, false
	}
	return t, rv.Catalogname != ""
}

func (p *planner) route(n *pg.Node) (out route) {
	var refs []string // the reference tables named: wherever the statement runs, they must have a copy
	defer func() {
		if out.refs == nil && out.kind != Refused {
			out.refs = refs
		}
	}()
	root, ok := nodeMessage(n)
	if !ok {
		return route{kind: Catalog}
	}
	name := stmtName(n)
	w := walkStmt(root)

	// lattice_* functions: SELECT f(...) and SELECT * FROM f(...) are
	// answered by the proxy alone; other SELECTs compose (compose.go).
	if len(w.lattice) > 0 {
		if sel, ok := root.(*pg.SelectStmt); ok && len(w.lattice) == 1 {
			if fc, ok := functionCall(sel); ok {
				return route{kind: Function, fn: fc}
			}
		}
		return p.composeRoute(root, w, name)
	}

	// Which relations are trees?
	var treeRefs []relRef
	var trees []*shardmap.Tree
	var other *pg.RangeVar
	var ordinary, refWrite *pg.RangeVar // a table that is not a reference table; a reference table written
	for _, r := range w.rels {
		if r.cte {
			continue
		}
		t, dbQualified := p.lookup(r.rv)
		if t == nil {
			if other == nil {
				other = r.rv
			}
			switch {
			case !p.isReference(r.rv):
				if ordinary == nil {
					ordinary = r.rv
				}
			case r.target && refWrite == nil:
				refWrite = r.rv
				refs = append([]string{r.rv.Relname}, slices.DeleteFunc(refs, func(n string) bool { return n == r.rv.Relname })...)
			case !slices.Contains(refs, r.rv.Relname):
				refs = append(refs, r.rv.Relname)
			}
			continue
		}
		if dbQualified {
			return refusedRoute(refused("Leave out the database name: "+qn(t.Name)+" or public."+qn(t.Name)+".",
				"%s names tree %s with a database qualifier (%s), which the proxy cannot route", name, qn(t.Name), r.rv.Catalogname))
		}
		treeRefs = append(treeRefs, r)
		trees = append(trees, t)
	}
	if drop := n.GetDropStmt(); drop != nil {
		if t := p.droppedTree(drop); t != nil {
			return refusedRoute(ddlRefusal(name, t))
		}
	}
	switch root.(type) {
	case *pg.CreateFunctionStmt, *pg.DoStmt:
		t := p.bodyTree(root)
		if t == nil && len(trees) > 0 {
			t = trees[0] // a SQL-standard body, walked with the statement
		}
		if t != nil {
			return refusedRoute(bodyRefusal(name, t))
		}
	}
	// A notification reaches only listeners of the node that commits it, and
	// the proxy's listeners are on the catalog node.
	notify := slices.Contains(functionNames([]*pg.Node{n}), "pg_notify")
	if len(treeRefs) == 0 && !notify {
		if drop := n.GetDropStmt(); drop != nil {
			if r, ok := p.dropReference(drop); ok {
				return r
			}
		}
		if len(refs) > 0 {
			return p.referenceRoute(n, name, refs, refWrite, ordinary)
		}
	}
	if len(treeRefs) == 0 {
		return route{kind: Catalog, notify: notify || n.GetNotifyStmt() != nil,
			anywhere: !notify && other == nil && (n.GetSelectStmt() != nil || n.GetVariableShowStmt() != nil)}
	}
	if notify {
		return refusedRoute(refused("Call pg_notify in a statement that names no tree, e.g. SELECT pg_notify('channel', 'payload').",
			"%s calls pg_notify on tree %s: notifications are delivered from the catalog node only", name, qn(trees[0].Name)))
	}
	tree := trees[0]
	if cs := n.GetCreateStmt(); cs != nil && cs.IfNotExists && len(treeRefs) == 1 && treeRefs[0].rv == cs.Relation {
		// The tree's template table exists on the catalog node: PostgreSQL
		// answers with a notice and changes nothing. Migrations that run
		// CREATE TABLE IF NOT EXISTS at start-up keep working. (A TEMP one
		// would be made in pg_temp: tempShadow refused it.)
		return route{kind: Catalog}
	}

	switch root.(type) {
	case *pg.SelectStmt, *pg.InsertStmt, *pg.UpdateStmt, *pg.DeleteStmt:
	case *pg.CopyStmt:
		return p.copyRoute(root.(*pg.CopyStmt))
	case *pg.MergeStmt:
	case *pg.DeclareCursorStmt:
		return refusedRoute(refused("Run the query without a cursor, with the shard key in WHERE.",
			"DECLARE CURSOR over tree %s is not supported", qn(tree.Name)))
	case *pg.PrepareStmt:
		return refusedRoute(refused("Use the extended query protocol (Parse/Bind), which every driver offers.",
			"PREPARE of a statement on tree %s is not supported", qn(tree.Name)))
	case *pg.ViewStmt:
		return refusedRoute(refused("Write the view's query in the statements that need it (a CTE serves), so that the proxy routes it to the shards.",
			"%s reading tree %s is not supported: the view would live on the catalog node, where the tree is an empty template", name, qn(tree.Name)))
	case *pg.CreateTableAsStmt:
		return refusedRoute(refused("Create the table and make it a tree (lattice_create_tree), then fill it with INSERT ... SELECT; or read the rows through the proxy and write them with INSERT ... VALUES.",
			"%s reading tree %s is not supported: the tree's rows live on the shards", name, qn(tree.Name)))
	case *pg.LockStmt:
		if root.(*pg.LockStmt).Mode == accessShareLock {
			// Locks the template, which every DDL and TRUNCATE of a tree
			// locks first (pgshard/ddl.go): pg_dump's lock, holding the
			// table's definition still. Stronger modes would hold off row
			// writes in PostgreSQL; the template sees none.
			return route{kind: Catalog}
		}
		return refusedRoute(ddlRefusal(name, tree))
	default:
		return refusedRoute(ddlRefusal(name, tree))
	}

	if sel, ok := root.(*pg.SelectStmt); ok && sel.IntoClause != nil {
		return refusedRoute(refused("Create the table first, then fill it with INSERT ... VALUES.",
			"SELECT INTO with tree %s is not supported", qn(tree.Name)))
	}
	if refWrite != nil {
		return refusedRoute(refused("Write the reference table in a statement of its own: its writes go to every node.",
			"%s writes reference table %s together with tree %s", name, qn(refWrite.Relname), qn(tree.Name)))
	}
	multi := len(treeRefs) > 1
	if ins, ok := root.(*pg.InsertStmt); ok {
		if sel := ins.SelectStmt.GetSelectStmt(); sel != nil && len(sel.ValuesLists) == 0 {
			multi = true // INSERT ... SELECT: where the rows go depends on the SELECT
		}
	}
	for _, ref := range treeRefs {
		multi = multi || ref.nested
	}
	if multi {
		r := p.multiRoute(root, w, name, trees, ordinary)
		if ins, ok := root.(*pg.InsertStmt); ok && r.kind == Refused {
			if pullable(ins, treeRefs) {
				return p.insertPull(ins, tree)
			}
			if target, ok := pullableFromTrees(ins, treeRefs); ok {
				if t, _ := p.lookup(target.rv); t != nil {
					if pr, ok := p.insertPullTrees(ins, t); ok {
						return pr
					}
				}
			}
		}
		return r
	}
	ref := treeRefs[0]
	if ordinary != nil {
		return refusedRoute(refused(fmt.Sprintf(referenceHint, ordinary.Relname),
			"%s uses tree %s together with %s", name, qn(tree.Name), relText(ordinary)))
	}

	r := route{tree: tree, rv: ref.rv}
	for _, c := range w.cols {
		if isPublicTreeRef(c, tree) {
			r.cols = append(r.cols, c)
		}
		if isDatabaseTreeRef(c, tree) {
			return refusedRoute(refused("Leave out the database name: "+qn(tree.Name)+".col or public."+qn(tree.Name)+".col.",
				"%s names a column of tree %s with a database qualifier (%s), which the proxy cannot route", name, qn(tree.Name), c.Fields[0].GetString_().GetSval()))
		}
	}
	switch s := root.(type) {
	case *pg.SelectStmt:
		w := p.where(r, name, s.WhereClause)
		if !w.noKey {
			return w
		}
		if len(s.LockingClause) > 0 {
			// Rows cannot be locked over several shards; rows named by
			// their keys may all be on one (TPC-C's New-Order locks its
			// stock rows by (s_w_id, s_i_id) IN ((...), ...)).
			if key, also, c, ok := p.rowInKey(r, s.WhereClause); ok {
				r.kind, r.key, r.keyAlso = Single, key, also
				r.keyLocs, r.keyCasts = []int32{c.loc}, []*pg.TypeName{c.cast}
				return r
			}
		}
		r.keys, r.keyArray = w.keys, w.keyArray
		return p.fanOut(r, s)
	case *pg.UpdateStmt:
		for _, t := range s.TargetList {
			if rt := t.GetResTarget(); rt != nil && rt.Name == tree.KeyColumn {
				kept, byConstants := keyKept(rt, s.Relation, tree.KeyColumn, s.WhereClause)
				if !kept {
					return refusedRoute(keyAssignRefusal(tree))
				}
				r.keyByConstants = r.keyByConstants || byConstants
			}
		}
		return everyShard(p.where(r, name, s.WhereClause), r, s.WhereClause)
	case *pg.DeleteStmt:
		return everyShard(p.where(r, name, s.WhereClause), r, s.WhereClause)
	case *pg.InsertStmt:
		return p.insert(r, s)
	case *pg.MergeStmt:
		return p.merge(r, s)
	}
	return refusedRoute(ddlRefusal(name, tree))
}

// everyShard turns an UPDATE or DELETE whose WHERE does not fix the shard
// key into a write on every shard. WHERE CURRENT OF names a cursor, which
// lives on one backend: it stays refused.
func everyShard(w, r route, where *pg.Node) route {
	if !w.noKey || where.GetCurrentOfExpr() != nil {
		return w
	}
	r.kind = WriteAll
	return r
}

// accessShareLock is LOCK TABLE's ACCESS SHARE mode (PostgreSQL's lock
// mode number).
const accessShareLock = 1

func ddlRefusal(name string, t *shardmap.Tree) *sqlstate.Error {
	shards := "lattice_sNNNN." + quoteIdent(t.Name)
	hint := "Change the table before making it a tree (lattice_create_tree), or apply the change to every shard table (" + shards + ") on the nodes directly."
	switch name {
	case "TRUNCATE TABLE":
		hint = "Delete rows by shard key (DELETE ... WHERE " + t.KeyColumn + " = ...), or truncate every shard table (" + shards + ") on the nodes directly."
	case "LOCK TABLE":
		hint = "Lock rows by shard key with SELECT ... WHERE " + t.KeyColumn + " = ... FOR UPDATE; LOCK TABLE ... IN ACCESS SHARE MODE, which holds off DDL and TRUNCATE, is supported."
	case "GRANT", "REVOKE":
		hint = "Grant on every shard table (" + shards + ") on the nodes directly, and on the template public." + quoteIdent(t.Name) + "."
	}
	return refused(hint, "%s on tree %s is not supported through the proxy", name, qn(t.Name))
}

func relText(rv *pg.RangeVar) string {
	s := qn(rv.Relname)
	if rv.Schemaname != "" {
		s = qn(rv.Schemaname) + "." + s
	}
	return "table " + s
}

// droppedTree finds a tree among the objects of DROP TABLE (or of DROP
// TRIGGER/RULE/POLICY ... ON tree), whose names are plain lists.
func (p *planner) droppedTree(d *pg.DropStmt) *shardmap.Tree {
	rels, _ := droppedRelations(d)
	for _, rv := range rels {
		if t, _ := p.lookup(rv); t != nil {
			return t
		}
	}
	return nil
}

// droppedRelations lists the relations a DROP names whose names are plain
// lists: the objects themselves for DROP TABLE, VIEW, MATERIALIZED VIEW,
// FOREIGN TABLE, SEQUENCE and INDEX, or the tables they are on for DROP
// TRIGGER, RULE and POLICY (on reports which).
func droppedRelations(d *pg.DropStmt) (rels []*pg.RangeVar, on bool) {
	switch d.RemoveType {
	case pg.ObjectType_OBJECT_TABLE, pg.ObjectType_OBJECT_VIEW, pg.ObjectType_OBJECT_MATVIEW,
		pg.ObjectType_OBJECT_FOREIGN_TABLE, pg.ObjectType_OBJECT_SEQUENCE, pg.ObjectType_OBJECT_INDEX:
	case pg.ObjectType_OBJECT_TRIGGER, pg.ObjectType_OBJECT_RULE, pg.ObjectType_OBJECT_POLICY:
		on = true
	default:
		return nil, false
	}
	for _, o := range d.Objects {
		l := o.GetList()
		if l == nil {
			continue
		}
		var names []string
		for _, it := range l.Items {
			names = append(names, it.GetString_().GetSval())
		}
		if on {
			if len(names) < 2 {
				continue
			}
			names = names[:len(names)-1]
		}
		rels = append(rels, rangeVarOf(names))
	}
	return rels, on
}

// isPublicTreeRef reports whether a column reference starts public.tree.
func isPublicTreeRef(c *pg.ColumnRef, t *shardmap.Tree) bool {
	return len(c.Fields) >= 3 && c.Fields[0].GetString_().GetSval() == "public" && c.Fields[1].GetString_().GetSval() == t.Name
}

// isDatabaseTreeRef reports whether a column reference names public.tree
// after one qualifier or more (db.public.tree.col; PostgreSQL rejects more
// than one, but only once it analyses the statement).
func isDatabaseTreeRef(c *pg.ColumnRef, t *shardmap.Tree) bool {
	for i := 1; i+2 < len(c.Fields); i++ {
		if c.Fields[i].GetString_().GetSval() == "public" && c.Fields[i+1].GetString_().GetSval() == t.Name {
			return true
		}
	}
	return false
}

// where finds the shard key in the top-level conjunction of a WHERE clause.
func (p *planner) where(r route, name string, where *pg.Node) route {
	tree := r.tree
	var found *Value
	var foundC constant
	var problem string
	var set *keySetValue // key IN (...) or key = ANY(...): the shards that own these keys
	var visit func(n *pg.Node) bool
	visit = func(n *pg.Node) bool {
		if n == nil {
			return false
		}
		if b := n.GetBoolExpr(); b != nil {
			if b.Boolop != pg.BoolExprType_AND_EXPR {
				return false
			}
			for _, a := range b.Args {
				if visit(a) {
					return true
				}
			}
			return false
		}
		e := n.GetAExpr()
		if e == nil || !isPlainEq(e.Name) {
			return false
		}
		var operand *pg.Node
		switch e.Kind {
		case pg.A_Expr_Kind_AEXPR_OP:
			if p.isKeyColumn(e.Lexpr, r.rv, tree) {
				operand = e.Rexpr
			} else if p.isKeyColumn(e.Rexpr, r.rv, tree) {
				operand = e.Lexpr
			}
		case pg.A_Expr_Kind_AEXPR_IN:
			if l := e.Rexpr.GetList(); l != nil && len(l.Items) == 1 && p.isKeyColumn(e.Lexpr, r.rv, tree) {
				operand = l.Items[0]
			} else if l != nil && p.isKeyColumn(e.Lexpr, r.rv, tree) && set == nil {
				set, problem = keySet(tree, l.Items)
			}
		case pg.A_Expr_Kind_AEXPR_OP_ANY:
			if p.isKeyColumn(e.Lexpr, r.rv, tree) && set == nil {
				set, problem = keyArray(tree, e.Rexpr)
			}
		}
		if problem != "" {
			return true
		}
		if operand == nil {
			return false
		}
		c, ok := asConstant(operand)
		if !ok {
			return false // key = expression: look for another conjunct
		}
		v, msg := keyValue(tree, c)
		if msg != "" {
			problem = msg
			return true
		}
		found, foundC = &v, c
		return true
	}
	visit(where)
	if problem != "" {
		return refusedRoute(refused("", "%s on tree %s: %s", name, qn(tree.Name), problem))
	}
	if found == nil {
		if set != nil {
			r.keys, r.keyArray = set.keys, set.array
		}
		return route{kind: Refused, noKey: true, keys: r.keys, keyArray: r.keyArray, err: refused("Add "+tree.KeyColumn+" = <value> (or IN with one value) to the WHERE clause, ANDed with the other conditions, so that the statement runs on one shard.",
			"%s on tree %s does not fix the shard key %s", name, qn(tree.Name), qn(tree.KeyColumn))}
	}
	r.kind, r.key = Single, *found
	r.keyLocs, r.keyCasts = []int32{foundC.loc}, []*pg.TypeName{foundC.cast}
	return r
}

// rowInKey reads (..., key, ...) IN ((..., $a, ...), (..., $b, ...)) in
// the top-level AND of a WHERE clause when the key's element of every row
// is a parameter: the first is the key, the others must fall in its slot
// (Plan.KeyAlso, checked by Resolve against the Bind).
func (p *planner) rowInKey(r route, where *pg.Node) (Value, []Value, constant, bool) {
	for _, n := range conjuncts(where, nil) {
		e := n.GetAExpr()
		if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_IN || !isPlainEq(e.Name) {
			continue
		}
		row, list := e.Lexpr.GetRowExpr(), e.Rexpr.GetList()
		if row == nil || list == nil || len(list.Items) == 0 {
			continue
		}
		k := -1
		for i, a := range row.Args {
			if p.isKeyColumn(a, r.rv, r.tree) {
				k = i
			}
		}
		if k < 0 {
			continue
		}
		var key Value
		var first constant
		var also []Value
		ok := true
		for i, it := range list.Items {
			ir := it.GetRowExpr()
			if ir == nil || len(ir.Args) != len(row.Args) {
				ok = false
				break
			}
			c, isConst := asConstant(ir.Args[k])
			if !isConst || c.kind != litParam {
				ok = false
				break
			}
			v, msg := keyValue(r.tree, c)
			if msg != "" {
				ok = false
				break
			}
			switch {
			case i == 0:
				key, first = v, c
			case v != key && !slices.Contains(also, v):
				also = append(also, v)
			}
		}
		if ok {
			return key, also, first, true
		}
	}
	return Value{}, nil, constant{}, false
}

func isPlainEq(names []*pg.Node) bool {
	return len(names) == 1 && names[0].GetString_().GetSval() == "="
}

// isKeyColumn reports whether n is a reference to the tree's key column:
// key, ref.key (ref is the alias, or the table name when there is no
// alias), or public.table.key when there is no alias.
func (p *planner) isKeyColumn(n *pg.Node, rv *pg.RangeVar, t *shardmap.Tree) bool {
	return namesKey(n, rv, t.KeyColumn)
}

// insert routes INSERT ... VALUES into a tree.
func (p *planner) insert(r route, s *pg.InsertStmt) route {
	tree := r.tree
	keyIdx := -1
	if len(s.Cols) > 0 {
		for i, c := range s.Cols {
			if rt := c.GetResTarget(); rt != nil && rt.Name == tree.KeyColumn {
				if len(rt.Indirection) > 0 {
					return refusedRoute(refused("Give the whole key value.",
						"INSERT into tree %s assigns part of the shard key %s", qn(tree.Name), qn(tree.KeyColumn)))
				}
				keyIdx = i
				break
			}
		}
		if keyIdx < 0 {
			return refusedRoute(refused("Name "+tree.KeyColumn+" in the column list and give its value: keys are supplied by the application.",
				"INSERT into tree %s does not give the shard key %s", qn(tree.Name), qn(tree.KeyColumn)))
		}
	} else {
		for i, c := range tree.Columns {
			if c == tree.KeyColumn {
				keyIdx = i
				break
			}
		}
		if keyIdx < 0 {
			return refusedRoute(refused("Give a column list that names "+tree.KeyColumn+".",
				"INSERT into tree %s without a column list cannot be routed: the proxy does not know the tree's column order", qn(tree.Name)))
		}
	}
	if s.SelectStmt == nil {
		return refusedRoute(refused("Use INSERT ... ("+tree.KeyColumn+", ...) VALUES (...) with the key value.",
			"INSERT ... DEFAULT VALUES into tree %s does not give the shard key %s", qn(tree.Name), qn(tree.KeyColumn)))
	}
	sel := s.SelectStmt.GetSelectStmt()
	if sel == nil || len(sel.ValuesLists) == 0 || sel.WithClause != nil || len(sel.SortClause) > 0 ||
		sel.LimitCount != nil || sel.LimitOffset != nil || len(sel.LockingClause) > 0 || sel.Op != pg.SetOperation_SETOP_NONE {
		return refusedRoute(refused("Select the rows first, then send them with INSERT ... VALUES (a multi-row INSERT is split by shard).",
			"INSERT ... SELECT into tree %s is not supported", qn(tree.Name)))
	}
	if err := upsertKeyRefusal(s, tree); err != nil {
		return refusedRoute(err)
	}
	rows := make([]Value, 0, len(sel.ValuesLists))
	anchors := make([]int32, 0, len(sel.ValuesLists))
	casts := make([]*pg.TypeName, 0, len(sel.ValuesLists))
	for i, row := range sel.ValuesLists {
		items := row.GetList().GetItems()
		if keyIdx >= len(items) {
			return refusedRoute(refused("Give the key value in every row.",
				"INSERT into tree %s does not give the shard key %s in row %d", qn(tree.Name), qn(tree.KeyColumn), i+1))
		}
		c, ok := asConstant(items[keyIdx])
		if !ok {
			what := "an expression"
			if items[keyIdx].GetSetToDefault() != nil {
				what = "DEFAULT"
			}
			return refusedRoute(refused("Compute the key in the application and give it as a literal or a $n parameter.",
				"INSERT into tree %s gives the shard key %s as %s in row %d", qn(tree.Name), qn(tree.KeyColumn), what, i+1))
		}
		v, msg := keyValue(tree, c)
		if msg != "" {
			return refusedRoute(refused("", "INSERT on tree %s: %s", qn(tree.Name), msg))
		}
		rows = append(rows, v)
		anchors = append(anchors, c.loc)
		casts = append(casts, c.cast)
	}
	r.keyLocs, r.keyCasts = anchors, casts
	if len(rows) == 1 {
		r.kind, r.key = Single, rows[0]
		return r
	}
	r.kind, r.rows = InsertSplit, rows
	oc := s.OnConflictClause
	r.inOrder = len(s.ReturningList) > 0 && (oc == nil || oc.Action == pg.OnConflictAction_ONCONFLICT_UPDATE && oc.WhereClause == nil)
	return r
}

// functionCall recognises SELECT lattice_x(args) and SELECT * FROM lattice_x(args).
func functionCall(s *pg.SelectStmt) (*FuncCall, bool) {
	if len(s.TargetList) != 1 || len(s.DistinctClause) > 0 || s.IntoClause != nil || s.WhereClause != nil ||
		len(s.GroupClause) > 0 || s.HavingClause != nil || len(s.WindowClause) > 0 || len(s.ValuesLists) > 0 ||
		len(s.SortClause) > 0 || s.LimitOffset != nil || s.LimitCount != nil || len(s.LockingClause) > 0 ||
		s.WithClause != nil || s.Op != pg.SetOperation_SETOP_NONE {
		return nil, false
	}
	rt := s.TargetList[0].GetResTarget()
	if rt == nil || rt.Name != "" || len(rt.Indirection) > 0 {
		return nil, false
	}
	var fc *pg.FuncCall
	star := false
	switch len(s.FromClause) {
	case 0:
		fc = rt.Val.GetFuncCall()
	case 1:
		c := rt.Val.GetColumnRef()
		if c == nil || len(c.Fields) != 1 || c.Fields[0].GetAStar() == nil {
			return nil, false
		}
		rf := s.FromClause[0].GetRangeFunction()
		if rf == nil || rf.Lateral || rf.Ordinality || rf.IsRowsfrom || rf.Alias != nil || len(rf.Coldeflist) > 0 || len(rf.Functions) != 1 {
			return nil, false
		}
		l := rf.Functions[0].GetList()
		if l == nil || len(l.Items) == 0 || len(l.Items) > 2 || len(l.Items) == 2 && l.Items[1].GetList() != nil && len(l.Items[1].GetList().Items) > 0 {
			return nil, false
		}
		fc = l.Items[0].GetFuncCall()
		star = true
	default:
		return nil, false
	}
	out, ok := latticeCall(fc)
	if ok {
		out.Star = star
	}
	return out, ok
}

// latticeCall reads a call of a lattice_x function whose arguments are
// constants or $n, unqualified or public-qualified.
func latticeCall(fc *pg.FuncCall) (*FuncCall, bool) {
	if fc == nil || len(fc.AggOrder) > 0 || fc.AggFilter != nil || fc.Over != nil || fc.AggWithinGroup ||
		fc.AggStar || fc.AggDistinct || fc.FuncVariadic {
		return nil, false
	}
	var name string
	switch len(fc.Funcname) {
	case 1:
		name = fc.Funcname[0].GetString_().GetSval()
	case 2:
		if fc.Funcname[0].GetString_().GetSval() != "public" {
			return nil, false
		}
		name = fc.Funcname[1].GetString_().GetSval()
	default:
		return nil, false
	}
	if !strings.HasPrefix(name, "lattice_") {
		return nil, false
	}
	out := &FuncCall{Name: name}
	for _, a := range fc.Args {
		if na := a.GetNamedArgExpr(); na != nil {
			c, ok := asConstant(na.Arg)
			if !ok {
				return nil, false
			}
			if out.Named == nil {
				out.Named = make(map[string]Value)
			}
			if _, dup := out.Named[na.Name]; dup {
				return nil, false
			}
			out.Named[na.Name] = c.value()
			continue
		}
		if out.Named != nil {
			return nil, false // positional after named: PostgreSQL rejects it too
		}
		c, ok := asConstant(a)
		if !ok {
			return nil, false
		}
		out.Args = append(out.Args, c.value())
	}
	return out, true
}

// transaction plans transaction control.
func (p *planner) transaction(pl *Plan, t *pg.TransactionStmt) {
	pl.Kind = Transaction
	switch t.Kind {
	case pg.TransactionStmtKind_TRANS_STMT_BEGIN, pg.TransactionStmtKind_TRANS_STMT_START:
		pl.Tx, pl.Tag = Begin, "BEGIN"
		if t.Kind == pg.TransactionStmtKind_TRANS_STMT_START {
			pl.Tag = "START TRANSACTION"
		}
		pl.TxOptions = txOptions(t.Options)
	case pg.TransactionStmtKind_TRANS_STMT_COMMIT:
		pl.Tx, pl.Tag, pl.Chain = Commit, "COMMIT", t.Chain
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK:
		pl.Tx, pl.Tag, pl.Chain = Rollback, "ROLLBACK", t.Chain
	case pg.TransactionStmtKind_TRANS_STMT_SAVEPOINT:
		pl.Tx, pl.Tag, pl.Savepoint = Savepoint, "SAVEPOINT", t.SavepointName
	case pg.TransactionStmtKind_TRANS_STMT_RELEASE:
		pl.Tx, pl.Tag, pl.Savepoint = Release, "RELEASE", t.SavepointName
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_TO:
		pl.Tx, pl.Tag, pl.Savepoint = RollbackTo, "ROLLBACK", t.SavepointName
	default:
		what := map[pg.TransactionStmtKind]string{
			pg.TransactionStmtKind_TRANS_STMT_PREPARE:           "PREPARE TRANSACTION",
			pg.TransactionStmtKind_TRANS_STMT_COMMIT_PREPARED:   "COMMIT PREPARED",
			pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_PREPARED: "ROLLBACK PREPARED",
		}[t.Kind]
		if what == "" {
			what = "this transaction statement"
		}
		pl.Kind, pl.Tx = Refused, PrepareTx
		pl.Err = refused("Use ordinary transactions (BEGIN ... COMMIT): a COMMIT over several nodes is already atomic, by the proxy's own two-phase commit.",
			"%s is not supported through the Lattice proxy: a transaction prepared by a client would outlive the pooled backends of its session", what)
	}
}

// txOptions renders BEGIN / START TRANSACTION options as text that can be
// passed to BEGIN on a backend.
func txOptions(opts []*pg.Node) string {
	var parts []string
	for _, o := range opts {
		d := o.GetDefElem()
		if d == nil {
			continue
		}
		c, _ := bareConstant(d.Arg)
		on := c.kind == litInt && c.text != "0"
		switch d.Defname {
		case "transaction_isolation":
			parts = append(parts, "ISOLATION LEVEL "+strings.ToUpper(c.text))
		case "transaction_read_only":
			if on {
				parts = append(parts, "READ ONLY")
			} else {
				parts = append(parts, "READ WRITE")
			}
		case "transaction_deferrable":
			if on {
				parts = append(parts, "DEFERRABLE")
			} else {
				parts = append(parts, "NOT DEFERRABLE")
			}
		}
	}
	return strings.Join(parts, " ")
}

// variableSet plans SET and RESET.
func (p *planner) variableSet(pl *Plan, s *pg.VariableSetStmt) {
	pl.Kind, pl.Tag = SessionSet, "SET"
	switch {
	case s.Kind == pg.VariableSetKind_VAR_RESET || s.Kind == pg.VariableSetKind_VAR_RESET_ALL:
		pl.Tag = "RESET"
	case s.IsLocal, s.Kind == pg.VariableSetKind_VAR_SET_MULTI && strings.HasPrefix(s.Name, "TRANSACTION"):
		pl.Kind = LocalSet
	}
	if s.Kind != pg.VariableSetKind_VAR_SET_VALUE || len(s.Args) == 0 {
		return
	}
	c, _ := bareConstant(s.Args[0])
	value := c.text
	if strings.ToLower(s.Name) == "standard_conforming_strings" && len(s.Args) != 1 {
		value = ""
	}
	if err := CheckSetting(s.Name, value); err != nil {
		pl.Kind, pl.Tag, pl.Err = Refused, "", err
	}
}

// CheckSetting refuses a session setting under which the proxy would read
// or hash shard keys differently from PostgreSQL. It serves SET statements
// and the settings a client sends at startup.
func CheckSetting(name, value string) *sqlstate.Error {
	if err := guardSetting(name, value); err != nil {
		return err
	}
	return checkReading(name, value)
}

// CheckReported refuses a value a backend reports in ParameterStatus for
// a setting by which the proxy reads statements. SET and set_config of
// them are refused, but a function body can change one at run time, out
// of the planner's sight, or an ALTER ROLE ... SET made in one can start
// every new backend with it; PostgreSQL reports both (GUC_REPORT).
func CheckReported(name, value string) *sqlstate.Error {
	e := checkReading(name, value)
	if e != nil {
		e.Message = "the node's session reports " + e.Message
		e.Detail = "A function or a role's setting changed it at run time, which the proxy cannot follow; the backend is closed."
		e.Hint = "Do not change " + strings.ToLower(name) + " in a function, nor with ALTER ROLE or ALTER DATABASE ... SET (RESET it there). " + e.Hint
	}
	return e
}

// checkReading refuses a value of a setting under which the backend would
// read a statement's shard keys differently from the proxy.
func checkReading(name, value string) *sqlstate.Error {
	switch strings.ToLower(name) {
	case "standard_conforming_strings":
		// The proxy parses every statement with standard_conforming_strings
		// on: with it off, 'a\'b' would be read differently by the backend,
		// and a key literal could hash to the wrong shard.
		if b, ok := parseBool(value); !ok || !b {
			return refused("Keep standard_conforming_strings on (the default) and use E'...' strings for backslash escapes.",
				"standard_conforming_strings = %s is not supported: the proxy reads string literals as standard strings", shorten(value))
		}
	case "client_encoding":
		// Keys are hashed as the bytes the client sends: they must be
		// UTF-8, the servers' encoding.
		e := strings.ToUpper(strings.ReplaceAll(value, "-", ""))
		e = strings.ReplaceAll(e, "_", "")
		if e != "UTF8" && e != "UNICODE" && e != "SQLASCII" {
			return refused("Use client_encoding UTF8 and convert in the application.",
				"client_encoding = %s is not supported: the proxy hashes shard keys as UTF-8", shorten(value))
		}
	}
	return nil
}

// parseBool reads a boolean the way PostgreSQL's parse_bool does.
func parseBool(s string) (bool, bool) {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "" {
		return false, false
	}
	switch {
	case strings.HasPrefix("true", v), strings.HasPrefix("yes", v), v == "1":
		return true, true
	case strings.HasPrefix("false", v), strings.HasPrefix("no", v), v == "0":
		return false, true
	case len(v) >= 2 && strings.HasPrefix("on", v):
		return true, true
	case len(v) >= 2 && strings.HasPrefix("off", v):
		return false, true
	}
	return false, false
}

// nodeMessage returns the message inside a Node.
func nodeMessage(n *pg.Node) (proto.Message, bool) {
	if n == nil || n.Node == nil {
		return nil, false
	}
	m := n.ProtoReflect()
	od := m.Descriptor().Oneofs().ByName("node")
	fd := m.WhichOneof(od)
	if fd == nil {
		return nil, false
	}
	return m.Get(fd).Message().Interface(), true
}

// stmtName names a statement for messages the way PostgreSQL's command
// tags do.
func stmtName(n *pg.Node) string {
	switch s := n.Node.(type) {
	case *pg.Node_SelectStmt:
		if s.SelectStmt.IntoClause != nil {
			return "SELECT INTO"
		}
		return "SELECT"
	case *pg.Node_InsertStmt:
		return "INSERT"
	case *pg.Node_UpdateStmt:
		return "UPDATE"
	case *pg.Node_DeleteStmt:
		return "DELETE"
	case *pg.Node_MergeStmt:
		return "MERGE"
	case *pg.Node_CopyStmt:
		return "COPY"
	case *pg.Node_CreateStmt:
		return "CREATE TABLE"
	case *pg.Node_AlterTableStmt:
		return "ALTER " + objectWord(s.AlterTableStmt.Objtype)
	case *pg.Node_RenameStmt:
		return "ALTER " + objectWord(s.RenameStmt.RenameType)
	case *pg.Node_AlterObjectSchemaStmt:
		return "ALTER " + objectWord(s.AlterObjectSchemaStmt.ObjectType)
	case *pg.Node_DropStmt:
		return "DROP " + objectWord(s.DropStmt.RemoveType)
	case *pg.Node_TruncateStmt:
		return "TRUNCATE TABLE"
	case *pg.Node_IndexStmt:
		return "CREATE INDEX"
	case *pg.Node_ViewStmt:
		return "CREATE VIEW"
	case *pg.Node_CreateTableAsStmt:
		if s.CreateTableAsStmt.Objtype == pg.ObjectType_OBJECT_MATVIEW {
			return "CREATE MATERIALIZED VIEW"
		}
		return "CREATE TABLE AS"
	case *pg.Node_LockStmt:
		return "LOCK TABLE"
	case *pg.Node_VacuumStmt:
		if s.VacuumStmt.IsVacuumcmd {
			return "VACUUM"
		}
		return "ANALYZE"
	case *pg.Node_GrantStmt:
		if s.GrantStmt.IsGrant {
			return "GRANT"
		}
		return "REVOKE"
	case *pg.Node_CreateTrigStmt:
		return "CREATE TRIGGER"
	case *pg.Node_RuleStmt:
		return "CREATE RULE"
	case *pg.Node_CreatePolicyStmt:
		return "CREATE POLICY"
	case *pg.Node_AlterPolicyStmt:
		return "ALTER POLICY"
	case *pg.Node_ClusterStmt:
		return "CLUSTER"
	case *pg.Node_ReindexStmt:
		return "REINDEX"
	case *pg.Node_DeclareCursorStmt:
		return "DECLARE CURSOR"
	case *pg.Node_PrepareStmt:
		return "PREPARE"
	case *pg.Node_ExplainStmt:
		return "EXPLAIN"
	case *pg.Node_CreateStatsStmt:
		return "CREATE STATISTICS"
	case *pg.Node_CommentStmt:
		return "COMMENT"
	case *pg.Node_CallStmt:
		return "CALL"
	case *pg.Node_CreatePublicationStmt:
		return "CREATE PUBLICATION"
	case *pg.Node_AlterPublicationStmt:
		return "ALTER PUBLICATION"
	case *pg.Node_RefreshMatViewStmt:
		return "REFRESH MATERIALIZED VIEW"
	}
	m, ok := nodeMessage(n)
	if !ok {
		return "statement"
	}
	return camelWords(strings.TrimSuffix(string(m.ProtoReflect().Descriptor().Name()), "Stmt"))
}

func objectWord(t pg.ObjectType) string {
	s := strings.TrimPrefix(t.String(), "OBJECT_")
	return strings.ReplaceAll(s, "_", " ")
}

// camelWords turns AlterOwner into ALTER OWNER.
func camelWords(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i > 0 && c >= 'A' && c <= 'Z' && s[i-1] >= 'a' && s[i-1] <= 'z' {
			b.WriteByte(' ')
		}
		b.WriteByte(c)
	}
	return strings.ToUpper(b.String())
}

// rangeVarOf is the relation a qualified name (catalog.schema.rel, each
// part optional but the last) of a DROP statement names.
func rangeVarOf(names []string) *pg.RangeVar {
	rv := &pg.RangeVar{Relname: names[len(names)-1]}
	if len(names) >= 2 {
		rv.Schemaname = names[len(names)-2]
	}
	if len(names) >= 3 {
		rv.Catalogname = names[len(names)-3]
	}
	return rv
}
