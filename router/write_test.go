package router

import (
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

func TestRenderFilteredWrite(t *testing.T) {
	f := func(q string) string { return "f(" + q + ".sku)" }
	cases := []struct{ sql, want string }{
		{`UPDATE catalogue SET qty = qty + 1`,
			`UPDATE lattice_s0001.catalogue SET qty = qty + 1 WHERE f(lattice_s0001.catalogue.sku)`},
		{`DELETE FROM catalogue WHERE qty > 1 OR qty < 0 RETURNING sku`,
			`DELETE FROM lattice_s0001.catalogue WHERE (qty > 1 OR qty < 0) AND (f(lattice_s0001.catalogue.sku)) RETURNING sku`},
		{`DELETE FROM catalogue RETURNING sku, qty`,
			`DELETE FROM lattice_s0001.catalogue WHERE f(lattice_s0001.catalogue.sku) RETURNING sku, qty`},
		// The alias names the target; public.tree.col references are
		// requalified as in Render.
		{`UPDATE catalogue AS c SET qty = 0 WHERE c.qty < 0 RETURNING *`,
			`UPDATE lattice_s0001.catalogue AS c SET qty = 0 WHERE (c.qty < 0) AND (f(c.sku)) RETURNING *`},
		{`DELETE FROM public.catalogue WHERE public.catalogue.qty > 0`,
			`DELETE FROM lattice_s0001.catalogue WHERE (lattice_s0001.catalogue.qty > 0) AND (f(lattice_s0001.catalogue.sku))`},
		// WHERE and RETURNING of subqueries and CTEs are not the statement's.
		{`WITH x AS (SELECT 1 AS n WHERE true) UPDATE catalogue SET qty = (SELECT n FROM x WHERE n > 0)`,
			`WITH x AS (SELECT 1 AS n WHERE true) UPDATE lattice_s0001.catalogue SET qty = (SELECT n FROM x WHERE n > 0) WHERE f(lattice_s0001.catalogue.sku)`},
		{`UPDATE catalogue SET qty = 1 WHERE qty IN (SELECT 2 WHERE false) RETURNING (SELECT 3)`,
			`UPDATE lattice_s0001.catalogue SET qty = 1 WHERE (qty IN (SELECT 2 WHERE false)) AND (f(lattice_s0001.catalogue.sku)) RETURNING (SELECT 3)`},
		// A comment at the end never swallows the filter.
		{"DELETE FROM catalogue /* all */", "DELETE FROM lattice_s0001.catalogue WHERE f(lattice_s0001.catalogue.sku) /* all */"},
		{"UPDATE catalogue SET qty = 2 WHERE qty = 1 -- one\n", "UPDATE lattice_s0001.catalogue SET qty = 2 WHERE (qty = 1) AND (f(lattice_s0001.catalogue.sku))"},
		{"UPDATE catalogue SET qty = 2 WHERE /* c */ qty = 1 /* d */ RETURNING sku",
			"UPDATE lattice_s0001.catalogue SET qty = 2 WHERE /* c */ (qty = 1) AND (f(lattice_s0001.catalogue.sku)) /* d */ RETURNING sku"},
		{`UPDATE "catalogue"SET qty = $1 WHERE(qty = $2)`,
			`UPDATE lattice_s0001.catalogue SET qty = $1 WHERE((qty = $2)) AND (f(lattice_s0001.catalogue.sku))`},
	}
	for _, c := range cases {
		p := planOne(t, c.sql)
		if p.Kind != WriteAll {
			t.Errorf("%s: planned %s, want WriteAll", c.sql, p)
			continue
		}
		got := p.RenderFiltered("lattice_s0001", f)
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.sql, got, c.want)
		}
		checkWriteSQL(t, p)
	}
}

// checkWriteSQL checks a WriteAll plan's filtered rendering: it parses as
// one statement whose WHERE is the original condition AND the filter (the
// filter alone when there was none), and is otherwise the statement Render
// gives: the filter lands in the statement's own WHERE, not a subquery's.
func checkWriteSQL(t *testing.T, p *Plan) {
	t.Helper()
	rendered := p.RenderFiltered("lattice_s0042", func(q string) string { return "lattice_filter(" + q + ".k)" })
	res, err := pg.Parse(rendered)
	if err != nil || len(res.Stmts) != 1 {
		t.Fatalf("%q renders filtered to %q, which does not parse as one statement: %v", p.SQL, rendered, err)
	}
	var where **pg.Node
	switch s := res.Stmts[0].Stmt.Node.(type) {
	case *pg.Node_UpdateStmt:
		where = &s.UpdateStmt.WhereClause
	case *pg.Node_DeleteStmt:
		where = &s.DeleteStmt.WhereClause
	default:
		t.Fatalf("%q renders filtered to %q, not an UPDATE or DELETE", p.SQL, rendered)
	}
	isFilter := func(n *pg.Node) bool {
		fc := n.GetFuncCall()
		return fc != nil && len(fc.Funcname) == 1 && fc.Funcname[0].GetString_().GetSval() == "lattice_filter"
	}
	// The parser flattens a AND b AND filter into one AND of three.
	switch b := (*where).GetBoolExpr(); {
	case isFilter(*where):
		*where = nil
	case b != nil && b.Boolop == pg.BoolExprType_AND_EXPR && isFilter(b.Args[len(b.Args)-1]):
		b.Args = b.Args[:len(b.Args)-1]
		if len(b.Args) == 1 {
			*where = b.Args[0]
		}
	default:
		t.Fatalf("%q renders filtered to %q: its WHERE does not end with the filter", p.SQL, rendered)
	}
	got, err := pg.Deparse(res)
	if err != nil {
		t.Fatal(err)
	}
	if want := deparse(t, p.Render("lattice_s0042")); got != want {
		t.Fatalf("%q renders filtered to\n%s\nwhich without its filter is\n%s\nwant\n%s", p.SQL, rendered, got, want)
	}
}
