package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// queryStrings runs sql and returns each row's values printed as text.
func queryStrings(t *testing.T, c *pgx.Conn, sql string, args ...any) ([]string, error) {
	t.Helper()
	_, rows, err := queryTyped(t, c, sql, args...)
	return rows, err
}

// queryTyped runs sql and returns its columns' names and type OIDs, and
// each row's values printed as text (Go values, so their types count too).
func queryTyped(t *testing.T, c *pgx.Conn, sql string, args ...any) (string, []string, error) {
	t.Helper()
	rows, err := c.Query(context.Background(), sql, args...)
	if err != nil {
		return "", nil, err
	}
	var head []string
	for _, f := range rows.FieldDescriptions() {
		head = append(head, fmt.Sprintf("%s:%d", f.Name, f.DataTypeOID))
	}
	out, err := collectStrings(rows)
	return strings.Join(head, ","), out, err
}

func collectStrings(rows pgx.Rows) ([]string, error) {
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprint(vals...))
	}
	return out, rows.Err()
}

// TestFanOut runs SELECTs without the shard key on a tree of 16 shards over
// 3 nodes and compares each with the same statement on one plain table
// holding the same rows; order counts only where there is an ORDER BY.
func TestFanOut(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	// n holds numerics equal but differently written (1.0, 1.00): they
	// must fall in one group.
	const cols = `(id bigint PRIMARY KEY, qty integer, price numeric(10,2), name text, created timestamptz, ok boolean, n numeric)`
	const fill = `SELECT i, (i * 7) %% 50, CASE WHEN i %% 11 = 0 THEN NULL ELSE ((i * 13) %% 1000) / 10.0 END,
		'name ' || ((i * 17) %% 300), timestamptz '2026-01-01' + i * interval '37 minutes', i %% 3 = 0,
		CASE i %% 4 WHEN 0 THEN 1.0 WHEN 1 THEN 1.00 WHEN 2 THEN 2.5 END
		FROM generate_series(1, 3000) i`
	mustExec(t, c, `CREATE TABLE fan `+cols)
	mustExec(t, c, fmt.Sprintf(`INSERT INTO fan `+fill))
	mustExec(t, c, `SELECT lattice_create_tree('fan', 'id', shard_count => 16)`)
	mustExec(t, c, `CREATE TABLE plain `+cols)
	mustExec(t, c, fmt.Sprintf(`INSERT INTO plain `+fill))

	cases := []struct {
		sql     string
		ordered bool
		args    []any
	}{
		{sql: `SELECT id, qty FROM fan WHERE qty > 40`},
		{sql: `SELECT * FROM fan`},
		{sql: `SELECT id, price FROM fan WHERE price IS NULL`},
		{sql: `SELECT id, qty FROM fan ORDER BY qty, id`, ordered: true},
		{sql: `SELECT id FROM fan ORDER BY qty DESC, id DESC LIMIT 25`, ordered: true},
		{sql: `SELECT id, price FROM fan ORDER BY price DESC NULLS LAST, id LIMIT 17 OFFSET 5`, ordered: true},
		{sql: `SELECT id, price FROM fan ORDER BY price NULLS FIRST, id LIMIT 40`, ordered: true},
		{sql: `SELECT id, created FROM fan WHERE ok ORDER BY created DESC, id LIMIT 30`, ordered: true},
		{sql: `SELECT id, name FROM fan ORDER BY name COLLATE "C", id LIMIT 50`, ordered: true},
		// The test databases' collation is C: the probe finds it, and the
		// proxy merges text as bytes (collation_test.go sorts under others).
		{sql: `SELECT id, name FROM fan ORDER BY name, id LIMIT 50`, ordered: true},
		{sql: `SELECT id FROM fan ORDER BY qty * -1, id OFFSET 2990`, ordered: true},
		{sql: `SELECT id, ok FROM fan ORDER BY ok, id DESC LIMIT 10`, ordered: true},
		{sql: `SELECT * FROM fan ORDER BY id LIMIT 3`, ordered: true},
		{sql: `SELECT id FROM fan WHERE qty = $1 ORDER BY id LIMIT $2 OFFSET $3`, ordered: true, args: []any{7, 5, 2}},
		{sql: `SELECT id FROM fan ORDER BY id LIMIT 0`, ordered: true},
		// WITH TIES: each node's first rows and their ties, then the
		// statement's over them.
		{sql: `SELECT id, qty FROM fan ORDER BY qty FETCH FIRST 5 ROWS WITH TIES`},
		{sql: `SELECT id, ok FROM fan WHERE qty < $1 ORDER BY ok DESC, qty * 2 FETCH FIRST $2 ROWS WITH TIES`, args: []any{20, 7}},
		// OFFSET among ties skips rows PostgreSQL picks at will: here the
		// order is unique, so the rows after OFFSET are known.
		{sql: `SELECT id FROM fan ORDER BY qty DESC, id OFFSET $1 ROWS FETCH FIRST $2 ROWS WITH TIES`, ordered: true, args: []any{40, 6}},
		{sql: `SELECT name, price FROM fan ORDER BY 2 NULLS FIRST, name FETCH FIRST 4 ROWS WITH TIES`},
		{sql: `SELECT id, qty + 1 AS q FROM fan ORDER BY q DESC, id LIMIT 10`, ordered: true},
		{sql: `SELECT id FROM fan ORDER BY price * 2 NULLS FIRST, id LIMIT 15`, ordered: true},
		{sql: `SELECT id, name FROM fan ORDER BY created DESC LIMIT 5 OFFSET 10`, ordered: true},
		// Every type the merge decodes, in text (simple) and binary (extended).
		{sql: `SELECT id, qty::oid AS o FROM fan ORDER BY o DESC, id LIMIT 20`, ordered: true},
		{sql: `SELECT id, price::float8 AS f, price::float4 AS g FROM fan ORDER BY f NULLS FIRST, g, id LIMIT 25`, ordered: true},
		{sql: `SELECT id, qty::int2 AS s FROM fan ORDER BY s, id DESC LIMIT 15`, ordered: true},
		{sql: `SELECT id, created::date AS d, created::timestamp AS ts FROM fan ORDER BY d DESC, ts, id LIMIT 15`, ordered: true},
		{sql: `SELECT id, md5(id::text)::uuid AS u FROM fan ORDER BY u LIMIT 15`, ordered: true},
		// Aggregates, GROUP BY, HAVING, DISTINCT.
		{sql: `SELECT count(*) FROM fan`},
		{sql: `SELECT count(price), count(*), count(n) FROM fan`},
		{sql: `SELECT sum(qty), sum(id), sum(price), sum(n) FROM fan`},
		{sql: `SELECT min(price), max(price), min(name), max(created), min(id), max(ok::int) FROM fan`},
		{sql: `SELECT avg(qty), avg(id), avg(price), avg(n) FROM fan`},
		{sql: `SELECT count(*), sum(qty), avg(price), max(id), count(DISTINCT qty) FROM fan WHERE qty > 1000`},
		{sql: `SELECT qty, count(*) FROM fan WHERE qty > 1000 GROUP BY qty`},
		{sql: `SELECT qty, count(*), sum(price), avg(price) FROM fan GROUP BY qty ORDER BY qty`, ordered: true},
		{sql: `SELECT ok, count(*), min(created), max(created) FROM fan GROUP BY ok`},
		{sql: `SELECT qty % 5 AS m, sum(qty) FROM fan GROUP BY m ORDER BY m`, ordered: true},
		{sql: `SELECT qty, count(*) FROM fan GROUP BY qty HAVING count(*) > 60 ORDER BY count(*) DESC, qty`, ordered: true},
		{sql: `SELECT qty, avg(price) FROM fan GROUP BY 1 HAVING avg(price) > 50 ORDER BY 2 DESC, 1 LIMIT 5 OFFSET 2`, ordered: true},
		{sql: `SELECT count(DISTINCT qty), count(DISTINCT price), count(DISTINCT n) FROM fan`},
		{sql: `SELECT ok, count(DISTINCT qty), sum(DISTINCT qty), avg(DISTINCT qty) FROM fan GROUP BY ok ORDER BY ok`, ordered: true},
		{sql: `SELECT count(*) FROM fan GROUP BY n ORDER BY 1`, ordered: true},
		{sql: `SELECT n IS NULL, count(*), sum(n) FROM fan GROUP BY n ORDER BY 2, 3 NULLS FIRST`, ordered: true},
		{sql: `SELECT lower(name) AS l, count(*) FROM fan GROUP BY l ORDER BY lower(name) COLLATE "C" LIMIT 10`, ordered: true},
		{sql: `SELECT qty FROM fan GROUP BY qty ORDER BY sum(price) DESC NULLS LAST, qty LIMIT 7`, ordered: true},
		{sql: `SELECT sum(qty) / count(*) AS ratio, max(qty) - min(qty) AS spread FROM fan`},
		{sql: `SELECT count(*) AS c FROM fan GROUP BY ok HAVING min(qty) = 0 ORDER BY c`, ordered: true},
		{sql: `SELECT ok, avg(qty)::numeric(10,3) AS a FROM fan GROUP BY ok ORDER BY ok`, ordered: true},
		{sql: `SELECT count(*) FROM fan WHERE name LIKE 'name 1%'`},
		{sql: `SELECT max(name COLLATE "C"), min(name COLLATE "C") FROM fan`},
		{sql: `SELECT count(*) FROM fan WHERE qty = $1`, args: []any{14}},
		{sql: `SELECT qty, count(*) FROM fan WHERE price > $1 GROUP BY qty HAVING count(*) >= $2 ORDER BY qty LIMIT $3`, ordered: true, args: []any{10, 40, 6}},
		{sql: `SELECT DISTINCT qty FROM fan`},
		{sql: `SELECT DISTINCT qty, ok FROM fan ORDER BY qty DESC, ok LIMIT 20`, ordered: true},
		{sql: `SELECT DISTINCT ok FROM fan ORDER BY ok`, ordered: true},
		{sql: `SELECT DISTINCT qty % 3 AS r, ok FROM fan ORDER BY 1, 2`, ordered: true},
		{sql: `SELECT DISTINCT count(*) FROM fan GROUP BY qty ORDER BY 1`, ordered: true},
		{sql: `SELECT name, count(*), max(qty) FROM fan GROUP BY name ORDER BY name DESC LIMIT 12`, ordered: true},
		{sql: `SELECT 1 AS one FROM fan HAVING count(*) > 2999`},
		// Aggregates the partial rows cannot combine, grouping sets and
		// DISTINCT ON run whole in the final step, over the gathered rows.
		{sql: `SELECT qty % 5 AS m, count(*) FILTER (WHERE price > $1), sum(n) FILTER (WHERE ok) FROM fan GROUP BY m`, args: []any{40}},
		{sql: `SELECT ok, string_agg(name, ',' ORDER BY name, id) FROM fan WHERE id < 60 GROUP BY ok ORDER BY ok`, ordered: true},
		{sql: `SELECT qty, array_agg(id ORDER BY id DESC) FROM fan WHERE qty < 3 GROUP BY qty HAVING bool_and(id > $1) ORDER BY 1`, ordered: true, args: []any{0}},
		{sql: `SELECT ok, qty % 2 AS p, count(*), sum(price) FROM fan GROUP BY ROLLUP (ok, p) ORDER BY 1, 2, 3`, ordered: true},
		{sql: `SELECT ok, grouping(ok) AS g, count(*) FROM fan GROUP BY CUBE (ok) ORDER BY 1 NULLS FIRST`, ordered: true},
		{sql: `SELECT DISTINCT ON (qty) qty, id, price FROM fan ORDER BY qty, price DESC NULLS LAST, id LIMIT $1`, ordered: true, args: []any{20}},
		{sql: `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY price), percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY qty), mode() WITHIN GROUP (ORDER BY qty) FROM fan`},
		{sql: `SELECT ok, stddev(qty)::numeric(20,6), var_samp(price)::numeric(30,6), bool_or(name LIKE '%7'), bit_or(qty) FROM fan GROUP BY ok`},
		{sql: `SELECT count(DISTINCT (qty, ok)), jsonb_agg(id ORDER BY id) FILTER (WHERE id < 12) FROM fan`},
		{sql: `SELECT qty + 1 AS q1, string_agg(DISTINCT name, '|' ORDER BY name) FROM fan WHERE qty > 45 GROUP BY qty ORDER BY q1`, ordered: true},
		{sql: `SELECT string_agg(name, ',') FROM fan WHERE id < 0`},
		{sql: `SELECT qty % 4 AS m, name, jsonb_agg(id ORDER BY id) FILTER (WHERE id < 90) FROM fan WHERE id < 400 GROUP BY GROUPING SETS ((qty % 4, name), ())`},
		// A derived table the shards cannot compute apart runs in the
		// final step, with the outer query around it.
		{sql: `SELECT count(*) FROM (SELECT DISTINCT qty, ok FROM fan WHERE id > $1) x WHERE x.qty > $2`, args: []any{100, 10}},
		{sql: `SELECT x.ok, max(x.c) FROM (SELECT ok, qty, count(*) AS c FROM fan GROUP BY ok, qty) x GROUP BY x.ok ORDER BY 1`, ordered: true},
		{sql: `SELECT * FROM (SELECT qty, string_agg(name, ',' ORDER BY name, id) AS l FROM fan WHERE id < 50 GROUP BY qty) x WHERE qty > 20`},
		{sql: `SELECT count(*) FROM (SELECT id, rank() OVER (ORDER BY price NULLS FIRST, id) AS r FROM fan) x WHERE r <= $1`, args: []any{10}},
		{sql: `SELECT (SELECT count(*) FROM fan WHERE qty > $1) AS c, $2::int + 1 AS m`, args: []any{25, 4}},
		{sql: `SELECT EXISTS (SELECT 1 FROM fan GROUP BY qty HAVING count(*) > 70)`},
		{sql: `SELECT ARRAY(SELECT ok FROM fan GROUP BY ok ORDER BY ok)`},
		// A derived table or subquery with LIMIT: each node's first rows.
		{sql: `SELECT x.id FROM (SELECT id, price FROM fan ORDER BY price DESC NULLS LAST, id LIMIT $1) x ORDER BY x.id`, ordered: true, args: []any{12}},
		{sql: `SELECT (SELECT name FROM fan ORDER BY created DESC, id LIMIT 1)`},
		{sql: `SELECT count(*), sum(q) FROM (SELECT qty AS q FROM fan ORDER BY qty DESC, id OFFSET 5 LIMIT 20) t`},
		// EXISTS without LIMIT reads each node's first row, a scalar
		// subquery its first two.
		{sql: `SELECT EXISTS (SELECT 1 FROM fan WHERE qty > $1)`, args: []any{48}},
		{sql: `SELECT EXISTS (SELECT 1 FROM fan WHERE qty > $1)`, args: []any{60}},
		{sql: `SELECT 'none' AS r WHERE NOT EXISTS (SELECT id FROM fan WHERE name = $1)`, args: []any{"nobody"}},
		{sql: `SELECT (SELECT id FROM fan WHERE name = $1 AND price = 1.3) AS one`, args: []any{"name 17"}},
		{sql: `SELECT (SELECT id FROM fan WHERE qty > 60) AS none`},
		// Windows: partitioned by the key they run on the shards; others in
		// the final step over the nodes' rows.
		{sql: `SELECT id, qty, rank() OVER (PARTITION BY id ORDER BY qty) AS r FROM fan ORDER BY r, id LIMIT 20`, ordered: true},
		{sql: `SELECT id, row_number() OVER (ORDER BY qty, id) AS rn FROM fan ORDER BY rn LIMIT 30 OFFSET 7`, ordered: true},
		{sql: `SELECT id, rank() OVER (ORDER BY qty), dense_rank() OVER (ORDER BY qty DESC) FROM fan WHERE qty < 5`},
		{sql: `SELECT id, lag(price) OVER (ORDER BY id), lead(name, 2, 'none') OVER (ORDER BY id) FROM fan ORDER BY id DESC LIMIT 40`, ordered: true},
		{sql: `SELECT id, sum(qty) OVER (PARTITION BY qty % 7 ORDER BY id), avg(price) OVER (PARTITION BY ok) FROM fan`},
		{sql: `SELECT id, count(*) OVER w, max(created) OVER (w ORDER BY id ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM fan WINDOW w AS (PARTITION BY n) ORDER BY 1`, ordered: true},
		{sql: `SELECT *, ntile(5) OVER (ORDER BY price NULLS FIRST, id) FROM fan ORDER BY id LIMIT 50`, ordered: true},
		{sql: `SELECT name, first_value(id) OVER (PARTITION BY name ORDER BY id) FROM fan ORDER BY name, 2 LIMIT 25`, ordered: true},
		{sql: `SELECT id FROM fan WHERE qty > $1 ORDER BY rank() OVER (ORDER BY price DESC NULLS LAST, id) LIMIT $2`, ordered: true, args: []any{30, 12}},
		{sql: `SELECT id, lag(qty, $1) OVER (ORDER BY id) FROM fan ORDER BY id LIMIT 10`, ordered: true, args: []any{3}},
		{sql: `SELECT row_number() OVER () FROM fan WHERE qty = 0`},
		// IN and ANY on the shard key read only the shards that own the keys.
		{sql: `SELECT * FROM fan WHERE id IN (1, 2, 3, 500) ORDER BY id`, ordered: true},
		{sql: `SELECT id, qty FROM fan WHERE id IN (7, 8)`},
		{sql: `SELECT id FROM fan WHERE id IN (42)`},
		{sql: `SELECT count(*), sum(qty) FROM fan WHERE id IN (10, 20, 30, 40, 2999)`},
		{sql: `SELECT id FROM fan WHERE id = ANY($1) ORDER BY id`, ordered: true, args: []any{[]int64{3, 99, 1500, 2999, 4000}}},
		{sql: `SELECT count(*) FROM fan WHERE id = ANY($1)`, args: []any{[]int64{5, 6, 7, 8, 9}}},
		{sql: `SELECT id FROM fan WHERE id = ANY('{4,5,6}') ORDER BY id`, ordered: true},
		{sql: `SELECT id, qty FROM fan WHERE id = ANY(ARRAY[11, 12, 13]) AND qty > 0`},
	}
	modes := map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol, "describe": pgx.QueryExecModeDescribeExec}
	for name, mode := range modes {
		for _, tc := range cases {
			t.Run(name+"/"+tc.sql, func(t *testing.T) {
				args := append([]any{mode}, tc.args...)
				gotHead, got, err := queryTyped(t, c, tc.sql, args...)
				if err != nil {
					t.Fatalf("through the tree: %v", err)
				}
				wantHead, want, err := queryTyped(t, c, strings.ReplaceAll(tc.sql, "FROM fan", "FROM plain"), args...)
				if err != nil {
					t.Fatalf("on the plain table: %v", err)
				}
				if gotHead != wantHead {
					t.Fatalf("columns through the tree %s, on one table %s", gotHead, wantHead)
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
	}

	// More partial values than one VALUES list carries: they go through a
	// temporary table with COPY (text with tabs, newlines and backslashes
	// checks its escaping).
	t.Run("large partial results", func(t *testing.T) {
		const many = `(id bigint PRIMARY KEY, k integer, s text)`
		const fillMany = `SELECT i, i % 30000, E'x\t\\' || i || E'\n' FROM generate_series(1, 40000) i`
		mustExec(t, c, `CREATE TABLE many `+many)
		mustExec(t, c, `INSERT INTO many `+fillMany)
		mustExec(t, c, `SELECT lattice_create_tree('many', 'id', shard_count => 16)`)
		mustExec(t, c, `CREATE TABLE many_plain `+many)
		mustExec(t, c, `INSERT INTO many_plain `+fillMany)
		for name, mode := range modes {
			for _, tc := range []struct {
				sql     string
				ordered bool
			}{
				{`SELECT k, count(*), min(s), max(s) FROM many GROUP BY k ORDER BY k`, true},
				{`SELECT count(DISTINCT s), count(*), sum(k) FROM many`, false},
				{`SELECT s FROM many GROUP BY s HAVING count(*) = 1 ORDER BY s DESC LIMIT 5`, true},
				{`SELECT id, s, row_number() OVER (ORDER BY k DESC, id) AS rn FROM many ORDER BY rn LIMIT 30`, true},
			} {
				gotHead, got, err := queryTyped(t, c, tc.sql, mode)
				if err != nil {
					t.Fatalf("%s %s through the tree: %v", name, tc.sql, err)
				}
				wantHead, want, err := queryTyped(t, c, strings.ReplaceAll(tc.sql, "FROM many", "FROM many_plain"), mode)
				if err != nil {
					t.Fatalf("%s %s on the plain table: %v", name, tc.sql, err)
				}
				if !tc.ordered {
					slices.Sort(got)
					slices.Sort(want)
				}
				if gotHead != wantHead || !slices.Equal(got, want) {
					t.Fatalf("%s %s: %s %d rows through the tree, %s %d on one table; first difference:\n%s",
						name, tc.sql, gotHead, len(got), wantHead, len(want), firstDiff(got, want))
				}
			}
		}
		// The final backend committed: no temporary table, no open
		// transaction left on the catalog node.
		node := connect(t, testNodeDSN(t, 0))
		var tables, open int
		if err := node.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pg_class WHERE relname = 'lattice_partial'),
			(SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%')`).Scan(&tables, &open); err != nil {
			t.Fatal(err)
		}
		if tables != 0 || open != 0 {
			t.Fatalf("left behind on the catalog node: %d temporary tables, %d open transactions", tables, open)
		}
	})

	// Parse, Bind, Describe of the portal, Execute: the portal's columns
	// must be the statement's own, not the partial query's.
	t.Run("portal describe of an aggregate", func(t *testing.T) {
		for _, sql := range []string{
			`SELECT qty, count(*), avg(price) FROM fan WHERE qty > $1 GROUP BY qty ORDER BY qty`,
			`SELECT count(*), sum(qty) FROM fan WHERE id = ANY($1::bigint[])`,
		} {
			arg := []byte("3")
			if strings.Contains(sql, "ANY") {
				arg = []byte("{1,2,3,400}")
			}
			run := func(q string) ([]pgconn.FieldDescription, [][][]byte) {
				res := c.PgConn().ExecParams(context.Background(), q, [][]byte{arg}, nil, nil, []int16{1}).Read()
				if res.Err != nil {
					t.Fatalf("%s: %v", q, res.Err)
				}
				return res.FieldDescriptions, res.Rows
			}
			gotF, gotRows := run(sql)
			wantF, wantRows := run(strings.ReplaceAll(sql, "FROM fan", "FROM plain"))
			if len(gotF) != len(wantF) {
				t.Fatalf("%s: %d columns, want %d", sql, len(gotF), len(wantF))
			}
			for i := range gotF {
				if gotF[i].Name != wantF[i].Name || gotF[i].DataTypeOID != wantF[i].DataTypeOID || gotF[i].Format != wantF[i].Format {
					t.Fatalf("%s: column %d is %+v, want %+v", sql, i, gotF[i], wantF[i])
				}
			}
			if fmt.Sprint(gotRows) != fmt.Sprint(wantRows) {
				t.Fatalf("%s: rows %v, want %v", sql, gotRows, wantRows)
			}
		}
	})

	// Inside a transaction an aggregate reads the transaction's own view:
	// its partial queries run on the transaction's backends.
	t.Run("aggregates in a transaction", func(t *testing.T) {
		ctx := context.Background()
		// The plain table lives on another node than the shard: read it first.
		want, err := queryStrings(t, c, `SELECT count(*), sum(qty), avg(price) FROM plain WHERE id IN (5, 5)`)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		got, err := queryStrings(t, tx.Conn(), `SELECT count(*), sum(qty), avg(price) FROM fan WHERE id IN (5, 5)`)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("one shard in a transaction: tree %v, table %v (%v)", got, want, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO fan (id, qty) VALUES (100001, 1), (100002, 2), (100003, 3)`); err != nil {
			t.Fatal(err)
		}
		if got, err := queryStrings(t, tx.Conn(), `SELECT count(*) FROM fan`); err != nil || len(got) != 1 || got[0] != "3003" {
			t.Fatalf("every shard in a transaction that inserted 3 rows: %v %v, want 3003", got, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := queryStrings(t, c, `SELECT count(*) FROM fan`); err != nil || len(got) != 1 || got[0] != "3000" {
			t.Fatalf("after the transaction: %v %v", got, err)
		}
	})

	t.Run("a scalar subquery of several rows fails as on one table", func(t *testing.T) {
		for _, mode := range modes {
			for _, table := range []string{"fan", "plain"} {
				rows, err := queryStrings(t, c, `SELECT (SELECT id FROM `+table+` WHERE qty = 7)`, mode)
				if pgCode(err) != "21000" {
					t.Fatalf("%s: want 21000 (more than one row), got %v %v", table, rows, err)
				}
			}
		}
	})

	t.Run("what the final step cannot compute is refused", func(t *testing.T) {
		for _, sql := range []string{`SELECT qty, name, string_agg(name, ',') FROM fan GROUP BY qty`, `SELECT array_agg(fan.*) FROM fan`,
			`SELECT id, count(*), rank() OVER (ORDER BY qty) FROM fan GROUP BY id`,
			`SELECT id, generate_series(1, 2), row_number() OVER (ORDER BY qty, id) FROM fan`} {
			for _, mode := range modes {
				if _, err := queryStrings(t, c, sql, mode); pgCode(err) != "0A000" {
					t.Fatalf("%s: want 0A000, got %v", sql, err)
				}
			}
		}
		// In a query string with other statements: refused, saying why.
		_, err := c.PgConn().Exec(context.Background(), `SELECT 1; SELECT count(*) FROM fan`).ReadAll()
		if pgCode(err) != "0A000" || !strings.Contains(err.Error(), "SELECT cannot be combined with other statements in one query string: it reads several shards") {
			t.Fatalf("a fan-out in a query string of two statements: %v", err)
		}
		// A user-defined aggregate looks like any function to the router;
		// the catalog tells, instead of one row per node coming back.
		mustExec(t, c, `CREATE AGGREGATE my_total(integer) (sfunc = int4pl, stype = integer, initcond = '0')`)
		for _, mode := range modes {
			if rows, err := queryStrings(t, c, `SELECT my_total(qty) FROM fan`, mode); pgCode(err) != "0A000" {
				t.Fatalf("user-defined aggregate: want 0A000, got %v %v", rows, err)
			}
			if rows, err := queryStrings(t, c, `SELECT my_total(qty), count(*) FROM fan`, mode); pgCode(err) != "0A000" {
				t.Fatalf("user-defined aggregate beside count: want 0A000, got %v %v", rows, err)
			}
			if rows, err := queryStrings(t, c, `SELECT my_total(qty), rank() OVER (ORDER BY 1) FROM fan`, mode); pgCode(err) != "0A000" {
				t.Fatalf("user-defined aggregate beside a window: want 0A000, got %v %v", rows, err)
			}
			// In a subquery over the outer row's columns only, it
			// aggregates the outer SELECT.
			if rows, err := queryStrings(t, c, `SELECT (SELECT my_total(qty)) FROM fan`, mode); pgCode(err) != "0A000" {
				t.Fatalf("user-defined aggregate of the outer SELECT in a subquery: want 0A000, got %v %v", rows, err)
			}
		}
		if _, err := queryStrings(t, c, `SELECT lower(name) FROM fan LIMIT 1`); err != nil {
			t.Fatalf("ordinary function refused: %v", err)
		}
		// Beside an aggregate that runs in the final step it is refused
		// too: its argument is neither grouped nor aggregated there.
		for _, mode := range modes {
			if rows, err := queryStrings(t, c, `SELECT my_total(qty), string_agg(name, ',') FROM fan`, mode); pgCode(err) != "0A000" {
				t.Fatalf("user-defined aggregate beside string_agg: want 0A000, got %v %v", rows, err)
			}
		}
		// Written with an aggregate's own syntax it runs whole, in the
		// final step on the catalog node.
		for _, mode := range modes {
			got, err := queryStrings(t, c, `SELECT my_total(qty ORDER BY qty) FROM fan`, mode)
			want, werr := queryStrings(t, c, `SELECT my_total(qty ORDER BY qty) FROM plain`, mode)
			if err != nil || werr != nil || !slices.Equal(got, want) {
				t.Fatalf("user-defined aggregate with ORDER BY: tree %v %v, table %v %v", got, err, want, werr)
			}
		}
	})
}

func firstDiff(a, b []string) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return fmt.Sprintf("row %d: tree %q, table %q", i, a[i], b[i])
		}
	}
	return "one result is a prefix of the other"
}
