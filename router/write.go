package router

import (
	"sort"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/sqlstate"
)

// writeRenderer holds an UPDATE or DELETE over every shard cut at each
// reference to the tree and at the places where a filter on the target's
// rows goes: around the WHERE condition, or where a WHERE clause would
// stand. A mixed shard holds rows of slots it does not own (a fold
// survivor's copies of the donor's rows, a split source's moved rows); a
// write there must reach only the rows of its own slots, or its command tag
// and RETURNING count the others too.
type writeRenderer struct {
	texts []string // texts[0] holes[0] texts[1] ... texts[n]
	holes []hole
	qname string // the tree name, quoted
	alias string // the target's alias, quoted; "" when it has none
	// refs are, for a write over several tree references, the reference
	// of each holeRef in order, and target the index of the written one:
	// the others are read, on a mixed shard through their own filter.
	refs   []refHole
	target int
}

type hole uint8

const (
	holeRef   hole = iota // schema.tree
	holeOpen              // "(" before the WHERE condition
	holeClose             // ") AND (filter)" after it
	holeWhere             // " WHERE filter", for a statement without WHERE
)

// RenderFiltered returns, for a WriteAll plan, the statement on the shard
// of schema restricted to the rows for which filter holds: the WHERE
// condition c becomes (c) AND (filter), and a statement without WHERE gets
// WHERE filter. filter receives the qualifier that names the target table
// in the statement (its alias, or schema.tree), for its column references.
// It panics on a plan of another kind.
func (p *Plan) RenderFiltered(schema string, filter func(qualifier string) string) string {
	if p.write == nil {
		panic("router: RenderFiltered on a " + p.Kind.String() + " plan")
	}
	w := p.write
	q := quoteIdent(schema) + "." + w.qname
	qual := w.alias
	if qual == "" {
		qual = q
	}
	f := filter(qual)
	var b strings.Builder
	ref, paren := 0, false
	for i, t := range w.texts {
		if i > 0 && w.holes[i-1] == holeRef && w.readRef(ref-1) {
			t = trimInheritance(t, paren)
		}
		if i == len(w.holes) {
			b.WriteString(t)
			break
		}
		switch w.holes[i] {
		case holeRef:
			if !w.readRef(ref) {
				b.WriteString(t)
				if w.refs == nil || ref == w.target {
					b.WriteString(q)
				} else {
					b.WriteString(w.refs[ref].qname) // public.tree.col: the tree's name in scope
				}
				ref++
				break
			}
			// A read reference: the shard's rows of its slots, under its
			// own name unless it has an alias.
			h := w.refs[ref]
			t, paren = trimOnly(t)
			b.WriteString(t)
			b.WriteString(sourceFrom(btreeindex.Source{Schema: schema, Filter: memberFilter(filter(""), p.Tree, h.tree)}, h.qname))
			if !h.aliased {
				b.WriteString(" AS " + h.qname)
			}
			ref++
		case holeOpen:
			b.WriteString(t)
			b.WriteString("(")
		case holeClose:
			b.WriteString(t)
			b.WriteString(") AND (" + f + ")")
		case holeWhere:
			b.WriteString(t)
			b.WriteString(" WHERE " + f)
		}
	}
	return b.String()
}

// readRef reports whether holeRef number i of a write over several
// references is a FROM item read rather than written.
func (w *writeRenderer) readRef(i int) bool {
	return w.refs != nil && i != w.target && w.refs[i].rel
}

// writeRenderer cuts the UPDATE or DELETE in sql[start:end] at the
// references to the tree (refs) and at its WHERE condition: the condition
// runs from the first token after the top-level WHERE to the last token
// before the top-level RETURNING, or to the statement's last token. Cuts
// are at token boundaries, so a comment at the end of the statement never
// swallows the filter. Nested WHERE and RETURNING keywords (subqueries,
// CTEs) are inside parentheses.
func (p *planner) writeRenderer(r route, refs []span, start, end int, where bool) (*writeRenderer, *sqlstate.Error) {
	toks := p.tokens()
	whereTok, condStart, last := -1, -1, -1
	depth := 0
	for i, t := range toks {
		if int(t.start) < start || isComment(t) {
			continue
		}
		if int(t.end) > end {
			break
		}
		if depth == 0 && t.kind == pg.Token_RETURNING {
			break
		}
		switch t.kind {
		case pg.Token_ASCII_40:
			depth++
		case pg.Token_ASCII_41:
			depth--
		}
		if depth == 0 && t.kind == pg.Token_WHERE && whereTok < 0 {
			whereTok = i
		} else if whereTok >= 0 && condStart < 0 {
			condStart = int(t.start)
		}
		last = i
	}
	if last < 0 || whereTok >= 0 && condStart < 0 {
		return nil, internalError(r.tree.Name)
	}
	condEnd := int(toks[last].end)

	type cut struct {
		at, end int // the span replaced: at == end for an insertion
		h       hole
	}
	var cuts []cut
	for _, s := range refs {
		cuts = append(cuts, cut{s.start, s.end, holeRef})
	}
	switch {
	case !where:
		// An INSERT ... SELECT: its rows' keys come from read references,
		// each filtered on a mixed shard.
	case whereTok >= 0:
		cuts = append(cuts, cut{condStart, condStart, holeOpen}, cut{condEnd, condEnd, holeClose})
	default:
		cuts = append(cuts, cut{condEnd, condEnd, holeWhere})
	}
	// An insertion at the start of a reference goes before it.
	sort.SliceStable(cuts, func(i, j int) bool {
		if cuts[i].at != cuts[j].at {
			return cuts[i].at < cuts[j].at
		}
		return cuts[i].h != holeRef && cuts[j].h == holeRef
	})
	w := &writeRenderer{qname: quoteIdent(r.tree.Name)}
	if r.rv.Alias != nil {
		w.alias = quoteIdent(r.rv.Alias.Aliasname)
	}
	at, after := start, ""
	for _, c := range cuts {
		if c.at < at || c.end > end {
			return nil, internalError(r.tree.Name)
		}
		before, a := "", ""
		if c.h == holeRef {
			before, a = p.pad(span{c.at, c.end})
		}
		w.texts = append(w.texts, after+p.sql[at:c.at]+before)
		w.holes = append(w.holes, c.h)
		at, after = c.end, a
	}
	w.texts = append(w.texts, after+p.sql[at:end])
	return w, nil
}
