package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestSearchPathShadowsTree: under a search_path that puts another schema
// first, a bare name that PostgreSQL resolves to that schema's table is
// refused (0A000, with a hint to qualify it) rather than read as the tree;
// without public in the search_path it does not exist (42P01). Qualified
// names, and a search_path under which the name still resolves to public,
// read what PostgreSQL reads. The same holds for a SET LOCAL search_path
// and for one given at startup. Before, the bare name read the tree.
func TestSearchPathShadowsTree(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE sp (k bigint PRIMARY KEY, v int)`)
	mustExec(t, c, `INSERT INTO sp SELECT g, g FROM generate_series(1, 20) g`)
	mustExec(t, c, `SELECT lattice_create_tree('sp', 'k', shard_count => 4)`)
	mustExec(t, c, `CREATE SCHEMA other`)
	mustExec(t, c, `CREATE TABLE other.sp (k bigint PRIMARY KEY, v int)`)
	mustExec(t, c, `INSERT INTO other.sp VALUES (1, 111)`)
	mustExec(t, c, `CREATE SCHEMA empty`)

	// Both protocols: a statement's text is where the bare name is found.
	expect := func(t *testing.T, c *pgx.Conn, sql string, want int, code string) {
		t.Helper()
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			var v int
			err := c.QueryRow(ctx, sql, mode).Scan(&v)
			if got := pgCode(err); got != code || code == "" && v != want {
				t.Fatalf("%s (%v): %d (%q), want %d (%q)", sql, mode, v, got, want, code)
			}
		}
	}
	reads := func(t *testing.T, c *pgx.Conn, bare int, code string) {
		t.Helper()
		expect(t, c, `SELECT v FROM sp WHERE k = 1`, bare, code)
		expect(t, c, `SELECT count(*)::int FROM sp`, 20, code)
		expect(t, c, `SELECT v FROM public.sp WHERE k = 1`, 1, "")
		expect(t, c, `SELECT v FROM other.sp WHERE k = 1`, 111, "")
	}
	t.Run("default", func(t *testing.T) { reads(t, c, 1, "") })
	t.Run("public first", func(t *testing.T) {
		mustExec(t, c, `SET search_path = public, other`)
		defer mustExec(t, c, `RESET search_path`)
		reads(t, c, 1, "")
	})
	t.Run("other first", func(t *testing.T) {
		mustExec(t, c, `SET search_path = other, public`)
		defer mustExec(t, c, `RESET search_path`)
		reads(t, c, 0, "0A000")
	})
	t.Run("no public", func(t *testing.T) {
		mustExec(t, c, `SET search_path = empty`)
		defer mustExec(t, c, `RESET search_path`)
		expect(t, c, `SELECT v FROM sp WHERE k = 1`, 0, "42P01")
		expect(t, c, `SELECT v FROM public.sp WHERE k = 1`, 1, "")
	})
	t.Run("local", func(t *testing.T) {
		// One protocol per block: the refusal aborts it.
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			mustExec(t, c, `BEGIN`)
			mustExec(t, c, `SET LOCAL search_path = other, public`)
			var v int
			if err := c.QueryRow(ctx, `SELECT v FROM sp WHERE k = 1`, mode).Scan(&v); pgCode(err) != "0A000" {
				t.Fatalf("under SET LOCAL search_path (%v): %d, %v; want 0A000", mode, v, err)
			}
			mustExec(t, c, `ROLLBACK`)
		}
		expect(t, c, `SELECT v FROM sp WHERE k = 1`, 1, "")
	})
	t.Run("startup", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["search_path"] = "other, public"
		sc, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close(ctx)
		reads(t, sc, 0, "0A000")
	})
	t.Run("after the shadow goes", func(t *testing.T) {
		mustExec(t, c, `SET search_path = other, public`)
		defer mustExec(t, c, `RESET search_path`)
		mustExec(t, c, `ALTER TABLE other.sp RENAME TO sp_old`)
		expect(t, c, `SELECT v FROM sp WHERE k = 1`, 1, "")
	})
}
