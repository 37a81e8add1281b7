package router

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// TestPrepared plans each statement twice through one Planner, the second
// time with other constants, and checks the prepared form of both: its text
// for shard 5, and each parameter's value and type. want "" means the
// statement runs as its text.
func TestPrepared(t *testing.T) {
	cases := []struct {
		first, second string
		want          string // text with parameters, then "|" and value:oid pairs of the second statement
		asText        bool   // the shape runs prepared, but the second statement as its text
	}{
		{"SELECT name FROM accounts WHERE account_id = 1", "SELECT name FROM accounts WHERE account_id = 42",
			`SELECT name FROM lattice_s0005.accounts WHERE account_id = $1|42:23`, false},
		{"UPDATE accounts SET plan_id = plan_id + -5 WHERE account_id = 7;", "UPDATE accounts SET plan_id = plan_id + -12 WHERE account_id = 8;",
			`UPDATE lattice_s0005.accounts SET plan_id = plan_id + -$1 WHERE account_id = $2|12:23 8:23`, false},
		{"SELECT * FROM accounts WHERE account_id = 10000000000", "SELECT * FROM accounts WHERE account_id = 10000000001",
			`SELECT * FROM lattice_s0005.accounts WHERE account_id = $1|10000000001:20`, false},
		{"SELECT * FROM accounts WHERE account_id = 3 AND name = 'x' AND plan_id IN (1.5, 2)", "SELECT * FROM accounts WHERE account_id = 4 AND name = 'it''s' AND plan_id IN (2.5e3, 7)",
			`SELECT * FROM lattice_s0005.accounts WHERE account_id = $1 AND name = $2 AND plan_id IN ($3, $4)|4:23 it's:0 2.5e3:1700 7:23`, false},
		{"UPDATE catalogue SET name = 'a', qty = 3 WHERE sku = 'k1'", "UPDATE catalogue SET name = 'b', qty = 4 WHERE sku = 'k2'",
			`UPDATE lattice_s0005.catalogue SET name = $1, qty = $2 WHERE sku = $3|b:0 4:23 k2:0`, false},
		{"INSERT INTO catalogue (sku, name, qty) VALUES ('s', 'n', 1)", "INSERT INTO catalogue (sku, name, qty) VALUES ('t', 'm', 2)",
			`INSERT INTO lattice_s0005.catalogue (sku, name, qty) VALUES ($1, $2, $3)|t:0 m:0 2:23`, false},
		{"SELECT name FROM catalogue WHERE sku = 'a' AND name LIKE 'x%' AND price BETWEEN 1 AND 2", "SELECT name FROM catalogue WHERE sku = 'b' AND name LIKE 'y%' AND price BETWEEN 3 AND 4",
			`SELECT name FROM lattice_s0005.catalogue WHERE sku = $1 AND name LIKE $2 AND price BETWEEN $3 AND $4|b:0 y%:0 3:23 4:23`, false},
		// Identifier characters around a constant keep the parameter a token of its own.
		{"SELECT name FROM accounts WHERE account_id=1", "SELECT name FROM accounts WHERE account_id=2",
			`SELECT name FROM lattice_s0005.accounts WHERE account_id=$1|2:23`, false},
		// A literal that differs from its parameter: the second statement runs as text.
		{"SELECT name FROM accounts WHERE account_id = 1 AND plan_id = -1", "SELECT name FROM accounts WHERE account_id = 1 AND plan_id = -2147483648", "", true},
		{"SELECT name FROM catalogue WHERE sku = 'a' AND name = 'b'", `SELECT name FROM catalogue WHERE sku = 'a' AND name = 'back\slash'`, "", true},
		{"SELECT name FROM catalogue WHERE sku = 'a' AND name = 'b'", `SELECT name FROM catalogue WHERE sku = 'a' AND name = E'e'`, "", true},
		// On the catalog node: writes without a result only.
		{"UPDATE plain SET v = v + 1 WHERE k = 5", "UPDATE plain SET v = v + 2 WHERE k = 6",
			`UPDATE plain SET v = v + $1 WHERE k = $2|2:23 6:23`, false},
		{"INSERT INTO plain (k, v) VALUES (1, 'x')", "INSERT INTO plain (k, v) VALUES (2, 'y');",
			`INSERT INTO plain (k, v) VALUES ($1, $2)|2:23 y:0`, false},
		{"UPDATE plain SET v = 1 WHERE k = 5 RETURNING v", "UPDATE plain SET v = 2 WHERE k = 6 RETURNING v", "", false},
		{"SELECT v FROM plain WHERE k = 1", "SELECT v FROM plain WHERE k = 2", "", false},
		// Shapes that never run prepared.
		{"SELECT name FROM accounts WHERE account_id = 1 ORDER BY 1", "SELECT name FROM accounts WHERE account_id = 2 ORDER BY 1", "", false},
		{"SELECT plan_id FROM accounts WHERE account_id = 1 GROUP BY 1", "SELECT plan_id FROM accounts WHERE account_id = 2 GROUP BY 1", "", false},
		{"SELECT DISTINCT ON (1) plan_id FROM accounts WHERE account_id = 1", "SELECT DISTINCT ON (1) plan_id FROM accounts WHERE account_id = 2", "", false},
		{"SELECT name::varchar(3) FROM accounts WHERE account_id = 1", "SELECT name::varchar(3) FROM accounts WHERE account_id = 2", "", false},
		{"SELECT concat(name, 'x') FROM accounts WHERE account_id = 1", "SELECT concat(name, 'y') FROM accounts WHERE account_id = 2", "", false},
		{"SELECT 'x' FROM accounts WHERE account_id = 1", "SELECT 'y' FROM accounts WHERE account_id = 2", "", false},
		{"SELECT name FROM catalogue WHERE sku = 'a' AND name IS DISTINCT FROM 'x'::text", "SELECT name FROM catalogue WHERE sku = 'b' AND name IS DISTINCT FROM 'y'::text", "", false},
		{"SELECT name FROM catalogue WHERE sku = 'a' AND price > numeric '1'", "SELECT name FROM catalogue WHERE sku = 'b' AND price > numeric '2'", "", false},
		{"SELECT name FROM catalogue WHERE sku = 'a' AND name = B'1'::text", "SELECT name FROM catalogue WHERE sku = 'b' AND name = B'0'::text", "", false},
		{"SELECT name INTO copy FROM accounts WHERE account_id = 1", "SELECT name INTO copy FROM accounts WHERE account_id = 2", "", false},
		{"INSERT INTO catalogue (sku, name) SELECT 's', 'n'", "INSERT INTO catalogue (sku, name) SELECT 't', 'm'", "", false},
	}
	for _, c := range cases {
		t.Run(c.first, func(t *testing.T) {
			p := NewPlanner(100)
			for i, sql := range []string{c.first, c.second} {
				plans, err := p.Plan(sql, testTrees(), 1)
				if err != nil {
					t.Fatal(err)
				}
				if d := preparedMismatch(plans[0]); d != "" {
					t.Fatal(d)
				}
				got := ""
				if pr := plans[0].Prepared; pr != nil {
					var vals []string
					for k, v := range pr.Values {
						vals = append(vals, fmt.Sprintf("%s:%d", v, pr.OIDs[k]))
					}
					got = pr.SQL(5) + "|" + strings.Join(vals, " ")
				}
				if i == 1 && got != c.want {
					t.Fatalf("%s\n got %q\nwant %q", sql, got, c.want)
				}
				if i == 0 && (got != "") != (c.want != "" || c.asText) {
					t.Fatalf("%s: first statement prepared %q, second wants %q", sql, got, c.want)
				}
			}
		})
	}
}

// preparedMismatch checks a plan's prepared form against its text: with
// each parameter written back as a literal of its value, the prepared
// statement must scan into the tokens of the statement the plan renders.
// Keywords may differ in case, and white space and comments not at all, as
// between the statements of one shape. It returns "" when they agree (or
// the plan has no prepared form).
func preparedMismatch(pl *Plan) string {
	pr := pl.Prepared
	if pr == nil {
		return ""
	}
	prepared, err := pg.Scan(pr.SQL(5))
	if err != nil {
		return fmt.Sprintf("prepared text %q does not scan: %v", pr.SQL(5), err)
	}
	var b strings.Builder
	text := pr.SQL(5)
	at := 0
	for _, tk := range prepared.Tokens {
		if tk.Token != pg.Token_PARAM {
			continue
		}
		n, err := strconv.Atoi(text[tk.Start+1 : tk.End])
		if err != nil || n < 1 || n > len(pr.Values) {
			return fmt.Sprintf("parameter %q of %q", text[tk.Start:tk.End], text)
		}
		b.WriteString(text[at:tk.Start])
		v := pr.Values[n-1]
		if pr.OIDs[n-1] == oidUnknown {
			v = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		}
		b.WriteString(v)
		at = int(tk.End)
	}
	b.WriteString(text[at:])
	schema := "lattice_s0005"
	if pl.Kind == Catalog {
		schema = ""
	}
	want := pl.Render(schema)
	tokens := func(sql string) []string {
		res, err := pg.Scan(sql)
		if err != nil {
			return []string{err.Error()}
		}
		var out []string
		for _, tk := range res.Tokens {
			text := sql[tk.Start:tk.End]
			if tk.KeywordKind != pg.KeywordKind_NO_KEYWORD {
				// A shape's statements may spell keywords in any case.
				text = strings.ToUpper(text)
			}
			if tk.Token != pg.Token_SQL_COMMENT && tk.Token != pg.Token_C_COMMENT {
				out = append(out, tk.Token.String()+" "+text)
			}
		}
		return out
	}
	if got, want := tokens(b.String()), tokens(want); !slices.Equal(got, want) {
		return fmt.Sprintf("prepared %q with its values is %q, the text is %q", text, b.String(), pl.Render(schema))
	}
	return ""
}
