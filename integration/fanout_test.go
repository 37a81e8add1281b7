package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// queryStrings runs sql and returns each row's values printed as text.
func queryStrings(t *testing.T, c *pgx.Conn, sql string, args ...any) ([]string, error) {
	t.Helper()
	rows, err := c.Query(context.Background(), sql, args...)
	if err != nil {
		return nil, err
	}
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
	const cols = `(id bigint PRIMARY KEY, qty integer, price numeric(10,2), name text, created timestamptz, ok boolean)`
	const fill = `SELECT i, (i * 7) %% 50, CASE WHEN i %% 11 = 0 THEN NULL ELSE ((i * 13) %% 1000) / 10.0 END,
		'name ' || ((i * 17) %% 300), timestamptz '2026-01-01' + i * interval '37 minutes', i %% 3 = 0
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
		{sql: `SELECT id FROM fan ORDER BY qty * -1, id OFFSET 2990`, ordered: true},
		{sql: `SELECT id, ok FROM fan ORDER BY ok, id DESC LIMIT 10`, ordered: true},
		{sql: `SELECT * FROM fan ORDER BY id LIMIT 3`, ordered: true},
		{sql: `SELECT id FROM fan WHERE qty = $1 ORDER BY id LIMIT $2 OFFSET $3`, ordered: true, args: []any{7, 5, 2}},
		{sql: `SELECT id FROM fan ORDER BY id LIMIT 0`, ordered: true},
	}
	modes := map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol, "describe": pgx.QueryExecModeDescribeExec}
	for name, mode := range modes {
		for _, tc := range cases {
			t.Run(name+"/"+tc.sql, func(t *testing.T) {
				args := append([]any{mode}, tc.args...)
				got, err := queryStrings(t, c, tc.sql, args...)
				if err != nil {
					t.Fatalf("through the tree: %v", err)
				}
				want, err := queryStrings(t, c, strings.ReplaceAll(tc.sql, "FROM fan", "FROM plain"), args...)
				if err != nil {
					t.Fatalf("on the plain table: %v", err)
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

	t.Run("text order without a byte collation is refused", func(t *testing.T) {
		_, err := queryStrings(t, c, `SELECT id, name FROM fan ORDER BY name LIMIT 5`)
		if pgCode(err) != "0A000" {
			t.Fatalf("want 0A000, got %v", err)
		}
		if _, err := queryStrings(t, c, `SELECT 1`); err != nil {
			t.Fatalf("session after refusal: %v", err)
		}
	})
	t.Run("aggregates still refused", func(t *testing.T) {
		if _, err := queryStrings(t, c, `SELECT count(*) FROM fan`); pgCode(err) != "0A000" {
			t.Fatalf("want 0A000, got %v", err)
		}
		// A user-defined aggregate looks like any function to the router;
		// the catalog tells, instead of one row per node coming back.
		mustExec(t, c, `CREATE AGGREGATE my_total(integer) (sfunc = int4pl, stype = integer, initcond = '0')`)
		for _, mode := range modes {
			if rows, err := queryStrings(t, c, `SELECT my_total(qty) FROM fan`, mode); pgCode(err) != "0A000" {
				t.Fatalf("user-defined aggregate: want 0A000, got %v %v", rows, err)
			}
		}
		if _, err := queryStrings(t, c, `SELECT lower(name) FROM fan LIMIT 1`); err != nil {
			t.Fatalf("ordinary function refused: %v", err)
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
