package router

import "testing"

func TestHides(t *testing.T) {
	cases := []struct {
		sql   string
		kind  Kind
		hides Hides
	}{
		// No call: nothing to probe (the point-select path).
		{sql: `SELECT * FROM orders WHERE id = 1`, kind: Single},
		{sql: `SELECT 1`, kind: Catalog},
		{sql: `INSERT INTO plain (a) VALUES (1)`, kind: Catalog},
		{sql: `SELECT current_date, coalesce(NULL, 1), greatest(1, 2)`, kind: Catalog}, // expressions, not calls

		// Built-ins by unqualified name: harmless while pg_catalog comes first.
		{sql: `SELECT now()`, kind: Catalog, hides: HidesByPath},
		{sql: `SELECT count(*) FROM plain`, kind: Catalog, hides: HidesByPath},
		{sql: `SELECT lower(name) FROM orders WHERE id = 1`, kind: Single, hides: HidesByPath},
		{sql: `SELECT pg_advisory_xact_lock(1)`, kind: Catalog, hides: HidesByPath},

		// pg_catalog-qualified: a tenant cannot create functions there.
		{sql: `SELECT pg_catalog.now()`, kind: Catalog},
		{sql: `SELECT pg_catalog.lower(name) FROM orders WHERE id = 1`, kind: Single},
		{sql: `SELECT pg_catalog.upper(pg_catalog.lower('A'))`, kind: Catalog},

		// Anything else may hide session state.
		{sql: `SELECT f()`, kind: Catalog, hides: HidesState},
		{sql: `SELECT * FROM f(1)`, kind: Catalog, hides: HidesState},
		{sql: `SELECT public.now()`, kind: Catalog, hides: HidesState},
		{sql: `SELECT evil.lower('A')`, kind: Catalog, hides: HidesState},
		{sql: `SELECT "PG_CATALOG".now()`, kind: Catalog, hides: HidesState},
		{sql: `SELECT "NOW"()`, kind: Catalog, hides: HidesState},
		{sql: `SELECT mydb.pg_catalog.now()`, kind: Catalog, hides: HidesState},
		{sql: `SELECT now(), f()`, kind: Catalog, hides: HidesState | HidesByPath},
		{sql: `SELECT pg_catalog.now() FROM plain WHERE a = f()`, kind: Catalog, hides: HidesState},
		{sql: `SELECT name FROM orders WHERE id = 1 AND app.check(name)`, kind: Single, hides: HidesState},
		{sql: `UPDATE orders SET name = app.stamp() WHERE id = 1`, kind: Single, hides: HidesState},
		{sql: `DO $$ BEGIN PERFORM set_config('search_path', 'evil', false); END $$`, kind: Catalog, hides: HidesState},
		{sql: `CALL p()`, kind: Catalog, hides: HidesState},
		{sql: `CALL pg_catalog.p()`, kind: Catalog, hides: HidesState},

		// Lattice's own functions run in the proxy.
		{sql: `SELECT * FROM lattice_trees()`, kind: Function},
	}
	for _, c := range cases {
		p := planOne(t, c.sql)
		if p.Kind != c.kind || p.Hides != c.hides {
			t.Errorf("%s: %v hides=%b, want %v hides=%b", c.sql, p.Kind, p.Hides, c.kind, c.hides)
		}
	}
}

// TestHidesDerivedFromShape: a statement planned from a shape template
// keeps its Hides, which depends on function names only.
func TestHidesDerivedFromShape(t *testing.T) {
	pl := NewPlanner(100)
	for _, c := range []struct {
		sql   string
		hides Hides
	}{
		{`SELECT app.f(1) FROM orders WHERE id = 1`, HidesState},
		{`SELECT app.f(2) FROM orders WHERE id = 2`, HidesState},
		{`SELECT app.f(3) FROM orders WHERE id = 3`, HidesState},
		{`SELECT name FROM orders WHERE id = 4`, 0},
		{`SELECT name FROM orders WHERE id = 5`, 0},
		{`SELECT f(1)`, HidesState},
		{`SELECT f(2)`, HidesState},
	} {
		plans, err := pl.Plan(c.sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if plans[0].Hides != c.hides {
			t.Errorf("%s: hides=%b, want %b", c.sql, plans[0].Hides, c.hides)
		}
	}
}
