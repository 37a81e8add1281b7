package router

import "testing"

// TestReparse: FETCH and EXECUTE are planned to be parsed at each use,
// also when their shape was planned before (a template knows no Reparse:
// Plan.String shows it, so the self-check of rule 6 in shape.go keeps no
// template of them); MOVE, EXPLAIN and a statement on a tree are not.
func TestReparse(t *testing.T) {
	cases := []struct {
		sql     string
		kind    Kind
		reparse bool
	}{
		{`FETCH 1 IN c`, Catalog, true},
		{`FETCH 2 IN c`, Catalog, true},
		{`FETCH 3 IN c`, Catalog, true},
		{`FETCH ALL FROM "C"`, Catalog, true},
		{`FETCH NEXT c`, Catalog, true},
		{`MOVE 1 IN c`, Catalog, false},
		{`EXECUTE q`, Catalog, true},
		{`EXECUTE q(1)`, Catalog, true},
		{`EXECUTE q(2)`, Catalog, true},
		{`EXECUTE q(3)`, Catalog, true},
		{`EXPLAIN EXECUTE q(1)`, Catalog, false},
		{`SELECT 1`, Catalog, false},
		{`DECLARE c CURSOR FOR SELECT * FROM orders`, Cursor, false},
	}
	pl := NewPlanner(100)
	for _, c := range cases {
		plans, err := pl.Plan(c.sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(plans) != 1 || plans[0].Kind != c.kind || plans[0].Reparse != c.reparse {
			t.Errorf("%s: %v, want %v reparse=%v", c.sql, plans, c.kind, c.reparse)
		}
	}
}
