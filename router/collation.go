package router

import (
	"fmt"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Text sorts by its collation, which the statement's text alone does not
// tell: a column's declared collation, the database's default, or one
// derived from a COLLATE inside an expression. A collation probe asks the
// catalog node, where each tree has its template: one statement whose one
// row gives, for each expression, the collation PostgreSQL derives for it
// (pg_collation_for, NULL for a type without collation or an indeterminate
// one) and whether that collation orders strings as their bytes. The probe
// keeps the statement's WITH and FROM, the FROM on the nullable side of
// a LEFT JOIN ... ON false, so that it reads no rows and still returns one.

// Byte order: a libc collation whose locale is C or POSIX compares with
// strcmp; one whose locale is C.UTF-8 (also spelled C.utf8, the default of
// initdb on Debian and of many container images) compares code points,
// which in a UTF8 database is the order of the bytes too (glibc 2.35 gave
// it strcmp's order, and Debian's own C.UTF-8 before it sorted by code
// point). The database default counts when its own locale is one of them.
// A node whose libc orders C.UTF-8 otherwise shows as a part that comes
// out of order, which the merge refuses (btreeindex.Merge).
const byteLocale = "IN ('C', 'POSIX') OR pg_catalog.pg_encoding_to_char(d.encoding) = 'UTF8' AND pg_catalog.lower(pg_catalog.replace(%s, '-', '')) = 'c.utf8'"

// The pieces of a probe around each expression and each collation name.
// The type check keeps pg_collation_for from failing on a type without
// collation; to_regcollation reads the name back without failing.
var (
	probeHead = "(SELECT CASE WHEN lattice_t.typcollation <> 0 THEN pg_catalog.pg_collation_for(lattice_x.v) END FROM (SELECT "
	probeTail = " AS v) AS lattice_x, pg_catalog.pg_type AS lattice_t WHERE lattice_t.oid = pg_catalog.pg_typeof(lattice_x.v))"
	bytesHead = "COALESCE((SELECT c.collprovider = 'c' AND (c.collcollate " + fmt.Sprintf(byteLocale, "c.collcollate") + ")" +
		" OR c.collprovider = 'd' AND d.datlocprovider = 'c' AND (d.datcollate " + fmt.Sprintf(byteLocale, "d.datcollate") + ")" +
		" FROM pg_catalog.pg_collation AS c, pg_catalog.pg_database AS d WHERE c.oid = pg_catalog.to_regcollation("
	bytesTail = ") AND d.datname = pg_catalog.current_database()), false)"
)

// collationProbe builds the probe for exprs, evaluated over r's statement;
// a nil expression gets NULL and false. It returns "" when the probe cannot
// be built, and the proxy then treats every text key as one it cannot
// merge.
func collationProbe(r route, exprs []*pg.Node) string {
	var with *pg.WithClause
	if r.sel.WithClause != nil {
		with = proto.Clone(r.sel.WithClause).(*pg.WithClause)
	}
	s := &pg.SelectStmt{
		WithClause:  with,
		LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
		Op:          pg.SetOperation_SETOP_NONE,
	}
	var from *pg.Node
	for _, n := range r.sel.FromClause {
		n = proto.Clone(n).(*pg.Node)
		if from == nil {
			from = n
			continue
		}
		from = &pg.Node{Node: &pg.Node_JoinExpr{JoinExpr: &pg.JoinExpr{Jointype: pg.JoinType_JOIN_INNER, Larg: from, Rarg: n}}}
	}
	if from == nil {
		return ""
	}
	// The tree is its template, public.<tree>, whatever the session's
	// search_path.
	var qualify func(m protoreflect.Message)
	qualify = func(m protoreflect.Message) {
		if v, ok := m.Interface().(*pg.RangeVar); ok {
			if r.refTree(v) != nil {
				v.Schemaname, v.Catalogname = "public", ""
			}
			return
		}
		eachChild(m, qualify)
	}
	qualify(from.ProtoReflect())
	one := &pg.Node{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
		Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT, Op: pg.SetOperation_SETOP_NONE}}},
		Alias:    &pg.Alias{Aliasname: "lattice_one"},
	}}}
	never := &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Boolval{Boolval: &pg.Boolean{Boolval: false}}}}}
	s.FromClause = []*pg.Node{{Node: &pg.Node_JoinExpr{JoinExpr: &pg.JoinExpr{Jointype: pg.JoinType_JOIN_LEFT, Larg: one, Rarg: from, Quals: never}}}}
	texts := make([]string, len(exprs))
	for i, e := range exprs {
		s.TargetList = append(s.TargetList, resTarget("lattice_n"+strconv.Itoa(i+1), columnNode("lattice_probe_"+strconv.Itoa(i+1))))
		if e == nil {
			texts[i] = "NULL::text"
			continue
		}
		// The probe runs without the statement's parameters: one in an
		// expression (a FILTER's comparison) or in its WITH or FROM (a
		// CTE's filter, a join condition) reads as NULL, which changes no
		// column's collation.
		e = &pg.Node{Node: &pg.Node_CoalesceExpr{CoalesceExpr: &pg.CoalesceExpr{Args: []*pg.Node{proto.Clone(e).(*pg.Node)}}}}
		nullParams(e.ProtoReflect())
		t, err := deparseExpr(e.GetCoalesceExpr().Args[0])
		if err != nil {
			return ""
		}
		texts[i] = probeHead + t + probeTail
	}
	nullParams(s.ProtoReflect())
	inner, err := deparseStmt(s)
	if err != nil {
		return ""
	}
	toks, _, ok := scan(inner)
	if !ok {
		return ""
	}
	var b strings.Builder
	b.WriteString("SELECT ")
	for i := range exprs {
		n := "lattice_n" + strconv.Itoa(i+1)
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n + ", " + bytesHead + n + bytesTail)
	}
	b.WriteString(" FROM (")
	last, seen := 0, 0
	for _, t := range toks {
		if t.kind != pg.Token_IDENT {
			continue
		}
		k, found := strings.CutPrefix(t.text(inner), "lattice_probe_")
		i, err := strconv.Atoi(k)
		if !found || err != nil || i < 1 || i > len(exprs) {
			continue
		}
		b.WriteString(inner[last:t.start])
		b.WriteString(texts[i-1])
		last = int(t.end)
		seen++
	}
	if seen != len(exprs) {
		return ""
	}
	b.WriteString(inner[last:])
	b.WriteString(") AS lattice_probe")
	return b.String()
}

// nullParams replaces every parameter inside m with NULL.
func nullParams(m protoreflect.Message) {
	rewriteChildren(m, func(n *pg.Node) *pg.Node {
		if n.GetParamRef() != nil {
			return &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Isnull: true}}}
		}
		nullParams(n.ProtoReflect())
		return n
	})
}
