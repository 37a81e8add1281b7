package router

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A simple-protocol statement on one shard can run as a statement prepared
// once per backend, its constants bound as parameters. PostgreSQL then
// parses and plans it once per backend and shape, as it does an
// extended-protocol client's statement, instead of for every Query.
//
// Why the prepared statement means what the literal text means: each
// parameter has the type PostgreSQL gives the literal it replaces.
//   - A number becomes a parameter of the literal's own type: int4, int8 or
//     numeric, as the parser's make_const types it. So operators and
//     functions resolve alike. Not where the analyzer reads the constant
//     itself: ORDER BY, GROUP BY and DISTINCT ON (a column number there),
//     and type modifiers. And not 2147483648 or 9223372036854775808, which
//     a folded minus makes a narrower type than the negated parameter.
//   - A string '...' becomes a parameter of unknown type, as the literal
//     is, but only where its type comes from its context alike for both:
//     an operand of a comparison (=, <>, <, >, <=, >=, LIKE, ILIKE, IN,
//     BETWEEN, IS DISTINCT FROM) whose other operand is a column, and a
//     value assigned to a column (UPDATE SET, a one-row INSERT VALUES).
//     Elsewhere an unknown parameter can stay unresolved (concat($1),
//     $1 IS NULL) where a literal is read as text. Only strings without
//     a backslash, whose value does not depend on
//     standard_conforming_strings.
//   - Any other constant (bit strings, E'...', a typed literal date '...')
//     keeps the shape from being prepared.
//
// A shape is prepared only if every constant that may vary becomes a
// parameter, so that all its statements share one backend statement per
// shard. Its text with parameters is parsed once: it must be one statement
// of the same kind with exactly those parameters.
type preparedShape struct {
	toks []int     // token index of the constant each parameter replaces, $1 first
	strs []bool    // whether parameter i is a string
	text string    // the statement with parameters
	rd   *renderer // text cut at the tree's references; nil on the catalog node
	// bySchema is the text with parameters for each shard index, made on
	// first use: one atomic load per statement after that.
	bySchema atomic.Pointer[[]string]
	mu       sync.Mutex
}

// Prepared is a Single plan's statement run as a prepared statement: the
// constants' values, as text, and their types.
type Prepared struct {
	Values []string
	OIDs   []uint32
	shape  *preparedShape
}

// bind reads the parameters of a statement of this shape, scanned as toks,
// into pr; nil when the statement must run as its literal text.
func (ps *preparedShape) bind(pr *Prepared, sql string, toks []token, vals []string, oids []uint32) *Prepared {
	for k, i := range ps.toks {
		v, oid, ok := preparedValue(sql, toks[i], ps.strs[k])
		if !ok {
			return nil
		}
		vals, oids = append(vals, v), append(oids, oid)
	}
	*pr = Prepared{Values: vals, OIDs: oids, shape: ps}
	return pr
}

// The types of parameters that replace literals, with oidInt8 and
// oidNumeric (aggregate.go).
const (
	oidUnknown = 0
	oidInt4    = 23
)

// SQL is the statement with parameters for the shard with index idx (any
// index for a statement on the catalog node).
func (pr *Prepared) SQL(idx int) string {
	ps := pr.shape
	if ps.rd == nil {
		return ps.text
	}
	if all := ps.bySchema.Load(); all != nil && idx < len(*all) && (*all)[idx] != "" {
		return (*all)[idx]
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var all []string
	if cur := ps.bySchema.Load(); cur != nil {
		all = slices.Clone(*cur)
	}
	if idx >= len(all) {
		all = append(all, make([]string, idx+1-len(all))...)
	}
	if all[idx] == "" {
		all[idx] = ps.rd.render(schemaName(idx))
	}
	ps.bySchema.Store(&all)
	return all[idx]
}

// The contexts of a constant, for the rules above.
const (
	ctxFree    = iota // a number may be a parameter, a string not
	ctxOperand        // its type comes from its context: either may
	ctxAssign         // UPDATE's SET list: each value is ctxOperand
	ctxInsert         // INSERT's query: a one-row VALUES list is ctxOperand
	ctxFixed          // read as a constant by the analyzer; inherited
)

// comparisons are the operators under which a string's type comes from the
// column on the other side.
var comparisons = map[string]bool{"=": true, "<>": true, "!=": true, "<": true, ">": true, "<=": true, ">=": true}

// preparedShape returns how statements of template t run prepared, or nil
// when they cannot. free holds the token index of each constant that may
// vary; start and end bound the statement in the template's text.
func (p *planner) preparedShape(stmt *pg.Node, t *shapeTemplate, free map[int]bool, start, end int) *preparedShape {
	if len(free) == 0 || len(free) > 65535 || t.kind != Single && !(t.kind == Catalog && returnsNothing(stmt)) {
		return nil
	}
	switch n := stmt.Node.(type) {
	case *pg.Node_SelectStmt:
		if n.SelectStmt.IntoClause != nil {
			return nil
		}
	case *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt:
	default:
		return nil
	}
	toks := p.tokens()
	for _, tk := range toks {
		if tk.kind == pg.Token_PARAM {
			return nil
		}
	}
	isString := map[int]bool{}
	ok := true
	var visit func(m protoreflect.Message, ctx int)
	visit = func(m protoreflect.Message, ctx int) {
		if !ok {
			return
		}
		switch n := m.Interface().(type) {
		case *pg.A_Const:
			i := p.tokenAt(int(n.Location))
			neg := i >= 0 && toks[i].kind == pg.Token_ASCII_45
			if neg {
				i = nextToken(toks, i)
			}
			if i < 0 || !free[i] {
				return // TRUE, NULL: keywords, not constants
			}
			switch k := toks[i].kind; {
			case ctx == ctxFixed:
				ok = false
			case k == pg.Token_ICONST || k == pg.Token_FCONST:
				isString[i] = false
			case k == pg.Token_SCONST && ctx == ctxOperand && !neg:
				isString[i] = true
			default:
				ok = false
			}
			return
		case *pg.Node, *pg.List:
			// Wrappers: the context is their parent's.
			eachChild(m, func(c protoreflect.Message) { visit(c, ctx) })
			return
		case *pg.SortBy, *pg.TypeName:
			ctx = ctxFixed
		}
		if ctx == ctxFixed {
			eachChild(m, func(c protoreflect.Message) { visit(c, ctxFixed) })
			return
		}
		parent := ctx
		rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
				return true
			}
			c := childContext(m, string(fd.Name()), parent)
			if fd.IsList() {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					visit(l.Get(i).Message(), c)
				}
				return true
			}
			visit(v.Message(), c)
			return true
		})
	}
	visit(stmt.ProtoReflect(), ctxFree)
	if !ok || len(isString) != len(free) {
		return nil
	}

	ps := &preparedShape{}
	for i := range free {
		ps.toks = append(ps.toks, i)
	}
	slices.Sort(ps.toks)
	var b strings.Builder
	at := start
	type shift struct{ at, by int }
	var shifts []shift // where the text grew or shrank, in order
	for n, i := range ps.toks {
		tk := toks[i]
		ps.strs = append(ps.strs, isString[i])
		b.WriteString(p.sql[at:tk.start])
		ph := "$" + strconv.Itoa(n+1)
		if tk.start > 0 && isIdentChar(p.sql[tk.start-1]) {
			ph = " " + ph
		}
		if int(tk.end) < len(p.sql) && isIdentChar(p.sql[tk.end]) {
			ph += " "
		}
		b.WriteString(ph)
		shifts = append(shifts, shift{int(tk.end), len(ph) - int(tk.end-tk.start)})
		at = int(tk.end)
	}
	b.WriteString(p.sql[at:end])
	text := b.String()
	moved := func(pos int) int {
		out := pos - start
		for _, s := range shifts {
			if s.at <= pos {
				out += s.by
			}
		}
		return out
	}
	spans := make([]span, 0, len(t.refs))
	for _, r := range t.refs {
		spans = append(spans, span{moved(int(toks[r[0]].start)), moved(int(toks[r[1]].end))})
	}
	ps.text = text
	if t.kind == Single {
		q := &planner{sql: text}
		ps.rd = new(renderer)
		if q.fillRenderer(ps.rd, t.tree, spans, 0, len(text)) != nil {
			return nil
		}
	}
	if !sameStatement(stmt, text, len(ps.toks)) {
		return nil
	}
	return ps
}

// returnsNothing reports an INSERT, UPDATE or DELETE without RETURNING. A
// statement on the catalog node runs prepared only then: its tables may
// change under it by DDL that no proxy sees (run on the node itself), and
// PostgreSQL refuses a prepared statement whose result columns changed
// (0A000), where the text would run. A statement without a result has no
// columns to change.
func returnsNothing(stmt *pg.Node) bool {
	switch n := stmt.Node.(type) {
	case *pg.Node_InsertStmt:
		return len(n.InsertStmt.ReturningList) == 0
	case *pg.Node_UpdateStmt:
		return len(n.UpdateStmt.ReturningList) == 0
	case *pg.Node_DeleteStmt:
		return len(n.DeleteStmt.ReturningList) == 0
	}
	return false
}

// childContext is the context of the constants in field name of m, a node
// in context ctx.
func childContext(m protoreflect.Message, name string, ctx int) int {
	switch n := m.Interface().(type) {
	case *pg.SelectStmt:
		switch name {
		case "group_clause", "distinct_clause":
			return ctxFixed
		case "values_lists":
			if ctx == ctxInsert && len(n.ValuesLists) == 1 {
				return ctxOperand
			}
		}
	case *pg.InsertStmt:
		if name == "select_stmt" {
			return ctxInsert
		}
	case *pg.UpdateStmt:
		if name == "target_list" {
			return ctxAssign
		}
	case *pg.ResTarget:
		if name == "val" && ctx == ctxAssign {
			return ctxOperand
		}
	case *pg.A_Expr:
		if (name == "lexpr" || name == "rexpr") && comparesWithColumn(n, name) {
			return ctxOperand
		}
	}
	return ctxFree
}

// comparesWithColumn reports whether e compares its operand side with a
// column on the other side.
func comparesWithColumn(e *pg.A_Expr, side string) bool {
	switch e.Kind {
	case pg.A_Expr_Kind_AEXPR_OP:
		if len(e.Name) != 1 || !comparisons[e.Name[0].GetString_().GetSval()] {
			return false
		}
	case pg.A_Expr_Kind_AEXPR_LIKE, pg.A_Expr_Kind_AEXPR_ILIKE, pg.A_Expr_Kind_AEXPR_DISTINCT, pg.A_Expr_Kind_AEXPR_NOT_DISTINCT:
	case pg.A_Expr_Kind_AEXPR_IN, pg.A_Expr_Kind_AEXPR_BETWEEN, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN:
		if side != "rexpr" {
			return false
		}
	default:
		return false
	}
	other := e.Rexpr
	if side == "rexpr" {
		other = e.Lexpr
	}
	return other.GetColumnRef() != nil
}

// sameStatement reports whether text parses as one statement of stmt's
// kind with n parameters.
func sameStatement(stmt *pg.Node, text string, n int) bool {
	res, err := pg.Parse(text)
	if err != nil || len(res.Stmts) != 1 {
		return false
	}
	got := res.Stmts[0].Stmt
	if reflect.TypeOf(got.Node) != reflect.TypeOf(stmt.Node) {
		return false
	}
	params := map[int32]bool{}
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if r, ok := m.Interface().(*pg.ParamRef); ok {
			params[r.Number] = true
		}
		eachChild(m, visit)
	}
	visit(got.ProtoReflect())
	if len(params) != n {
		return false
	}
	for i := 1; i <= n; i++ {
		if !params[int32(i)] {
			return false
		}
	}
	return true
}

// preparedValue is the parameter that replaces constant token tk of a new
// statement: its text and type. It reports false when this statement must
// run as its literal text.
func preparedValue(sql string, tk token, str bool) (string, uint32, bool) {
	text := sql[tk.start:tk.end]
	if str {
		if tk.kind != pg.Token_SCONST || strings.IndexByte(text, '\\') >= 0 {
			return "", 0, false
		}
		c, ok := tokenConstant(sql, tk, false)
		return c.text, oidUnknown, ok
	}
	switch tk.kind {
	case pg.Token_ICONST:
		if allDigits(text) {
			return text, oidInt4, true
		}
	case pg.Token_FCONST:
		if text == "2147483648" || text == "9223372036854775808" {
			return "", 0, false
		}
		if allDigits(text) {
			if _, err := strconv.ParseInt(text, 10, 64); err == nil {
				return text, oidInt8, true
			}
			return text, oidNumeric, true
		}
		if decimalNumber(text) {
			return text, oidNumeric, true
		}
	}
	return "", 0, false
}

// decimalNumber reports whether s is digits with a decimal point or an
// exponent, as PostgreSQL reads into numeric.
func decimalNumber(s string) bool {
	digits, i := 0, 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		digits++
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			digits++
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i == len(s) || !allDigits(s[i:]) {
			return false
		}
		i = len(s)
	}
	return i == len(s)
}
