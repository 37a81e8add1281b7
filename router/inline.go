package router

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A statement refused as written whose CTE reads a tree is planned
// again with the CTE as the derived table PostgreSQL
// itself makes of it: a non-recursive, read-only CTE referenced once, not
// MATERIALIZED and calling nothing volatile, is inlined by PostgreSQL's
// planner at its reference, so writing it there as (query) AS name does
// not change the statement's meaning. The colocation analysis then plans
// it as it plans derived tables (colocate.go). The router renders shard
// statements from the text the client sent, so the inlining is done on
// that text, one CTE at a time, and the new text is planned in its place;
// a statement that runs as written (a CTE pinned to a key) is sent as
// written.
//
// Left as written: a CTE referenced twice or never (PostgreSQL evaluates
// it once), MATERIALIZED, of WITH RECURSIVE, writing, calling a function
// whose value differs per node or per call (perNodeCall: random(), now(),
// nextval() ...), naming a relation by the name of a CTE of the statement
// (at its reference that name could mean another CTE), a statement that
// locks rows (FOR UPDATE ignores a CTE but not a derived table), and CTEs
// that read no tree, which need no inlining to be planned.

// cteUse is a CTE in scope and the relation references bound to it.
type cteUse struct {
	with *pg.WithClause
	cte  *pg.CommonTableExpr
	refs []*pg.RangeVar
}

// cteScan binds every unqualified relation name of a statement to the CTE
// it names, following PostgreSQL's scoping: a non-recursive CTE is seen by
// the later CTEs of its list and by its statement, an inner WITH hides an
// outer CTE of the same name.
type cteScan struct {
	uses  []*cteUse
	scope []*cteUse
	names map[string]bool // every CTE's name
	locks bool            // FOR UPDATE/SHARE somewhere
}

func (s *cteScan) msg(m protoreflect.Message) {
	switch v := m.Interface().(type) {
	case *pg.RangeVar:
		if v.Schemaname == "" && v.Catalogname == "" {
			for i := len(s.scope) - 1; i >= 0; i-- {
				if s.scope[i].cte.Ctename == v.Relname {
					s.scope[i].refs = append(s.scope[i].refs, v)
					return
				}
			}
		}
		return
	case *pg.LockingClause:
		s.locks = true
		return
	case interface{ GetWithClause() *pg.WithClause }: // SELECT, INSERT, UPDATE, DELETE, MERGE
		s.stmt(m, v.GetWithClause())
		return
	}
	eachChild(m, s.msg)
}

// stmt walks a statement: its WITH list, then the rest; the target of a
// write names a table, never a CTE.
func (s *cteScan) stmt(m protoreflect.Message, with *pg.WithClause) {
	base := len(s.scope)
	if with != nil {
		var mine []*cteUse
		for _, c := range with.Ctes {
			if cte := c.GetCommonTableExpr(); cte != nil {
				u := &cteUse{with: with, cte: cte}
				s.names[cte.Ctename] = true
				mine = append(mine, u)
				s.uses = append(s.uses, u)
			}
		}
		if with.Recursive {
			s.scope = append(s.scope, mine...)
		}
		for _, u := range mine {
			if u.cte.Ctequery != nil {
				s.msg(u.cte.Ctequery.ProtoReflect())
			}
			if !with.Recursive {
				s.scope = append(s.scope, u)
			}
		}
	}
	rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || fd.Name() == "with_clause" || fd.Name() == "relation" {
			return true
		}
		if fd.IsList() {
			for i := 0; i < v.List().Len(); i++ {
				s.msg(v.List().Get(i).Message())
			}
			return true
		}
		s.msg(v.Message())
		return true
	})
	s.scope = s.scope[:base]
}

// inlinable is the first CTE of n to inline, or nil.
func (p *planner) inlinable(n *pg.Node) *cteUse {
	switch q := n.Node.(type) {
	case *pg.Node_ExplainStmt:
		return p.inlinable(q.ExplainStmt.Query)
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt:
	default:
		return nil
	}
	s := &cteScan{names: map[string]bool{}}
	s.msg(n.ProtoReflect())
	if s.locks {
		return nil
	}
	for _, u := range s.uses {
		if u.with.Recursive || len(u.refs) != 1 || !u.refs[0].Inh || u.cte.Ctematerialized == pg.CTEMaterialize_CTEMaterializeAlways ||
			u.cte.Ctequery.GetSelectStmt() == nil || perNodeCall(u.cte.Ctequery) != "" ||
			!p.readsTree(u.cte.Ctequery, nil) || namesOneOf(u.cte.Ctequery, s.names) {
			continue
		}
		return u
	}
	return nil
}

// namesOneOf reports whether n names a relation, unqualified, by one of
// names.
func namesOneOf(n *pg.Node, names map[string]bool) bool {
	found := false
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if rv, ok := m.Interface().(*pg.RangeVar); ok {
			found = found || rv.Schemaname == "" && rv.Catalogname == "" && names[rv.Relname]
			return
		}
		if !found {
			eachChild(m, visit)
		}
	}
	visit(n.ProtoReflect())
	return found
}

// edit replaces sql[start:end] with text.
type edit struct {
	start, end int
	text       string
}

// inline returns the text of the statement sql[start:end] with u written
// as a derived table at its reference and left out of its WITH list; false
// when the tokens do not read as the parse tree says.
func (p *planner) inline(u *cteUse, start, end int) (string, bool) {
	toks := p.tokens()
	// Each CTE of the list spans from its name to its query's ')'.
	spans := make([]span, len(u.with.Ctes))
	self := -1
	var body span
	for k, c := range u.with.Ctes {
		cte := c.GetCommonTableExpr()
		i := p.tokenAt(int(cte.Location))
		if i < 0 {
			return "", false
		}
		if cte == u.cte {
			self = k
		}
		// name [(columns)] AS [[NOT] MATERIALIZED] (query)
		j := nextToken(toks, i)
		if j >= 0 && toks[j].kind == pg.Token_ASCII_40 && len(cte.Aliascolnames) > 0 {
			j = nextToken(toks, closingParen(toks, j))
		}
		for j >= 0 && toks[j].kind != pg.Token_ASCII_40 {
			j = nextToken(toks, j)
		}
		if j < 0 {
			return "", false
		}
		close := closingParen(toks, j)
		if close < 0 {
			return "", false
		}
		spans[k] = span{int(toks[i].start), int(toks[close].end)}
		if cte == u.cte {
			body = span{int(toks[j].start), int(toks[close].end)}
		}
	}
	if self < 0 {
		return "", false
	}
	var drop edit
	switch {
	case len(spans) == 1:
		at := spans[0].end
		for at < end && isSpace(p.sql[at]) {
			at++
		}
		drop = edit{start: int(u.with.Location), end: at}
	case self < len(spans)-1:
		drop = edit{start: spans[self].start, end: spans[self+1].start}
	default:
		drop = edit{start: spans[self-1].end, end: spans[self].end}
	}
	if i := p.tokenAt(drop.start); i < 0 || len(spans) == 1 && toks[i].kind != pg.Token_WITH {
		return "", false
	}

	ref, ok := p.refSpan(u.refs[0])
	if !ok {
		return "", false
	}
	alias := u.cte.Ctename
	var cols []string
	if a := u.refs[0].Alias; a != nil {
		alias = a.Aliasname
		for _, c := range a.Colnames {
			cols = append(cols, quoteIdent(c.GetString_().GetSval()))
		}
	}
	// A reference's own column names come first; the CTE's name the rest.
	for _, c := range u.cte.Aliascolnames[min(len(cols), len(u.cte.Aliascolnames)):] {
		cols = append(cols, quoteIdent(c.GetString_().GetSval()))
	}
	text := p.sql[body.start:body.end] + " AS " + quoteIdent(alias)
	if len(cols) > 0 {
		text += "(" + strings.Join(cols, ", ") + ")"
	}
	put := edit{start: ref.start, end: ref.end, text: text}

	first, second := drop, put
	if put.start < drop.start {
		first, second = put, drop
	}
	if first.end > second.start || first.start < start || second.end > end {
		return "", false
	}
	return p.sql[start:first.start] + first.text + p.sql[first.end:second.start] + second.text + p.sql[second.end:end], true
}

// refSpan is the span of a CTE reference in FROM: its name and its alias
// with its column names.
func (p *planner) refSpan(rv *pg.RangeVar) (span, bool) {
	toks := p.tokens()
	i := p.tokenAt(int(rv.Location))
	if i < 0 {
		return span{}, false
	}
	if id, ok := identText(toks[i].text(p.sql)); !ok || id != rv.Relname {
		return span{}, false
	}
	last := i
	if a := rv.Alias; a != nil {
		j := nextToken(toks, last)
		if j >= 0 && toks[j].kind == pg.Token_AS {
			j = nextToken(toks, j)
		}
		if j < 0 {
			return span{}, false
		}
		if id, ok := identText(toks[j].text(p.sql)); !ok || id != a.Aliasname {
			return span{}, false
		}
		last = j
		if len(a.Colnames) > 0 {
			j = nextToken(toks, last)
			if j < 0 || toks[j].kind != pg.Token_ASCII_40 {
				return span{}, false
			}
			if last = closingParen(toks, j); last < 0 {
				return span{}, false
			}
		}
	}
	return span{int(toks[i].start), int(toks[last].end)}, true
}

// planInlined plans the statement sql[start:end] with its first inlinable
// CTE inlined; nil when it has none.
func (p *planner) planInlined(n *pg.Node, start, end int) *Plan {
	u := p.inlinable(n)
	if u == nil {
		return nil
	}
	text, ok := p.inline(u, start, end)
	if !ok {
		return nil
	}
	res, err := pg.Parse(text)
	if err != nil || len(res.Stmts) != 1 {
		return nil
	}
	q := &planner{sql: text, trees: p.trees}
	pl := q.plan(res.Stmts[0].Stmt, 0, len(text))
	// Its spans are in the new text: no shape template is made of them.
	pl.SQL, pl.src = p.sql[start:end], nil
	return pl
}
