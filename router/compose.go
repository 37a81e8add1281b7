package router

import (
	"fmt"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/sqlstate"
)

// A SELECT that uses lattice_* functions as PostgreSQL uses table
// functions (in FROM, joined, filtered, grouped, in a CTE) or as values (in
// an expression) is a composed Function plan: the proxy evaluates each
// call, and PostgreSQL runs the rest of the statement on the catalog node
// over the rows, which take the call's place (ComposePlan.Render). The
// plain forms SELECT f(...) and SELECT * FROM f(...) keep their plan
// without Compose: the proxy answers them alone.

// composable are the functions that only read. The proxy evaluates a
// composed call when it binds the statement, as PostgreSQL takes a
// portal's snapshot at Bind, and whether PostgreSQL would evaluate it at
// all (WHERE false, a CASE branch) is not known then: a function that
// changes the cluster runs only in a statement of its own, where it runs
// exactly once per Execute.
// The value is true for a function of one column and one row, which may
// also stand as a value in an expression; the others only in FROM.
var composable = map[string]bool{
	"lattice_trees":            false,
	"lattice_shards":           false,
	"lattice_reshard_status":   false,
	"lattice_nodes":            false,
	"lattice_reshard_complete": true,
	// Rebalancing's read-only functions.
	"lattice_rebalance_status":   false,
	"lattice_rebalance_complete": true,
	"lattice_drain_complete":     true,
	// Merging's.
	"lattice_merge_status":    false,
	"lattice_merge_complete":  true,
	"lattice_resize_complete": true,
	"lattice_resize_status":   false,
	// Only without repair => true, which deletes rows (repairs).
	"lattice_verify": false,
	// Snapshots' read-only functions.
	"lattice_snapshot_status":   false,
	"lattice_snapshot_complete": true,
	// Reference tables.
	"lattice_reference_tables": false,
}

// changing are the functions that change the cluster: they run only in a
// statement of their own.
var changing = map[string]bool{
	"lattice_create_tree": true, "lattice_reshard": true, "lattice_add_node": true, "lattice_remove_node": true,
	"lattice_move_shard": true, "lattice_rebalance": true, "lattice_drain_node": true,
	"lattice_repair_migration": true, "lattice_set_tree_option": true,
	"lattice_snapshot":               true,
	"lattice_create_reference_table": true, "lattice_undistribute_table": true,
	"lattice_merge":  true,
	"lattice_resize": true,
	// lattice_verify gets here only when it repairs.
	"lattice_verify": true,
}

// repairs reports a lattice_verify call that asks to repair: it changes
// the cluster, so it does not compose.
func repairs(fc *FuncCall) bool {
	if fc.Name != "lattice_verify" {
		return false
	}
	_, named := fc.Named["repair"]
	return len(fc.Args) > 1 || named
}

// Composable reports whether the lattice function name may be composed
// into a larger SELECT, and whether as a value in an expression.
func Composable(name string) (ok, value bool) {
	value, ok = composable[name]
	return ok, value
}

// maxComposedCalls bounds the calls of one statement: each is a call into
// the proxy's functions per execution.
const maxComposedCalls = 16

// callPlaceholder names call i (0-based) in the deparsed final statement.
func callPlaceholder(i int) string { return "lattice_call_" + strconv.Itoa(i+1) }

// ComposedCall is one lattice_* call of a composed statement.
type ComposedCall struct {
	Call *FuncCall // name and arguments (constants or $n)
	// From marks a FROM item, replaced by the rows; otherwise the call is a
	// value in an expression, replaced by its one value.
	From bool
	// FROM only: the alias ("" when none: the relation is then named after
	// the function, as in PostgreSQL), the column aliases, and WITH
	// ORDINALITY.
	Alias      string
	Columns    []string
	Ordinality bool
}

// ComposePlan is the rest of a composed statement around its calls.
type ComposePlan struct {
	Calls []ComposedCall
	// Params is the statement's highest $n: the proxy's own parameters of
	// the final statement are numbered after it.
	Params int
	pieces []string // the deparsed statement around the holes
	holes  []int    // the call in each hole
}

// Render is the final statement, with place(i) in the place of call i.
func (c *ComposePlan) Render(place func(call int) string) string {
	var b strings.Builder
	b.WriteString(c.pieces[0])
	for i, h := range c.holes {
		b.WriteString(place(h))
		b.WriteString(c.pieces[i+1])
	}
	return b.String()
}

// FuncNames are the called functions, in order, for messages.
func (c *ComposePlan) FuncNames() []string {
	out := make([]string, len(c.Calls))
	for i, cc := range c.Calls {
		out[i] = cc.Call.Name
	}
	return out
}

// String describes the plan for golden files: each call, then the final
// statement with each call's place marked.
func (c *ComposePlan) String() string {
	var b strings.Builder
	for i, cc := range c.Calls {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(cc.Call.String())
		if !cc.From {
			b.WriteString(" value")
			continue
		}
		if cc.Ordinality {
			b.WriteString(" WITH ORDINALITY")
		}
		if cc.Alias != "" {
			b.WriteString(" AS " + quoteIdent(cc.Alias))
		}
		if len(cc.Columns) > 0 {
			b.WriteString("(" + strings.Join(cc.Columns, ", ") + ")")
		}
	}
	fmt.Fprintf(&b, " params=%d final: ", c.Params)
	b.WriteString(c.Render(func(i int) string { return "<" + c.Calls[i].Call.Name + " " + strconv.Itoa(i+1) + ">" }))
	return b.String()
}

// latticeName is the function name of a lattice_* call, for messages.
func latticeName(fc *pg.FuncCall) string {
	return fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval()
}

// composeRoute plans a statement that calls lattice_* functions other
// than in the plain forms.
func (p *planner) composeRoute(root proto.Message, w *walker, stmt string) route {
	first := latticeName(w.lattice[0])
	sel, ok := root.(*pg.SelectStmt)
	if !ok {
		return refusedRoute(refused("Read the rows with SELECT ... FROM "+first+"(...) and write them with a statement of their own.",
			"%s cannot call %s: lattice functions compose only into a SELECT", stmt, first))
	}
	if sel.IntoClause != nil {
		return refusedRoute(refused("Read the rows with SELECT ... FROM "+first+"(...) and write them with a statement of their own.",
			"SELECT INTO cannot call %s", first))
	}
	for _, fc := range w.lattice {
		name := latticeName(fc)
		call, callOK := latticeCall(fc)
		if _, ok := composable[name]; ok && !(callOK && repairs(call)) {
			continue
		}
		if changing[name] {
			if !callOK {
				return refusedRoute(argsRefusal(name))
			}
			return refusedRoute(refused("Call it in a statement of its own: SELECT "+name+"(...) or SELECT * FROM "+name+"(...); then read lattice_reshard_status or lattice_shards, which compose.",
				"%s changes the cluster and runs only in a statement of its own, not as part of a larger SELECT", name))
		}
		return refusedRoute(&sqlstate.Error{Code: sqlstate.UndefinedFunction, Message: fmt.Sprintf("function %s does not exist", name),
			Hint: "Lattice provides lattice_create_tree, lattice_trees, lattice_shards, lattice_reshard, lattice_reshard_complete, lattice_reshard_status, lattice_move_shard, lattice_rebalance, lattice_rebalance_status, lattice_rebalance_complete, lattice_drain_node and lattice_drain_complete"})
	}
	if len(w.lattice) > maxComposedCalls {
		return refusedRoute(refused("Split the statement.", "a statement may call lattice functions at most %d times", maxComposedCalls))
	}
	other := false
	for _, r := range w.rels {
		if r.cte {
			continue
		}
		if t, _ := p.lookup(r.rv); t != nil {
			return refusedRoute(refused("Read "+first+"(...) and tree "+qn(t.Name)+" in separate statements, and combine the rows in the application.",
				"a statement cannot both call %s and read tree %s: the function's rows are evaluated in the proxy and the tree's rows live on its shards", first, qn(t.Name)))
		}
		other = true
	}

	s := proto.Clone(sel).(*pg.SelectStmt)
	var calls []ComposedCall
	var bad *sqlstate.Error
	var rw func(n *pg.Node) *pg.Node
	rw = func(n *pg.Node) *pg.Node {
		if bad != nil || n == nil {
			return n
		}
		switch v := n.Node.(type) {
		case *pg.Node_SelectStmt:
			bad = nameSelect(v.SelectStmt)
		case *pg.Node_RangeFunction:
			if c, ok, err := fromCall(v.RangeFunction); err != nil {
				bad = err
				return n
			} else if ok {
				calls = append(calls, c)
				return &pg.Node{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Relname: callPlaceholder(len(calls) - 1), Inh: true, Relpersistence: "p"}}}
			}
		case *pg.Node_FuncCall:
			if isLatticeName(v.FuncCall.Funcname) {
				c, ok := latticeCall(v.FuncCall)
				if !ok {
					bad = argsRefusal(latticeName(v.FuncCall))
					return n
				}
				if !composable[c.Name] {
					bad = refused("Read it in FROM: SELECT ... FROM "+c.Name+"(...).",
						"%s returns rows of several columns: it composes as a FROM item, not as a value", c.Name)
					return n
				}
				calls = append(calls, ComposedCall{Call: c})
				return columnNode(callPlaceholder(len(calls) - 1))
			}
		}
		rewriteChildren(n.ProtoReflect(), rw)
		return n
	}
	if bad = nameSelect(s); bad == nil {
		rewriteChildren(s.ProtoReflect(), rw)
	}
	if bad != nil {
		return refusedRoute(bad)
	}
	text, err := deparseStmt(s)
	if err != nil {
		return refusedRoute(refused("Simplify the statement around "+first+"(...).", "cannot rewrite this statement around %s: %v", first, err))
	}
	pieces, holes, ok := callPieces(text, len(calls))
	if !ok {
		return refusedRoute(refused("Rename it.", "the statement uses a name of the form lattice_call_N, which the proxy reserves"))
	}
	cp := &ComposePlan{Calls: calls, pieces: pieces, holes: holes}
	if ps := paramNumbers(sel); len(ps) > 0 {
		cp.Params = ps[len(ps)-1]
	}
	notify := false
	for _, f := range functionNames([]*pg.Node{{Node: &pg.Node_SelectStmt{SelectStmt: sel}}}) {
		notify = notify || f == "pg_notify"
	}
	// A statement that names no relation runs wherever the session's
	// transaction is, as a Catalog read naming none does.
	return route{kind: Function, comp: cp, notify: notify, anywhere: !other && !notify}
}

// argsRefusal is the error of a lattice call whose arguments the proxy
// cannot evaluate.
func argsRefusal(name string) *sqlstate.Error {
	return refused("Call it by name (or public."+name+") with constants or $n parameters, e.g. "+name+"('catalogue') or "+name+"($1); read other values in a statement of their own.",
		"%s must be called by name with constant or $n arguments: the proxy evaluates the call before PostgreSQL runs the rest of the statement", name)
}

// fromCall reads a FROM item that is a call of a lattice function; ok is
// false when the item calls none (a lattice call in its arguments is then
// a value).
func fromCall(rf *pg.RangeFunction) (ComposedCall, bool, *sqlstate.Error) {
	var fc *pg.FuncCall
	for _, item := range rf.Functions {
		if l := item.GetList(); l != nil && len(l.Items) > 0 {
			if f := l.Items[0].GetFuncCall(); f != nil && isLatticeName(f.Funcname) {
				fc = f
			}
		}
	}
	if fc == nil {
		return ComposedCall{}, false, nil
	}
	name := latticeName(fc)
	hint := "Call it as a FROM item of its own: SELECT ... FROM " + name + "(...) [WITH ORDINALITY] [AS alias [(columns)]]."
	if rf.IsRowsfrom || len(rf.Functions) != 1 {
		return ComposedCall{}, false, refused(hint, "ROWS FROM with %s is not supported", name)
	}
	l := rf.Functions[0].GetList()
	if len(rf.Coldeflist) > 0 || len(l.Items) > 1 && l.Items[1].GetList() != nil && len(l.Items[1].GetList().Items) > 0 {
		return ComposedCall{}, false, refused(hint, "%s returns known columns: a column definition list is not accepted", name)
	}
	call, ok := latticeCall(fc)
	if !ok {
		return ComposedCall{}, false, argsRefusal(name)
	}
	c := ComposedCall{Call: call, From: true, Ordinality: rf.Ordinality}
	if a := rf.Alias; a != nil {
		c.Alias = a.Aliasname
		for _, n := range a.Colnames {
			c.Columns = append(c.Columns, n.GetString_().GetSval())
		}
	}
	return c, true, nil
}

// nameSelect names the columns of a SELECT (of its arms: the first names
// a set operation's columns, the others may be a CTE's recursive term).
func nameSelect(s *pg.SelectStmt) *sqlstate.Error {
	if s == nil {
		return nil
	}
	if s.Op != pg.SetOperation_SETOP_NONE {
		if err := nameSelect(s.Larg); err != nil {
			return err
		}
		return nameSelect(s.Rarg)
	}
	return nameTargets(s.TargetList)
}

// nameTargets names each unnamed select-list entry that calls a lattice
// function as PostgreSQL would have named it, since the value that takes
// the call's place would give it another name.
func nameTargets(list []*pg.Node) *sqlstate.Error {
	for _, n := range list {
		rt := n.GetResTarget()
		if rt == nil || rt.Name != "" || rt.Val == nil {
			continue
		}
		fc := valueCall(rt.Val.ProtoReflect())
		if fc == nil {
			continue
		}
		name, ok := figureName(rt.Val)
		if !ok {
			return refused("Name the column: ... AS name.", "cannot tell the column name PostgreSQL would give this expression around %s", latticeName(fc))
		}
		rt.Name = name
	}
	return nil
}

// valueCall finds a lattice call that is a value in this expression, not
// in a subquery (whose own select list is named in its turn).
func valueCall(m protoreflect.Message) *pg.FuncCall {
	switch v := m.Interface().(type) {
	case *pg.FuncCall:
		if isLatticeName(v.Funcname) {
			return v
		}
	case *pg.SelectStmt:
		return nil
	}
	var found *pg.FuncCall
	eachChild(m, func(c protoreflect.Message) {
		if found == nil {
			found = valueCall(c)
		}
	})
	return found
}

// callPieces cuts the deparsed statement at each call placeholder; every
// call must appear exactly once.
func callPieces(text string, ncalls int) ([]string, []int, bool) {
	toks, _, ok := scan(text)
	if !ok {
		return nil, nil, false
	}
	var pieces []string
	var holes []int
	seen := make([]bool, ncalls)
	last := 0
	for _, t := range toks {
		if t.kind != pg.Token_IDENT {
			continue
		}
		n, ok := strings.CutPrefix(t.text(text), "lattice_call_")
		if !ok {
			continue
		}
		k, err := strconv.Atoi(n)
		if err != nil || k < 1 || k > ncalls || seen[k-1] {
			return nil, nil, false
		}
		seen[k-1] = true
		pieces = append(pieces, text[last:t.start])
		holes = append(holes, k-1)
		last = int(t.end)
	}
	pieces = append(pieces, text[last:])
	return pieces, holes, len(holes) == ncalls
}
