package router

import (
	"strings"

	"github.com/lattice-db/lattice/btreeindex"
)

// sourceFrom is the FROM item that reads src as the table tree (quoted):
// the table itself, or the filtered rows of it under the table's own name.
func sourceFrom(src btreeindex.Source, qtree string) string {
	t := quoteIdent(src.Schema) + "." + qtree
	if src.Filter == "" {
		return t
	}
	return "(SELECT * FROM " + t + " WHERE " + src.Filter + ")"
}

// renderSource renders the fan-out branch for src. Without a filter it is
// render. With one, the tree's reference in FROM becomes a subquery over
// the filtered rows that keeps the reference's alias, or takes the tree's
// name when there is none, and the public.tree part of public.tree.col
// references becomes that name; such references occur only without an
// alias, as PostgreSQL requires.
func (r *renderer) renderSource(src btreeindex.Source) string {
	if r.multi != nil {
		return r.renderSources(src)
	}
	if src.Filter == "" || r.rel < 0 {
		return r.render(src.Schema)
	}
	var b strings.Builder
	paren := false
	for i, t := range r.texts {
		if i == 0 && r.table >= 0 && r.rel == 0 {
			t = t[:r.table] + "SELECT * FROM" + t[r.table+len("TABLE"):]
		}
		// ONLY t, ONLY (t) and t* cannot stand around the subquery that
		// replaces the table; a shard table has no children, so they mean
		// nothing there.
		if i == r.rel {
			t, paren = trimOnly(t)
		}
		if i == r.rel+1 {
			t = trimInheritance(t, paren)
		}
		b.WriteString(t)
		switch {
		case i == len(r.texts)-1:
		case i == r.rel:
			b.WriteString(sourceFrom(src, r.qname))
			if !r.aliased {
				b.WriteString(" AS " + r.qname)
			}
		default:
			b.WriteString(r.qname)
		}
	}
	return b.String()
}

// trimOnly drops an ONLY keyword, or "ONLY (", that ends text, and says
// whether it dropped a parenthesis.
func trimOnly(text string) (string, bool) {
	t := strings.TrimRight(text, spaces)
	paren := strings.HasSuffix(t, "(")
	if paren {
		t = strings.TrimRight(t[:len(t)-1], spaces)
	}
	n := len(t) - len("ONLY")
	if n < 0 || !strings.EqualFold(t[n:], "ONLY") {
		return text, false
	}
	if n > 0 {
		if c := t[n-1]; c == '_' || c == '$' || c == '"' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 {
			return text, false // the end of a longer name, such as "monly"
		}
	}
	return t[:n] + " ", paren
}

// trimInheritance drops what follows the table of an ONLY (t), or the *
// of t*, from the start of text.
func trimInheritance(text string, paren bool) string {
	t := strings.TrimLeft(text, spaces)
	if paren && strings.HasPrefix(t, ")") {
		return " " + t[1:]
	}
	if !paren && strings.HasPrefix(t, "*") {
		return " " + t[1:]
	}
	return text
}

const spaces = " \t\r\n\f"

// renderSources is renderSource for a statement over several tree
// references: each FROM item reads the shard, through the filter of its
// own tree's key when the shard is mixed (the trees of a group share one
// map, so the slots are the same and only the key column differs).
func (r *renderer) renderSources(src btreeindex.Source) string {
	if src.Filter == "" {
		return r.render(src.Schema)
	}
	base := r.base
	var b strings.Builder
	paren := false
	for i, t := range r.texts {
		if i > 0 && r.multi[i-1].rel {
			t = trimInheritance(t, paren)
		}
		if i == len(r.multi) {
			b.WriteString(t)
			break
		}
		h := r.multi[i]
		if !h.rel {
			b.WriteString(t)
			b.WriteString(h.qname)
			continue
		}
		t, paren = trimOnly(t)
		b.WriteString(t)
		f := memberFilter(src.Filter, base, h.tree)
		b.WriteString(sourceFrom(btreeindex.Source{Schema: src.Schema, Filter: f}, h.qname))
		if !h.aliased {
			b.WriteString(" AS " + h.qname)
		}
	}
	return b.String()
}
