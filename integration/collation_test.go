package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestFanOutCollations sorts and groups text over 16 shards on 2 nodes
// under a collation that does not order bytes (ICU's en-US) and under the
// databases' own (C in the tests), and compares every answer with the
// same statement on one plain table on the catalog node: PostgreSQL's own
// order. Char(n), DISTINCT and GROUP BY, min and max, set operations in
// the final step, a COLLATE in the statement, and a column's collation
// changed by DDL are covered, in the
// simple and the extended protocol.
func TestFanOutCollations(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	ctx := context.Background()
	const cols = `(id int PRIMARY KEY, t text COLLATE "en-US-x-icu", c char(12), d text, k int)`
	words := []string{"a", "B", "b", "é", "e", "E", "Z", "ab", "a b", "_x", "1", "Ärger", "zebra", "Zoo", "ß", "ss", "-a", "a-", "", "résumé", "resume", "Resume"}
	var vals []string
	for i := 1; i <= 300; i++ {
		w := words[(i*7)%len(words)]
		v := "'" + strings.ReplaceAll(w, "'", "''") + "'"
		t := v
		if i%13 == 0 {
			t = "NULL"
		}
		vals = append(vals, fmt.Sprintf("(%d, %s, %s, %s, %d)", i, t, v, v, i%17))
	}
	treeWithTwin(t, c, "coll", cols, " VALUES "+strings.Join(vals, ", "))

	// The data must tell the collations apart, or the test proves nothing.
	icu, _ := queryStrings(t, c, `SELECT t FROM coll_plain ORDER BY t, id`)
	bytewise, _ := queryStrings(t, c, `SELECT t FROM coll_plain ORDER BY t COLLATE "C", id`)
	if slices.Equal(icu, bytewise) {
		t.Fatal(`the test rows sort the same under en-US-x-icu and "C"`)
	}

	cases := []string{
		// Sorted by PostgreSQL on the catalog node: the column's ICU collation.
		`SELECT t FROM coll ORDER BY t`,
		`SELECT id, t FROM coll ORDER BY t DESC NULLS LAST, id LIMIT 40 OFFSET 3`,
		`SELECT t, id FROM coll WHERE id BETWEEN 20 AND 220 ORDER BY 1 NULLS FIRST, 2`,
		`SELECT id FROM coll ORDER BY upper(t), id LIMIT 50`,
		`SELECT id, d FROM coll ORDER BY d COLLATE "en-US-x-icu", id`,
		`SELECT id FROM coll ORDER BY k, t, id`,
		// Merged as bytes: the database's collation is C.
		`SELECT c FROM coll WHERE id BETWEEN 5 AND 260 ORDER BY c`,
		`SELECT id, d FROM coll ORDER BY d DESC, id LIMIT 25`,
		`SELECT id, t FROM coll ORDER BY t COLLATE "C", id LIMIT 30`,
		// The final step of a two-step plan groups and sorts under the
		// partial columns' collations (sysbench's distinct_ranges, sum_ranges).
		`SELECT DISTINCT t FROM coll ORDER BY t`,
		`SELECT DISTINCT c FROM coll WHERE id BETWEEN 10 AND 200 ORDER BY c`,
		`SELECT t, count(*) FROM coll GROUP BY t ORDER BY t DESC LIMIT 8`,
		`SELECT min(t), max(t), min(d), max(d) FROM coll`,
		`SELECT k, min(t), max(t) FROM coll GROUP BY k ORDER BY k`,
		`SELECT sum(k) FROM coll WHERE id BETWEEN 10 AND 180`,
		// Set operations in the final step compare and order under the
		// collation the set operation gives each column.
		`SELECT t FROM coll WHERE k < 9 UNION SELECT d COLLATE "en-US-x-icu" FROM coll WHERE k > 3 ORDER BY 1 NULLS FIRST`,
		`SELECT t FROM coll EXCEPT ALL SELECT t FROM coll WHERE k > 15 ORDER BY 1 DESC`,
		`SELECT d FROM coll INTERSECT ALL SELECT t COLLATE "C" FROM coll WHERE k % 2 = 0 ORDER BY 1`,
		`SELECT c FROM coll WHERE k = 1 UNION SELECT c FROM coll WHERE k = 2 ORDER BY 1 LIMIT 5`,
	}
	modes := map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol}
	check := func(t *testing.T, sql string, mode pgx.QueryExecMode) {
		t.Helper()
		sameAsTwin(t, c, "coll", sql, mode) // c: the connection of the moment
	}
	for name, mode := range modes {
		for _, sql := range cases {
			t.Run(name+"/"+sql, func(t *testing.T) { check(t, sql, mode) })
		}
	}

	// DDL through the proxy starts a new result epoch: the collation is
	// probed again, and the rows now merge as bytes.
	t.Run("collation changed by DDL", func(t *testing.T) {
		for _, tbl := range []string{"coll", "coll_plain"} {
			if _, err := c.Exec(ctx, `ALTER TABLE `+tbl+` ALTER COLUMN t TYPE text COLLATE "C"`); err != nil {
				t.Fatal(err)
			}
		}
		// A new connection: the old one's prepared statements fail with
		// 0A000 after the column changed, as they would on PostgreSQL.
		c = connect(t, p.DSN("lattice"))
		for _, mode := range modes {
			check(t, `SELECT id, t FROM coll ORDER BY t, id`, mode)
			check(t, `SELECT DISTINCT t FROM coll ORDER BY t`, mode)
		}
	})
}

// TestFanOutMergesCodePoints: text under C.UTF-8 (initdb's default on
// Debian) orders by code point, which in UTF8 is the order of the bytes,
// so the proxy merges it itself, as it merges COLLATE "C", rather than
// gathering the rows for a sort on the catalog node. Answers match one
// plain table, and EXPLAIN names the merge. A node whose shards order
// the column otherwise (here an ICU collation set on them behind the
// proxy's back) makes the statement fail, never answer in a wrong order.
func TestFanOutMergesCodePoints(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	ctx := context.Background()
	var have bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_collation WHERE collname = 'C.utf8')`).Scan(&have); err != nil {
		t.Fatal(err)
	}
	if !have {
		t.Skip(`the catalog node has no "C.utf8" collation (no C.UTF-8 locale on this machine)`)
	}
	const cols = `(id int PRIMARY KEY, u text COLLATE "C.utf8", b char(6) COLLATE "C.utf8")`
	words := []string{"a", "B", "b", "é", "e", "E", "Z", "ab", "a b", "_x", "1", "Ärger", "zebra", "Zoo", "ß", "ss", "-a", "", "ж", "日本", "😀", "\uFFFD", "\U00010000", "\uE000"}
	var vals []string
	for i := 1; i <= 400; i++ {
		w := "'" + words[(i*7)%len(words)] + "'"
		u := w
		if i%11 == 0 {
			u = "NULL"
		}
		vals = append(vals, fmt.Sprintf("(%d, %s, %s)", i, u, w))
	}
	treeWithTwin(t, c, "cu", cols, " VALUES "+strings.Join(vals, ", "))

	cases := []string{
		`SELECT u FROM cu ORDER BY u`,
		`SELECT id, u FROM cu ORDER BY u DESC NULLS LAST, id LIMIT 60 OFFSET 5`,
		`SELECT b, id FROM cu WHERE id BETWEEN 30 AND 300 ORDER BY b, id`,
		`SELECT id FROM cu ORDER BY u COLLATE "C.utf8" NULLS FIRST, id`,
	}
	modes := map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol}
	// Text in binary format is the same bytes: merged too (sysbench's
	// driver asks for binary results).
	runModes := map[string][]any{"binary": {pgx.QueryExecModeCacheStatement, pgx.QueryResultFormats{pgx.BinaryFormatCode}}}
	for name, mode := range modes {
		runModes[name] = []any{mode}
	}
	for name, mode := range runModes {
		for _, sql := range cases {
			t.Run(name+"/"+sql, func(t *testing.T) {
				sameAsTwin(t, c, "cu", sql, mode...)
				plan, err := queryStrings(t, c, "EXPLAIN "+sql, mode[0])
				if err != nil {
					t.Fatal(err)
				}
				merge := ""
				for _, line := range plan {
					if strings.Contains(line, "Merge:") {
						merge = line
					}
				}
				if !strings.Contains(merge, "k-way merge") || strings.Contains(merge, "sorted by PostgreSQL") {
					t.Fatalf("EXPLAIN: %q, want the proxy's k-way merge", merge)
				}
			})
		}
	}

	t.Run("a node that orders otherwise", func(t *testing.T) {
		n2 := nodeConn(t, ctx, "n2")
		schemas, err := queryStrings(t, n2, `SELECT n.nspname FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.relname = 'cu' AND n.nspname LIKE 'lattice_s%'`)
		if err != nil || len(schemas) == 0 {
			t.Fatalf("the shards of cu on n2: %v %v", schemas, err)
		}
		for _, s := range schemas {
			s = strings.Trim(s, `"`)
			mustExec(t, n2, `ALTER TABLE `+s+`.cu ALTER COLUMN u TYPE text COLLATE "en-US-x-icu"`)
		}
		for name, mode := range runModes {
			_, err := queryStrings(t, c, `SELECT u FROM cu ORDER BY u`, mode...)
			var e *pgconn.PgError
			if errors.As(err, &e) && e.Code == "0A000" {
				// The statement prepared on n2 before the ALTER there no
				// longer returns its result type; the proxy prepares it
				// again on the next execution, as the issue of cached
				// plans asks.
				_, err = queryStrings(t, c, `SELECT u FROM cu ORDER BY u`, mode...)
			}
			if !errors.As(err, &e) || e.Code != "XX000" || !strings.Contains(e.Message, "came out of order") {
				t.Errorf("%s: %v, want XX000: a part came out of order", name, err)
			}
		}
	})
}

// treeWithTwin makes tree name (key id, 16 shards) and name_plain, an
// ordinary table of the same rows on the catalog node, whose answers are
// PostgreSQL's own.
func treeWithTwin(t *testing.T, c *pgx.Conn, name, cols, values string) {
	t.Helper()
	mustExec(t, c, `CREATE TABLE `+name+` `+cols)
	mustExec(t, c, `INSERT INTO `+name+values)
	mustExec(t, c, `SELECT lattice_create_tree('`+name+`', 'id', shard_count => 16)`)
	mustExec(t, c, `CREATE TABLE `+name+`_plain `+cols)
	mustExec(t, c, `INSERT INTO `+name+`_plain`+values)
}

// sameAsTwin runs sql through the tree and on its twin (FROM name made
// FROM name_plain) and fails on any difference of columns or rows.
func sameAsTwin(t *testing.T, c *pgx.Conn, name, sql string, args ...any) {
	t.Helper()
	gotHead, got, err := queryTyped(t, c, sql, args...)
	if err != nil {
		t.Fatalf("through the tree: %v", err)
	}
	wantHead, want, err := queryTyped(t, c, strings.ReplaceAll(sql, "FROM "+name, "FROM "+name+"_plain"), args...)
	if err != nil {
		t.Fatalf("on the plain table: %v", err)
	}
	if gotHead != wantHead || !slices.Equal(got, want) {
		t.Fatalf("%s %d rows through the tree, %s %d on one table; first difference:\n%s", gotHead, len(got), wantHead, len(want), firstDiff(got, want))
	}
}
