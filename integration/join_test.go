package integration

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/pgshard"
)

// TestJoinsEqualPostgres runs statements over several references to one
// tree (self-joins, subqueries, CTEs, set operations, writes with joins)
// on a tree of 16 shards over 3 nodes, and compares each with the same
// statement on plain tables holding the same rows: column names, types,
// rows, and their order where there is an ORDER BY. Refused forms are
// refused with 0A000 and a hint.
func TestJoinsEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	const cols = `(customer_id bigint, order_id integer, total numeric(10,2), status text, parent integer, PRIMARY KEY (customer_id, order_id))`
	const fill = `SELECT c, o, ((c * 37 + o * 11) % 1000) / 10.0, (ARRAY['open','paid','void'])[1 + (c + o) % 3],
		CASE WHEN o > 1 THEN o - 1 END
		FROM generate_series(1, 60) c, generate_series(1, 1 + c % 5) o`
	mustExec(t, c, `CREATE TABLE jo `+cols)
	mustExec(t, c, `INSERT INTO jo `+fill)
	mustExec(t, c, `SELECT lattice_create_tree('jo', 'customer_id', shard_count => 16)`)
	mustExec(t, c, `CREATE TABLE jo_plain `+cols)
	mustExec(t, c, `INSERT INTO jo_plain `+fill)
	mustExec(t, c, `CREATE TABLE jo_status (status text PRIMARY KEY, label text)`)
	mustExec(t, c, `INSERT INTO jo_status VALUES ('open', 'Open'), ('paid', 'Paid'), ('void', 'Void')`)

	cases := []struct {
		sql     string
		ordered bool
		args    []any
	}{
		// The key fixed: one shard.
		{sql: `SELECT a.order_id, b.order_id AS prev FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.parent WHERE a.customer_id = 14 ORDER BY 1`, ordered: true},
		{sql: `SELECT a.order_id, b.total FROM jo a LEFT JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.order_id + 1 WHERE a.customer_id = $1 ORDER BY 1`, ordered: true, args: []any{9}},
		{sql: `SELECT a.order_id, b.order_id FROM jo a RIGHT JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id + 3 WHERE b.customer_id = 4 ORDER BY 2`, ordered: true},
		{sql: `SELECT a.order_id, b.order_id FROM jo a FULL JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id + 2 WHERE a.customer_id = 9 OR a.customer_id IS NULL AND b.customer_id = 9`},
		{sql: `SELECT a.order_id FROM jo a JOIN jo b USING (customer_id) WHERE a.customer_id = 14 AND b.status = 'paid'`},
		{sql: `SELECT order_id, total FROM jo a WHERE a.customer_id = 24 AND EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.total > a.total) ORDER BY order_id`, ordered: true},
		{sql: `SELECT order_id FROM jo a WHERE a.customer_id = 24 AND NOT EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id = a.order_id + 1)`},
		{sql: `SELECT order_id FROM jo WHERE customer_id = 19 AND customer_id IN (SELECT customer_id FROM jo WHERE status = 'void')`},
		{sql: `SELECT order_id FROM jo a WHERE a.customer_id = 19 AND a.customer_id NOT IN (SELECT b.customer_id FROM jo b WHERE b.total > 99)`},
		{sql: `SELECT a.order_id, (SELECT count(*) FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id < a.order_id) AS before FROM jo a WHERE a.customer_id = 29 ORDER BY 1`, ordered: true},
		{sql: `SELECT a.order_id, l.total FROM jo a, LATERAL (SELECT b.total FROM jo b WHERE b.customer_id = a.customer_id ORDER BY b.total DESC LIMIT 1) l WHERE a.customer_id = 34`},
		{sql: `WITH mine AS (SELECT * FROM jo WHERE customer_id = 44) SELECT m.order_id, m.total, b.order_id FROM mine m JOIN jo b ON b.customer_id = m.customer_id AND b.order_id = m.parent WHERE b.customer_id = 44 ORDER BY m.order_id`, ordered: true},
		{sql: `SELECT status FROM jo WHERE customer_id = 44 UNION SELECT status FROM jo WHERE customer_id = 44 AND total > 1`},
		{sql: `SELECT order_id FROM jo WHERE customer_id = $1 INTERSECT SELECT order_id FROM jo WHERE customer_id = $1 AND status <> 'void'`, args: []any{49}},
		{sql: `SELECT order_id FROM jo WHERE customer_id = 49 EXCEPT ALL SELECT order_id FROM jo WHERE customer_id = 49 AND status = 'paid' ORDER BY 1`, ordered: true},
		{sql: `SELECT a.status, count(*), sum(b.total) FROM jo a JOIN jo b ON a.customer_id = b.customer_id WHERE a.customer_id = 54 GROUP BY a.status ORDER BY 1`, ordered: true},
		{sql: `SELECT a.order_id FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id WHERE b.customer_id = 54 ORDER BY 1 FOR UPDATE OF a`, ordered: true},
		// The key not fixed: every shard, merged.
		{sql: `SELECT a.customer_id, a.order_id, b.order_id AS prev FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.parent`},
		{sql: `SELECT a.customer_id, a.order_id, b.total FROM jo a LEFT JOIN jo b ON b.customer_id = a.customer_id AND b.order_id = a.order_id + 1 ORDER BY a.total DESC, a.customer_id, a.order_id LIMIT 20`, ordered: true},
		{sql: `SELECT a.customer_id, b.order_id FROM jo a FULL JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id + 4`},
		{sql: `SELECT customer_id, order_id FROM jo a WHERE EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.status = 'void' AND b.order_id <> a.order_id) ORDER BY 1, 2 LIMIT 15 OFFSET 3`, ordered: true},
		{sql: `SELECT customer_id, order_id FROM jo a WHERE NOT EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.total > a.total)`},
		{sql: `SELECT customer_id, order_id FROM jo WHERE customer_id IN (SELECT customer_id FROM jo WHERE status = 'void' AND total > 50)`},
		{sql: `SELECT customer_id, order_id FROM jo WHERE customer_id NOT IN (SELECT customer_id FROM jo WHERE order_id > 3)`},
		{sql: `SELECT a.customer_id, a.order_id, (SELECT max(b.total) FROM jo b WHERE b.customer_id = a.customer_id) AS top FROM jo a ORDER BY top DESC, 1, 2 LIMIT 10`, ordered: true},
		{sql: `SELECT a.customer_id, l.n FROM jo a CROSS JOIN LATERAL (SELECT count(*) AS n FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id <= a.order_id) l WHERE a.status = $1`, args: []any{"paid"}},
	}
	// Refused, with a hint that names the fix.
	refusedCases := []struct{ sql, hint string }{
		{`SELECT * FROM jo a JOIN jo b ON a.order_id = b.order_id WHERE a.customer_id = 1`, "shard keys"},
		{`SELECT * FROM jo a, jo b WHERE a.customer_id = 1`, "equal shard keys"},
		{`SELECT * FROM jo a WHERE a.total > (SELECT avg(total) FROM jo)`, "equal shard keys"},
		{`SELECT * FROM jo JOIN jo_status USING (status) WHERE customer_id = 1`, "reference table"},
		{`SELECT * FROM jo a JOIN jo b USING (customer_id) JOIN jo_status s ON s.status = b.status WHERE a.customer_id = 1`, "reference table"},
		{`SELECT count(*) FROM jo a JOIN jo b USING (customer_id)`, "customer_id = <value>"},
		{`SELECT customer_id FROM jo UNION SELECT customer_id FROM jo`, "customer_id = <value>"},
	}

	// Writes over several references, fixed to one key, compared by their
	// RETURNING rows in a transaction that is rolled back.
	writes := []string{
		`UPDATE jo a SET total = b.total FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id = 1 AND a.customer_id = 7 RETURNING a.order_id, a.total`,
		`DELETE FROM jo a USING jo b WHERE b.customer_id = a.customer_id AND b.order_id = a.order_id + 1 AND a.customer_id = 8 RETURNING a.order_id`,
		`INSERT INTO jo (customer_id, order_id, total, status) SELECT customer_id, order_id + 100, total, status FROM jo WHERE customer_id = 9 RETURNING order_id, total`,
		`UPDATE jo a SET status = 'void' WHERE a.customer_id = 14 AND a.total < (SELECT avg(b.total) FROM jo b WHERE b.customer_id = a.customer_id) RETURNING order_id`,
		`WITH d AS (DELETE FROM jo WHERE customer_id = 11 AND status = 'open' RETURNING total) UPDATE jo SET total = (SELECT coalesce(sum(total), 0) FROM d) WHERE customer_id = 11 AND order_id = 2 RETURNING total`,
	}

	plain := regexp.MustCompile(`\bjo\b`)
	onPlain := func(sql string) string { return plain.ReplaceAllString(sql, "jo_plain") }
	modes := map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol}
	for name, mode := range modes {
		for _, tc := range cases {
			t.Run(name+"/"+tc.sql, func(t *testing.T) {
				args := append([]any{mode}, tc.args...)
				gotHead, got, err := queryTyped(t, c, tc.sql, args...)
				if err != nil {
					t.Fatalf("through the tree: %v", err)
				}
				wantHead, want, err := queryTyped(t, c, onPlain(tc.sql), args...)
				if err != nil {
					t.Fatalf("on the plain table: %v", err)
				}
				if gotHead != wantHead {
					t.Fatalf("columns through the tree %s, on one table %s", gotHead, wantHead)
				}
				if len(want) == 0 {
					t.Fatal("the statement returns no row: the case proves nothing")
				}
				if !tc.ordered {
					slices.Sort(got)
					slices.Sort(want)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%d rows through the tree, %d on one table; first difference:\n%s", len(got), len(want), firstDiff(got, want))
				}
			})
		}
		for _, tc := range refusedCases {
			t.Run(name+"/refused/"+tc.sql, func(t *testing.T) {
				_, _, err := queryTyped(t, c, tc.sql, mode)
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Hint, tc.hint) {
					t.Fatalf("got %v (hint %q), want 0A000 with a hint naming %q", err, hintOf(err), tc.hint)
				}
			})
		}
		for _, sql := range writes {
			t.Run(name+"/write/"+sql, func(t *testing.T) {
				run := func(sql string) (string, []string) {
					ctx := context.Background()
					tx, err := c.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback(ctx)
					rows, err := tx.Query(ctx, sql, mode)
					if err != nil {
						t.Fatalf("%s: %v", sql, err)
					}
					var head []string
					for _, f := range rows.FieldDescriptions() {
						head = append(head, f.Name)
					}
					out, err := collectStrings(rows)
					if err != nil {
						t.Fatalf("%s: %v", sql, err)
					}
					slices.Sort(out)
					return strings.Join(head, ","), out
				}
				gotHead, got := run(sql)
				wantHead, want := run(onPlain(sql))
				if gotHead != wantHead || !slices.Equal(got, want) || len(want) == 0 {
					t.Fatalf("through the tree %s %v, on one table %s %v", gotHead, got, wantHead, want)
				}
			})
		}
	}
}

// TestJoinsMixedShard puts shard 0 of a tree in the state of a split
// source before the release (it also holds a copy of every row of shard
// 1, and is marked mixed): every tree reference of a join over several
// shards reads it through its slot predicate, so the preserved side of a
// RIGHT or FULL join, and each side of a self-join, sees each row once.
func TestJoinsMixedShard(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	const rows = 400
	mustExec(t, c, "CREATE TABLE mj (k text PRIMARY KEY, v int NOT NULL)")
	mustExec(t, c, "INSERT INTO mj SELECT 'm' || g, g FROM generate_series(1, 400) g")
	mustExec(t, c, "SELECT lattice_create_tree('mj', 'k', shard_count => 4)")
	store := harnessStore(t)
	tree, m := storedTree(t, ctx, store, "mj")
	nodeIndex := func(name string) int { return int(name[1] - '1') }
	srcConn := ctConnect(t, ctx, testNodeDSN(t, nodeIndex(m.Shards[0].Node)))
	movedConn := ctConnect(t, ctx, testNodeDSN(t, nodeIndex(m.Shards[1].Node)))
	var buf strings.Builder
	if _, err := movedConn.PgConn().CopyTo(ctx, &buf, "COPY "+pgshard.ShardTable(tree, 1)+" TO STDOUT"); err != nil {
		t.Fatal(err)
	}
	if tag, err := srcConn.PgConn().CopyFrom(ctx, strings.NewReader(buf.String()), "COPY "+pgshard.ShardTable(tree, 0)+" FROM STDIN"); err != nil || tag.RowsAffected() == 0 {
		t.Fatalf("copying shard 1 into shard 0: %v, %v", tag, err)
	}
	next := m.Clone()
	s0 := next.Shards[0]
	s0.Mixed = true
	next.Shards[0] = s0
	if err := store.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ctx, store, "mj", next.Epoch)

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		for _, sql := range []string{
			"SELECT a.k FROM mj a JOIN mj b ON a.k = b.k",
			"SELECT b.k FROM mj a RIGHT JOIN mj b ON a.k = b.k AND a.v < 0",
			"SELECT coalesce(a.k, b.k) FROM mj a FULL JOIN mj b ON a.k = b.k AND a.v = b.v + 1",
			"SELECT a.k FROM mj a WHERE NOT EXISTS (SELECT 1 FROM mj b WHERE b.k = a.k AND b.v <> a.v)",
		} {
			got, err := queryStrings(t, c, sql, mode)
			if err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
			seen := map[string]int{}
			for _, k := range got {
				seen[k]++
			}
			for k, n := range seen {
				if n != 1 && !strings.Contains(sql, "FULL") || n > 2 {
					t.Fatalf("%s (mode %v): key %s read %d times", sql, mode, k, n)
				}
			}
			want := rows
			if strings.Contains(sql, "FULL") {
				want = 2 * rows // no row matches: each side's rows once, padded
			}
			if len(got) != want || len(seen) != rows {
				t.Fatalf("%s (mode %v): %d rows of %d keys, want %d rows of %d keys", sql, mode, len(got), len(seen), want, rows)
			}
		}
	}
}
