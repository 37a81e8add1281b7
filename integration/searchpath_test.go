package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
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
	shadowedTree(t, c, "sp", "other")
	mustExec(t, c, `DROP SCHEMA IF EXISTS empty CASCADE`)
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

// TestSearchPathShadowsTreeInQueryString: a query string of several
// statements gets the same check as a statement of its own, statement by
// statement, so that under SET search_path = other, public a bare name is
// refused rather than read or written as the tree where PostgreSQL would
// read or write other.sp. A string that sets the search_path itself and
// then names a tree is refused too: its statements are checked before its
// SET runs. Before, each of these read or wrote the tree.
func TestSearchPathShadowsTreeInQueryString(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	shadowedTree(t, c, "sp", "qs_other")
	mustExec(t, c, `DROP SCHEMA IF EXISTS qs_empty CASCADE`)
	mustExec(t, c, `CREATE SCHEMA qs_empty`)

	for _, tc := range []struct {
		path string // the session's search_path, "" for the default
		sql  string
		code string // "" for success
	}{
		{"qs_other, public", `SELECT v FROM sp WHERE k = 1; SELECT 2`, "0A000"},
		{"qs_other, public", `UPDATE sp SET v = 0 WHERE k = 1; SELECT 2`, "0A000"},
		{"qs_other, public", `SELECT 2; DELETE FROM sp WHERE k = 1`, "0A000"},
		{"qs_other, public", `INSERT INTO sp VALUES (21, 21); SELECT 2`, "0A000"},
		{"qs_empty", `SELECT v FROM sp WHERE k = 1; SELECT 2`, "42P01"},
		{"", `SET search_path = qs_other, public; DELETE FROM sp WHERE k = 1`, "0A000"},
		{"", `BEGIN; SET LOCAL search_path = qs_other, public; DELETE FROM sp WHERE k = 1; COMMIT`, "0A000"},
		// Whatever the path: the check runs before the SET.
		{"", `SET search_path = public; UPDATE sp SET v = 0 WHERE k = 1`, "0A000"},
		// Names PostgreSQL resolves as the proxy does.
		{"qs_other, public", `SELECT v FROM public.sp WHERE k = 1; SELECT 2`, ""},
		{"qs_other, public", `UPDATE qs_other.sp SET v = v WHERE k = 1; SELECT 2`, ""},
		{"public, qs_other", `UPDATE sp SET v = v WHERE k = 1; SELECT 2`, ""},
		{"", `UPDATE sp SET v = v WHERE k = 1; SET search_path = qs_other, public`, ""},
		{"", `SELECT 1; SET search_path = qs_other, public; SELECT 2`, ""},
		{"", `SET search_path = qs_other, public; UPDATE public.sp SET v = v WHERE k = 1`, ""},
	} {
		t.Run(tc.path+": "+tc.sql, func(t *testing.T) {
			if tc.path != "" {
				mustExec(t, c, `SET search_path = `+tc.path)
			}
			_, err := c.Exec(ctx, tc.sql)
			if got := pgCode(err); got != tc.code || tc.code == "" && err != nil {
				t.Errorf("%s under search_path %q: %v (%q), want %q", tc.sql, tc.path, err, got, tc.code)
			}
			if tc.code != "" && err != nil && pgHint(err) == "" {
				t.Errorf("%s: %v has no hint", tc.sql, err)
			}
			mustExec(t, c, `RESET search_path`)
			// Nothing was written, to the tree or to qs_other.sp.
			for _, q := range []struct {
				sql  string
				want int
			}{{`SELECT v FROM public.sp WHERE k = 1`, 1}, {`SELECT count(*)::int FROM public.sp`, 20}, {`SELECT v FROM qs_other.sp WHERE k = 1`, 111}} {
				var v int
				if err := c.QueryRow(ctx, q.sql).Scan(&v); err != nil || v != q.want {
					t.Fatalf("after %s: %s = %d (%v), want %d", tc.sql, q.sql, v, err, q.want)
				}
			}
		})
	}
}

// TestSearchPathShadowsTreeInBatch: an extended-protocol batch (one
// pipeline, one Sync) that sets the search_path and then names a tree bare
// is refused (0A000, with a hint), as a query string that does is: the
// proxy records the SET only once the batch has played, so it checks the
// later statements under the old path. Before, such a DELETE wrote the
// tree where PostgreSQL would write pbo.pb. Qualified names, and batches
// without a SET before the tree's statement, work.
func TestSearchPathShadowsTreeInBatch(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	shadowedTree(t, c, "pb", "pbo")
	// A Batch takes its connection's mode: prepared statements, or unnamed
	// ones with every statement's Parse in the pipeline.
	conns := map[pgx.QueryExecMode]*pgx.Conn{}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		cfg, err := pgx.ParseConfig(p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = mode
		if conns[mode], err = pgx.ConnectConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		defer conns[mode].Close(ctx)
	}

	for _, tc := range []struct {
		path  string   // the session's search_path, "" for the default
		batch []string // a statement with $1 gets k = 1
		code  string   // "" for success
	}{
		{"", []string{`SET search_path = pbo, public`, `DELETE FROM pb WHERE k = $1`}, "0A000"},
		{"", []string{`SET search_path = pbo, public`, `UPDATE pb SET v = 0 WHERE k = $1`}, "0A000"},
		{"", []string{`SET search_path = pbo, public`, `SELECT v FROM pb WHERE k = $1`}, "0A000"},
		{"", []string{`BEGIN`, `SET LOCAL search_path = pbo, public`, `DELETE FROM pb WHERE k = $1`, `COMMIT`}, "0A000"},
		{"public, pbo", []string{`RESET search_path`, `UPDATE pb SET v = 0 WHERE k = $1`}, "0A000"},
		// Whatever the path: the check runs before the SET is recorded.
		{"", []string{`SET search_path = public`, `UPDATE pb SET v = 0 WHERE k = $1`}, "0A000"},
		// Names PostgreSQL resolves as the proxy does.
		{"", []string{`SET search_path = pbo, public`, `UPDATE public.pb SET v = v WHERE k = $1`}, ""},
		{"", []string{`SET search_path = pbo, public`, `UPDATE pbo.pb SET v = v WHERE k = $1`}, ""},
		{"", []string{`SELECT 1`, `UPDATE pb SET v = v WHERE k = $1`}, ""},
		{"public, pbo", []string{`UPDATE pb SET v = v WHERE k = $1`, `DELETE FROM pb WHERE k = $1 AND false`}, ""},
		{"", []string{`UPDATE pb SET v = v WHERE k = $1`, `SET search_path = pbo, public`}, ""},
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
			t.Run(tc.path+": "+strings.Join(tc.batch, "; ")+" "+mode.String(), func(t *testing.T) {
				c := conns[mode]
				if tc.path != "" {
					mustExec(t, c, `SET search_path = `+tc.path)
				}
				err := sendBatch(ctx, c, tc.batch)
				if got := pgCode(err); got != tc.code || tc.code == "" && err != nil {
					t.Errorf("batch under search_path %q: %v (%q), want %q", tc.path, err, got, tc.code)
				}
				if tc.code != "" && err != nil && pgHint(err) == "" {
					t.Errorf("%v has no hint", err)
				}
				mustExec(t, c, `ROLLBACK`) // a refused batch may leave its transaction aborted
				mustExec(t, c, `RESET search_path`)
				// Nothing was written, to the tree or to pbo.pb.
				for _, q := range []struct {
					sql  string
					want int
				}{{`SELECT v FROM public.pb WHERE k = 1`, 1}, {`SELECT count(*)::int FROM public.pb`, 20}, {`SELECT v FROM pbo.pb WHERE k = 1`, 111}} {
					var v int
					if err := c.QueryRow(ctx, q.sql).Scan(&v); err != nil || v != q.want {
						t.Fatalf("after the batch: %s = %d (%v), want %d", q.sql, v, err, q.want)
					}
				}
			})
		}
	}
	// A Flush plays what came before it, and the session has the SET from
	// then on: the statements after it get the check under the new path.
	t.Run("flush after the SET", func(t *testing.T) {
		w := dialWire(t, p.DSN("lattice"))
		stmt := func(sql string) []pgproto3.FrontendMessage {
			return []pgproto3.FrontendMessage{&pgproto3.Parse{Query: sql}, &pgproto3.Bind{}, &pgproto3.Execute{}}
		}
		for _, tc := range []struct{ path, sql, code string }{
			{"public, pbo", `DELETE FROM pb WHERE k = 1 AND false`, ""},
			{"pbo, public", `DELETE FROM pb WHERE k = 1`, "0A000"},
		} {
			msgs := append(stmt(`SET search_path = `+tc.path), &pgproto3.Flush{})
			msgs = append(append(msgs, stmt(tc.sql)...), &pgproto3.Sync{})
			got := w.round(msgs...)
			if failed := strings.Contains(got, "ErrorResponse"); failed != (tc.code != "") || failed && !strings.Contains(got, "ErrorResponse:"+tc.code) {
				t.Errorf("SET search_path = %s, Flush, %s: %s, want error %q", tc.path, tc.sql, got, tc.code)
			}
			w.round(&pgproto3.Query{String: `RESET search_path`})
		}
		var v int
		if err := c.QueryRow(ctx, `SELECT v FROM public.pb WHERE k = 1`).Scan(&v); err != nil || v != 1 {
			t.Fatalf("after the batches: public.pb k = 1 has %d (%v), want 1", v, err)
		}
	})
}

// sendBatch sends stmts as one pgx Batch (one pipeline, one Sync), with
// k = 1 for a statement that takes $1, and returns the first error.
func sendBatch(ctx context.Context, c *pgx.Conn, stmts []string) error {
	b := &pgx.Batch{}
	for _, sql := range stmts {
		if strings.Contains(sql, "$1") {
			b.Queue(sql, 1)
		} else {
			b.Queue(sql)
		}
	}
	br := c.SendBatch(ctx, b)
	var first error
	for range stmts {
		if _, err := br.Exec(); err != nil && first == nil {
			first = err
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// TestSearchPathSetConfig: SELECT set_config('search_path', 'literal',
// false) on its own is followed as SET search_path is: recorded, replayed
// on the session's next backends, and the bare-name check runs under it,
// so a tree's bare name that PostgreSQL would resolve to zzo.zz is refused
// rather than read as the tree, and pg_dump's prologue (an empty path,
// then qualified names) works. Any other set_config of search_path (local,
// a parameter, inside a larger statement) is refused with 0A000. Before, a
// set_config of search_path went unnoticed and the bare name read the tree.
func TestSearchPathSetConfig(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	shadowedTree(t, c, "zz", "zzo")
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement}
	for _, tc := range []struct {
		name, set string
		args      []any
		setCode   string // the set_config's own outcome
		path      string // current_setting('search_path') afterwards
		bareCode  string // SELECT v FROM zz WHERE k = 1 afterwards
	}{
		{name: "other first", set: `SELECT set_config('search_path', 'zzo, public', false)`, path: "zzo, public", bareCode: "0A000"},
		{name: "qualified call", set: `SELECT pg_catalog.set_config('SEARCH_PATH', 'zzo, public', false)`, path: "zzo, public", bareCode: "0A000"},
		{name: "pg_dump prologue", set: `SELECT pg_catalog.set_config('search_path', '', false)`, path: "", bareCode: "42P01"},
		{name: "public first", set: `SELECT set_config('search_path', 'public, zzo', false)`, path: "public, zzo"},
		{name: "local", set: `SELECT set_config('search_path', 'zzo, public', true)`, setCode: "0A000", path: `"$user", public`},
		{name: "parameter", set: `SELECT set_config('search_path', $1, false)`, args: []any{"zzo, public"}, setCode: "0A000", path: `"$user", public`},
		{name: "larger statement", set: `SELECT set_config('search_path', 'zzo, public', false), 1`, setCode: "0A000", path: `"$user", public`},
		{name: "from a table", set: `SELECT set_config('search_path', 'zzo, public', false) FROM zzo.zz`, setCode: "0A000", path: `"$user", public`},
	} {
		for _, mode := range modes {
			if tc.args != nil && mode == pgx.QueryExecModeSimpleProtocol {
				continue
			}
			t.Run(tc.name+"/"+mode.String(), func(t *testing.T) {
				sc := connect(t, p.DSN("lattice"))
				defer sc.Close(ctx)
				rows, err := sc.Query(ctx, tc.set, append([]any{mode}, tc.args...)...)
				if err == nil {
					for rows.Next() {
					}
					rows.Close()
					err = rows.Err()
				}
				if got := pgCode(err); got != tc.setCode {
					t.Fatalf("%s: %v, want %q", tc.set, err, tc.setCode)
				}
				// Several statements, so that pooled backends other than
				// the set_config's carry the session's path too.
				for i := 0; i < 4; i++ {
					var path string
					if err := sc.QueryRow(ctx, `SELECT current_setting('search_path')`, mode).Scan(&path); err != nil || path != tc.path {
						t.Fatalf("search_path after %s: %q, %v; want %q", tc.set, path, err, tc.path)
					}
					var v int
					err := sc.QueryRow(ctx, `SELECT v FROM zz WHERE k = 1`, mode).Scan(&v)
					if got := pgCode(err); got != tc.bareCode || got == "" && v != 1 {
						t.Fatalf("bare zz after %s: %d, %v; want 1 or %q", tc.set, v, err, tc.bareCode)
					}
					if err := sc.QueryRow(ctx, `SELECT v FROM public.zz WHERE k = 1`, mode).Scan(&v); err != nil || v != 1 {
						t.Fatalf("public.zz after %s: %d, %v; want 1", tc.set, v, err)
					}
					if err := sc.QueryRow(ctx, `SELECT v FROM zzo.zz WHERE k = 1`, mode).Scan(&v); err != nil || v != 111 {
						t.Fatalf("zzo.zz after %s: %d, %v; want 111", tc.set, v, err)
					}
				}
			})
		}
	}
	t.Run("then bare in the same string", func(t *testing.T) {
		sc := connect(t, p.DSN("lattice"))
		defer sc.Close(ctx)
		_, err := sc.Exec(ctx, `SELECT set_config('search_path', 'zzo, public', false); SELECT v FROM zz WHERE k = 1`, pgx.QueryExecModeSimpleProtocol)
		if pgCode(err) != "0A000" {
			t.Fatalf("set_config then bare zz in one string: %v, want 0A000", err)
		}
	})
}

// shadowedTree makes tree, of 4 shards with the rows (k, v = k) for k 1 to
// 20, and schema.tree, an ordinary table on the catalog node holding the
// one row (1, 111): what PostgreSQL reads for the tree's bare name under a
// search_path that puts schema first. Schemas outlive resetNodes, so
// schema is made afresh.
func shadowedTree(t *testing.T, c *pgx.Conn, tree, schema string) {
	t.Helper()
	mustExec(t, c, fmt.Sprintf(`CREATE TABLE %s (k bigint PRIMARY KEY, v int)`, tree))
	mustExec(t, c, fmt.Sprintf(`INSERT INTO %s SELECT g, g FROM generate_series(1, 20) g`, tree))
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('%s', 'k', shard_count => 4)`, tree))
	mustExec(t, c, fmt.Sprintf(`DROP SCHEMA IF EXISTS %s CASCADE`, schema))
	mustExec(t, c, fmt.Sprintf(`CREATE SCHEMA %s`, schema))
	mustExec(t, c, fmt.Sprintf(`CREATE TABLE %s.%s (k bigint PRIMARY KEY, v int)`, schema, tree))
	mustExec(t, c, fmt.Sprintf(`INSERT INTO %s.%s VALUES (1, 111)`, schema, tree))
}
