package btreeindex

import (
	"strconv"
	"strings"
)

// A merge compares sort values in Go, which reproduces PostgreSQL's order
// only for the types and collations Comparable accepts. Text under any
// other collation (en_US, an ICU locale, a nondeterministic one) is ordered
// by PostgreSQL itself: the proxy gathers the nodes' rows and sends their
// sort values to the catalog node, which answers the rows' order. The rows
// stay in the proxy as the nodes sent them (their formats and the
// RowDescription are the nodes'); only the sort values travel.

// MaxSortParams is how many sort values one SortQuery may carry: a Bind
// message holds at most 65535 parameters.
const MaxSortParams = 65535

// SortQuery is the statement that orders rows rows by keys in PostgreSQL.
// collations[i] is the collation of keys[i] as PostgreSQL names it (a
// quoted, possibly schema-qualified identifier from pg_collation_for), or
// "" for a type without one. Its parameters are the rows' sort values, row
// by row and key by key, typed by cols and in their formats; it returns one
// column, each row's 1-based index in rows, in the order PostgreSQL sorts
// them, a tie going to the row that came first (as in the merge, ties go
// to the node listed first).
func SortQuery(keys []SortKey, collations []string, cols []Column, rows int) (sql string, oids []uint32, formats []int16) {
	var b strings.Builder
	b.WriteString("SELECT lattice_i FROM (VALUES ")
	oids = make([]uint32, 0, rows*len(keys))
	formats = make([]int16, 0, rows*len(keys))
	n := 0
	for r := range rows {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for _, k := range keys {
			n++
			b.WriteString("$" + strconv.Itoa(n) + ", ")
			oids = append(oids, cols[k.Column].OID)
			formats = append(formats, cols[k.Column].Format)
		}
		b.WriteString(strconv.Itoa(r+1) + ")")
	}
	b.WriteString(") AS lattice_v(")
	for i := range keys {
		b.WriteString("lattice_k" + strconv.Itoa(i+1) + ", ")
	}
	b.WriteString("lattice_i) ORDER BY ")
	for i, k := range keys {
		b.WriteString("lattice_k" + strconv.Itoa(i+1))
		if collations[i] != "" {
			b.WriteString(" COLLATE " + collations[i])
		}
		b.WriteString(" " + k.Order() + ", ")
	}
	b.WriteString("lattice_i")
	return b.String(), oids, formats
}

// SortValues are the parameters of SortQuery for rows: each row's sort
// values in key order.
func SortValues(keys []SortKey, rows [][][]byte) [][]byte {
	out := make([][]byte, 0, len(rows)*len(keys))
	for _, row := range rows {
		for _, k := range keys {
			out = append(out, row[k.Column])
		}
	}
	return out
}

// ValidCollation reports whether name is a collation name as
// pg_collation_for writes it, so that it can be written into SQL as is: one
// or two double-quoted or lower-case identifiers joined by a dot.
func ValidCollation(name string) bool {
	if name == "" || len(name) > 200 {
		return false
	}
	part := func(s string) (rest string, ok bool) {
		if strings.HasPrefix(s, `"`) {
			for i := 1; i < len(s); i++ {
				if s[i] != '"' {
					continue
				}
				if i+1 < len(s) && s[i+1] == '"' {
					i++
					continue
				}
				return s[i+1:], i > 1
			}
			return "", false
		}
		i := 0
		for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] == '_' || i > 0 && (s[i] >= '0' && s[i] <= '9' || s[i] == '$')) {
			i++
		}
		return s[i:], i > 0
	}
	rest, ok := part(name)
	if ok && strings.HasPrefix(rest, ".") {
		rest, ok = part(rest[1:])
	}
	return ok && rest == ""
}
