package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// simpleTable is the table TestSimplePrepared reads: a tree through the
// proxy, a plain table on a node of its own.
const simpleTable = `CREATE TABLE typed (k bigint PRIMARY KEY, i integer, n numeric, f float8, s text, vc varchar(5), d date, b boolean, j jsonb, a integer[])`

// simplePlain is an ordinary table, on the catalog node through the proxy.
const simplePlain = `CREATE TABLE plainw (k integer PRIMARY KEY, v text, n integer NOT NULL DEFAULT 0)`

const simpleRows = `INSERT INTO typed SELECT g, g % 7 - 3, g / 4.0, g / 8.0, 'v' || g, left('w' || g, 5), date '2026-01-01' + g, g % 2 = 0, jsonb_build_object('a', g % 3), ARRAY[g % 3, 2] FROM generate_series(1, 200) g`

// TestSimplePrepared sends simple-protocol statements on one shard, which
// the proxy runs as statements prepared once per backend with their
// constants as parameters, and checks that every answer is PostgreSQL's
// for the literal text: rows, column types, command tags and errors, in
// and out of transactions. Then it checks that they did run prepared, and
// that a statement whose result columns changed under it through another
// proxy is run again outside a transaction.
func TestSimplePrepared(t *testing.T) {
	resetNodes(t)
	// One backend per node, so that the check at the end sees the
	// backend every statement ran on.
	p := startProxy(t, 2, "--pool-size", "1")
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, simpleTable)
	mustExec(t, c, `SELECT lattice_create_tree('typed', 'k', shard_count => 8)`)
	mustExec(t, c, simpleRows)
	plain := connect(t, testNodeDSN(t, 2))
	mustExec(t, plain, simpleTable)
	mustExec(t, plain, simpleRows)
	for _, conn := range []*pgx.Conn{c, plain} {
		mustExec(t, conn, simplePlain)
		mustExec(t, conn, `INSERT INTO plainw SELECT g, 'p' || g FROM generate_series(1, 20) g`)
	}

	direct, proxied := dialWire(t, testNodeDSN(t, 2)), dialWire(t, p.DSN("lattice"))
	direct.types, proxied.types = true, true
	query := func(sqls ...string) [][]pgproto3.FrontendMessage {
		var out [][]pgproto3.FrontendMessage
		for _, sql := range sqls {
			out = append(out, []pgproto3.FrontendMessage{&pgproto3.Query{String: sql}})
		}
		return out
	}
	// Each statement twice, with other constants: the first plans the
	// shape, the second takes the derived plan.
	statements := []string{
		`SELECT * FROM typed WHERE k = 5`, `SELECT * FROM typed WHERE k = 6`,
		`SELECT k, i FROM typed WHERE k = 10000000000`, `SELECT k, i FROM typed WHERE k = 10000000001`,
		`SELECT k + 1, i * 2 FROM typed WHERE k = 7 AND n = 1.75`, `SELECT k + 1, i * 2 FROM typed WHERE k = 8 AND f = 1e0`,
		`SELECT k FROM typed WHERE k = '9' AND i = '1'`, `SELECT k FROM typed WHERE k = '10' AND i = 'x'`,
		`SELECT i + 1, n * 2, f / 2, 1.5 + i, 3 FROM typed WHERE k = 11 AND i > -5`, `SELECT i + 1, n * 2, f / 2, 1.5 + i, 4 FROM typed WHERE k = 12 AND i > -2`,
		`SELECT s FROM typed WHERE k = 13 AND s LIKE 'v%'`, `SELECT s FROM typed WHERE k = 14 AND s LIKE 'x%'`,
		`SELECT s FROM typed WHERE k = 15 AND s IN ('v15', 'it''s')`, `SELECT s FROM typed WHERE k = 16 AND s IN ('a', 'v16')`,
		`SELECT vc FROM typed WHERE k = 17 AND vc = 'w17'`, `SELECT vc FROM typed WHERE k = 17 AND vc = 'w17xxxx'`,
		`SELECT d FROM typed WHERE k = 18 AND d = '2026-01-19'`, `SELECT d FROM typed WHERE k = 18 AND d > '2026-13-01'`,
		`SELECT j FROM typed WHERE k = 19 AND j = '{"a": 1}'`, `SELECT j FROM typed WHERE k = 20 AND j = '{"a": 2}'`,
		`SELECT b FROM typed WHERE k = 21 AND b = 'no'`, `SELECT b FROM typed WHERE k = 22 AND b = 'yes'`,
		`SELECT a FROM typed WHERE k = 23 AND a = '{2,2}'`, `SELECT a FROM typed WHERE k = 24 AND a = '{0,2}'`,
		`SELECT i FROM typed WHERE k = 25 AND i BETWEEN -3 AND 3`, `SELECT i FROM typed WHERE k = 26 AND i BETWEEN 5 AND 9`,
		`SELECT i FROM typed WHERE k = 27 AND s IS DISTINCT FROM 'v27'`, `SELECT i FROM typed WHERE k = 28 AND s IS DISTINCT FROM 'v0'`,
		`SELECT k, i FROM typed WHERE k = 29 LIMIT 1 OFFSET 0`, `SELECT k, i FROM typed WHERE k = 30 LIMIT 0 OFFSET 1`,
		`SELECT k, i FROM typed WHERE k = 31 ORDER BY 1`, `SELECT k, i FROM typed WHERE k = 32 ORDER BY 2`,
		`SELECT i FROM typed WHERE k = -2147483648`, `SELECT i FROM typed WHERE k = 2147483648`,
		`UPDATE typed SET vc = 'short' WHERE k = 33`, `UPDATE typed SET vc = 'too long' WHERE k = 34`,
		`UPDATE typed SET i = i + -1, s = 'upd' WHERE k = 35 RETURNING i, s, k`, `UPDATE typed SET i = i + 2, s = 'upd2' WHERE k = 36 RETURNING i, s, k`,
		`INSERT INTO typed (k, i, s, vc, n) VALUES (1000, 1, 'ins', 'x', 1.25) RETURNING *`, `INSERT INTO typed (k, i, s, vc, n) VALUES (1001, 2, 'ins2', 'y', 2) RETURNING *`,
		`INSERT INTO typed (k, i) VALUES (1000, 3)`, `INSERT INTO typed (k, i, s) VALUES (1002, 99999999999, 'big')`,
		`DELETE FROM typed WHERE k = 1000`, `DELETE FROM typed WHERE k = 1001 RETURNING k`,
		`SELECT count(*) FROM typed WHERE k = 37 AND concat(s, 'x') = 'v37x'`, `SELECT count(*) FROM typed WHERE k = 38 AND concat(s, 'y') = 'v38y'`,
		// On the catalog node, writes without a result run prepared.
		`UPDATE plainw SET n = n + 1, v = 'u' WHERE k = 3`, `UPDATE plainw SET n = n + -4, v = 'it''s' WHERE k = 4`,
		`INSERT INTO plainw (k, v) VALUES (100, 'new')`, `INSERT INTO plainw (k, v) VALUES (4, 'dup')`,
		`DELETE FROM plainw WHERE k = 100`, `DELETE FROM plainw WHERE k = 5 AND v = 'x'`,
		`UPDATE plainw SET n = 9 WHERE k = 6 RETURNING n`, `SELECT n, v FROM plainw WHERE k = 4`,
	}
	t.Run("outside a transaction", func(t *testing.T) {
		bothWires(t, direct, proxied, query(statements...)...)
	})
	t.Run("extended protocol, values as literals", func(t *testing.T) {
		// A driver's statement without parameters (JDBC's Statement):
		// unnamed Parse, Bind, Execute; and with a portal Describe and
		// binary results.
		// Left out: statements PostgreSQL refuses while it analyzes them,
		// at Parse, which the proxy answers at once and refuses at Bind
		// (the same SQLSTATE, one ParseComplete more), with or without
		// prepared statements.
		refusedAtParse := func(sql string) bool {
			return strings.Contains(sql, "i = 'x'") || strings.Contains(sql, "2026-13-01")
		}
		var rounds [][]pgproto3.FrontendMessage
		for _, sql := range statements {
			if !refusedAtParse(sql) {
				rounds = append(rounds, seq(execOne("", sql), syncMsg))
			}
		}
		for _, sql := range statements[:12] {
			if refusedAtParse(sql) {
				continue
			}
			rounds = append(rounds, []pgproto3.FrontendMessage{
				&pgproto3.Parse{Query: sql},
				&pgproto3.Bind{ResultFormatCodes: []int16{1}},
				&pgproto3.Describe{ObjectType: 'P'},
				&pgproto3.Execute{},
				&pgproto3.Sync{},
			})
		}
		bothWires(t, direct, proxied, rounds...)
	})
	t.Run("a statement that may be routed again, then a commit across nodes, in one batch", func(t *testing.T) {
		// The commit plays the batch before its Sync: the first
		// statement can no longer be routed again then. The proxy used
		// to crash at the Sync (a slice past the steps it had played).
		a, b := keyOnNode(t, 0, "typed", "k"), keyOnNode(t, 1, "typed", "k")
		bothWires(t, direct, proxied, seq(
			execOne("", fmt.Sprintf("SELECT i FROM typed WHERE k = %d", a)),
			execOne("", "BEGIN"),
			execOne("", fmt.Sprintf("UPDATE typed SET n = 1 WHERE k = %d", a)),
			execOne("", fmt.Sprintf("UPDATE typed SET n = 2 WHERE k = %d", b)),
			execOne("", "COMMIT"),
			syncMsg))
	})
	t.Run("a Query inside an extended batch", func(t *testing.T) {
		// PostgreSQL answers the batch's messages so far, then the
		// Query; the proxy used to drop the batch's queued answers at the
		// Query, and crash at the Sync after a statement that may be
		// routed again.
		bothWires(t, direct, proxied,
			seq(execOne("", "SELECT i FROM typed WHERE k = 5"), []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT s FROM typed WHERE k = 6"}}, syncMsg),
			seq(execOne("", "SELECT i FROM typed WHERE k = 7"), syncMsg))
		// After an error in the batch the Query is discarded with the
		// rest up to the Sync: one ReadyForQuery, then the session goes
		// on in step.
		for _, w := range []*wire{direct, proxied} {
			w.send(seq(execOne("", "SELECT i FROM typed WHERE k = 5 AND i = 1/0"), []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT s FROM typed WHERE k = 6"}}, syncMsg)...)
		}
		ready := func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.ReadyForQuery); return ok }
		if got, want := proxied.read(ready), direct.read(ready); got != want {
			t.Fatalf("a Query after an error in the batch:\n got  %s\n want %s (PostgreSQL)", got, want)
		}
		bothWires(t, direct, proxied, seq(execOne("", "SELECT i FROM typed WHERE k = 8"), syncMsg))
	})
	t.Run("in a transaction", func(t *testing.T) {
		bothWires(t, direct, proxied, query(append(append([]string{"BEGIN"}, statements[:12]...), "COMMIT")...)...)
		bothWires(t, direct, proxied, query("BEGIN", `UPDATE typed SET i = 5 WHERE k = 40`, `SELECT k FROM typed WHERE k = 40 AND i = 'x'`, `SELECT i FROM typed WHERE k = 40`, "ROLLBACK", `SELECT i FROM typed WHERE k = 40`)...)
	})

	// The check: the statements are on the backend, with parameters.
	prepared, err := queryStrings(t, c, `SELECT statement FROM pg_prepared_statements WHERE (statement LIKE '%.typed %' OR statement LIKE '%plainw%') AND statement NOT LIKE '%pg_prepared_statements%' ORDER BY statement`)
	if err != nil {
		t.Fatal(err)
	}
	withParams := 0
	for _, s := range prepared {
		if !strings.Contains(s, "$1") {
			// The extended-protocol round's statements of shapes that run
			// as text; the others share the prepared form.
			astext := []string{"ORDER BY", "concat", "2147483648", "RETURNING n", "SELECT n, v FROM plainw"}
			if !slices.ContainsFunc(astext, func(w string) bool { return strings.Contains(s, w) }) {
				t.Fatalf("an extended-protocol statement with literals was prepared as its text: %s", s)
			}
			continue
		}
		if strings.Contains(s, "ORDER BY") || strings.Contains(s, "concat") || strings.Contains(s, "plainw") && (strings.Contains(s, "RETURNING") || strings.HasPrefix(s, "SELECT")) {
			t.Fatalf("a shape that must run as its text was prepared: %s", s)
		}
		if strings.Contains(s, "WHERE k = $1") || strings.Contains(s, "WHERE k = $3") {
			withParams++
		}
	}
	if !slices.Contains(prepared, `UPDATE plainw SET n = n + $1, v = $2 WHERE k = $3`) {
		t.Fatalf("the UPDATE of a table on the catalog node did not run prepared; the backend holds:\n%s", strings.Join(prepared, "\n"))
	}
	if withParams < 5 {
		t.Fatalf("%d statements with parameters prepared on the catalog node's backend, want at least 5; it holds:\n%s", withParams, strings.Join(prepared, "\n"))
	}
	t.Logf("%d statements prepared on the catalog node's backend", len(prepared))

	t.Run("result columns changed through another proxy", func(t *testing.T) {
		other := startProxy(t, 2)
		oc := connect(t, other.DSN("lattice"))
		before := proxied.round(&pgproto3.Query{String: `SELECT * FROM typed WHERE k = 50`})
		mustExec(t, oc, `ALTER TABLE typed ADD COLUMN extra integer DEFAULT 7`)
		after := proxied.round(&pgproto3.Query{String: `SELECT * FROM typed WHERE k = 50`})
		if !strings.Contains(after, ",7)") || strings.Contains(after, "Error") {
			t.Fatalf("after ALTER through another proxy:\n got  %s\n before %s", after, before)
		}
	})
}

// keyOnNode is the smallest value of key column key of tree's rows on node i.
func keyOnNode(t *testing.T, i int, tree, key string) int64 {
	t.Helper()
	ctx := context.Background()
	c := connect(t, testNodeDSN(t, i))
	var schema string
	if err := c.QueryRow(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND n.nspname LIKE 'lattice\_s%' ORDER BY 1 LIMIT 1`, tree).Scan(&schema); err != nil {
		t.Fatalf("no shard of %s on node %d: %v", tree, i+1, err)
	}
	var k int64
	if err := c.QueryRow(ctx, fmt.Sprintf("SELECT min(%s) FROM %s.%s", key, schema, tree)).Scan(&k); err != nil {
		t.Fatal(err)
	}
	return k
}
