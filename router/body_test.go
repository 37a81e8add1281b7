package router

import (
	"strings"
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestBodyReadsTree: a function, procedure or DO block whose body names a
// tree would read its empty template on the catalog node, so it is
// refused; one that does not runs there.
func TestBodyReadsTree(t *testing.T) {
	for _, c := range []struct {
		sql  string
		tree string // "" when the statement runs on the catalog node
	}{
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM catalogue'`, "catalogue"},
		{`CREATE FUNCTION n() RETURNS bigint AS $$ SELECT 1; SELECT count(*) FROM public.orders $$ LANGUAGE sql`, "orders"},
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM orders; END`, "orders"},
		{`CREATE PROCEDURE p() LANGUAGE sql AS $$ UPDATE catalogue SET qty = 0 $$`, "catalogue"},
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE plpgsql AS $$ DECLARE c bigint; BEGIN c := (SELECT count(*) FROM orders); RETURN c; END $$`, "orders"},
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT max(total) FROM orders o); END $$`, "orders"},
		{`CREATE FUNCTION n() RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM 1 FROM catalogue WHERE qty > 0; END $$`, "catalogue"},
		{`CREATE FUNCTION n() RETURNS void LANGUAGE plpgsql AS $$ BEGIN INSERT INTO plans SELECT name FROM catalogue; END $$`, "catalogue"},
		{`DO $$ BEGIN PERFORM count(*) FROM orders; END $$`, "orders"},
		{`DO $$ DECLARE r record; BEGIN FOR r IN SELECT id FROM orders LOOP END LOOP; END $$`, "orders"},
		// Nothing of a tree: it runs where it is created.
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM plans'`, ""},
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE sql AS $$ WITH orders AS (SELECT 1 AS x) SELECT count(*) FROM orders $$`, ""},
		{`CREATE FUNCTION n() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM archive.orders'`, ""},
		{`CREATE FUNCTION n(orders int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN orders + 1; END $$`, ""},
		{`DO $$ BEGIN RAISE NOTICE 'orders'; END $$`, ""},
		// Dynamic SQL is the caller's: the proxy cannot read it.
		{`DO $$ BEGIN EXECUTE 'SELECT count(*) FROM ' || 'orders'; END $$`, ""},
	} {
		t.Run(c.sql, func(t *testing.T) {
			p := planOne(t, c.sql)
			if c.tree == "" {
				if p.Kind != Catalog {
					t.Fatalf("kind %v, want Catalog (%v)", p.Kind, p.Err)
				}
				return
			}
			if p.Kind != Refused || p.Err.Code != sqlstate.FeatureNotSupported || p.Err.Hint == "" {
				t.Fatalf("kind %v %+v, want Refused with 0A000 and a hint", p.Kind, p.Err)
			}
			if !strings.Contains(p.Err.Message, `body uses tree "`+c.tree+`"`) {
				t.Errorf("message %q does not name tree %s", p.Err.Message, c.tree)
			}
		})
	}
}
