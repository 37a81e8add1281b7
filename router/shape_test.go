package router

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// replacement literals for each kind of constant token: simple forms the
// shape path reads, and forms it must hand to the full parse.
var (
	stringLits = []string{`'x'`, `''`, `'it''s'`, `'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'`, `'{A0EEBC999C0B4EF8BB6D6BB9BD380A11}'`,
		`'42'`, `'0042'`, `' 7 '`, `'-9223372036854775808'`, `'9223372036854775808'`, `'abc'`, `'1.5'`, `'0x10'`, `'ñ'`,
		`E'e\n'`, `$$dollar$$`, `$t$tag$t$`, "'con'\n'tinued'", `'back\slash'`, `E'\x41'`, `'on'`, `'off'`, `'LATIN1'`}
	intLits   = []string{`0`, `1`, `7`, `007`, `2147483647`, `0x1F`, `1_000`, `0b101`, `0o17`}
	floatLits = []string{`1.5`, `10000000000`, `9223372036854775807`, `9223372036854775808`, `1e3`, `.5`, `0x1_0000_0000`, `00000000000000000000001`}
	bitLits   = []string{`B'101'`, `X'1F'`, `b'0'`}
)

// literalVariant replaces each constant token of sql with a literal of the same
// token kind chosen by rng.
func literalVariant(t testing.TB, sql string, rng *rand.Rand) string {
	res, err := pg.Scan(sql)
	if err != nil {
		return sql
	}
	var b strings.Builder
	at := 0
	for _, tk := range res.Tokens {
		var pool []string
		switch tk.Token {
		case pg.Token_SCONST:
			pool = stringLits
		case pg.Token_ICONST:
			pool = intLits
		case pg.Token_FCONST:
			pool = floatLits
		case pg.Token_BCONST, pg.Token_XCONST:
			pool = bitLits
		default:
			continue
		}
		if rng.Intn(4) == 0 {
			continue // keep some constants as they are
		}
		b.WriteString(sql[at:tk.Start])
		b.WriteString(pool[rng.Intn(len(pool))])
		at = int(tk.End)
	}
	b.WriteString(sql[at:])
	return b.String()
}

// sameOutcome compares everything a caller can see of two planning results.
func sameOutcome(t testing.TB, a []*Plan, ae error, b []*Plan, be error) string {
	if (ae == nil) != (be == nil) {
		return fmt.Sprintf("error %v vs %v", ae, be)
	}
	if ae != nil {
		if !reflect.DeepEqual(ae, be) {
			return fmt.Sprintf("error %#v vs %#v", ae, be)
		}
		return ""
	}
	if len(a) != len(b) {
		return fmt.Sprintf("%d plans vs %d", len(a), len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Kind != y.Kind || x.SQL != y.SQL || x.Tree != y.Tree || x.Key != y.Key || !reflect.DeepEqual(x.Rows, y.Rows) ||
			!reflect.DeepEqual(x.Func, y.Func) || x.Tx != y.Tx || x.TxOptions != y.TxOptions || x.Savepoint != y.Savepoint ||
			!reflect.DeepEqual(x.Err, y.Err) || x.Tag != y.Tag || x.String() != y.String() {
			return fmt.Sprintf("plan %d: %s vs %s", i, x, y)
		}
		for _, schema := range []string{"lattice_s0007", "select"} {
			if x.Render(schema) != y.Render(schema) {
				return fmt.Sprintf("render %q vs %q", x.Render(schema), y.Render(schema))
			}
			if x.Kind == InsertSplit {
				for r := range x.Rows {
					sx, px := x.RenderRows(schema, []int{r, 0})
					sy, py := y.RenderRows(schema, []int{r, 0})
					if sx != sy || !reflect.DeepEqual(px, py) {
						return fmt.Sprintf("rows %q %v vs %q %v", sx, px, sy, py)
					}
				}
			}
		}
	}
	return ""
}

func shapeCorpus(t testing.TB) []string {
	return append(readStatementsFile(t),
		`SELECT * FROM orders WHERE id = -5`,
		`SELECT * FROM orders WHERE id = - 5 AND total > -1.5`,
		`SELECT * FROM orders WHERE id = - - 5`,
		`SELECT * FROM orders WHERE id = 10000000000`,
		`SELECT * FROM orders WHERE id = -10000000000`,
		`SELECT * FROM orders WHERE id = '12'::int8`,
		`SELECT * FROM orders WHERE id = int8 '12'`,
		`SELECT 1::float(53) FROM orders WHERE id = 1`,
		`SELECT * FROM catalogue WHERE sku = 'a' LIMIT 10 OFFSET 5`,
		`SELECT * FROM catalogue WHERE sku = 'a' AND name LIKE 'x%' ESCAPE '!'`,
		`SELECT * FROM catalogue WHERE sku = 'a' AND price::numeric(10, 2) > 5`,
		`SELECT * FROM customers WHERE name = 'x' LIMIT 1`,
		`UPDATE invoices i SET account_id = 7, amount = 0 FROM accounts a WHERE a.account_id = i.account_id AND i.account_id = 7`,
		`WITH d AS (DELETE FROM payments WHERE acct = 7 RETURNING *) INSERT INTO invoices (account_id, invoice_id, amount) SELECT acct, invoice_id, paid FROM d WHERE acct = 7`,
		`WITH u AS (UPDATE invoices SET amount = 1 WHERE account_id = 7 RETURNING account_id) SELECT count(*) FROM u JOIN accounts a USING (account_id) WHERE a.account_id = 7`,
		`MERGE INTO accounts a USING (SELECT 7 AS id) s ON a.account_id = s.id WHEN NOT MATCHED THEN INSERT (account_id, name) VALUES (7, 'n')`,
		`UPDATE orders SET total = total + 1.5 WHERE id = 77 RETURNING total * 2`,
		`INSERT INTO orders (id, customer, total) VALUES (1, 2, 3.5), (-4, 5, 6), ('7', 8, 9)`,
		`INSERT INTO catalogue (sku, name) VALUES ('a', 'b'), ('c', 'd') ON CONFLICT (sku) DO UPDATE SET name = 'z'`,
		`INSERT INTO "MixedCase" (k, v) VALUES ('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', B'1')`,
		`EXPLAIN (FORMAT 'json') SELECT * FROM orders WHERE id = 3`,
		`SELECT * FROM orders WHERE id IN (3)`,
		`DELETE FROM orders WHERE 3 = id`,
		`SELECT interval '1 day', '2024-01-01'::date FROM orders WHERE id = 1`,
		`SELECT U&'\0041' FROM orders WHERE id = 1`,
		`SELECT * FROM orders WHERE id = 1; `,
		`SELECT * FROM orders WHERE id = 1 -- c`,
		`SELECT * FROM orders WHERE id = 1 /* c */ ;`,
		`select * from orders where id = 5`,
		`SET statement_timeout = 5`,
		`SELECT lattice_reshard('orders', 4)`,
	)
}

// TestShapeDifferential plans variants of each statement (other literal
// values) through a planner that has seen the original, and checks that a
// derived plan is exactly what a full parse gives.
func TestShapeDifferential(t *testing.T) {
	trees := testTrees()
	rng := rand.New(rand.NewSource(1))
	p := NewPlanner(100000)
	checked, prepared := 0, 0
	for _, sql := range shapeCorpus(t) {
		p.Plan(sql, trees, 1)
		derived := false
		for i := 0; i < 30; i++ {
			if i == 5 && !derived {
				// Neither a shape nor a prepared form: the rest would
				// compare two full plannings, at 10 times the cost under
				// the race detector.
				break
			}
			v := literalVariant(t, sql, rng)
			before := p.shapeHits.Load()
			got, gerr := p.Plan(v, trees, 1)
			want, werr := NewPlanner(0).Plan(v, trees, 1)
			if d := sameOutcome(t, got, gerr, want, werr); d != "" {
				t.Fatalf("%s\nvariant %s\n%s", sql, v, d)
			}
			if gerr == nil && len(got) > 0 {
				if d := preparedMismatch(got[0]); d != "" {
					t.Fatalf("%s\nvariant %s\n%s", sql, v, d)
				}
				if got[0].Prepared != nil {
					prepared++
					derived = true
				}
			}
			if p.shapeHits.Load() > before {
				checked++
				derived = true
			}
		}
	}
	if checked < 500 {
		t.Fatalf("only %d variants derived from shapes", checked)
	}
	t.Logf("%d variants derived from shapes, %d of them with a prepared form", checked, prepared)
}

func TestShapeHits(t *testing.T) {
	trees := testTrees()
	p := NewPlanner(100)
	cases := []struct {
		first, second string
		hit           bool
	}{
		{`SELECT * FROM orders WHERE id = 1`, `SELECT * FROM orders WHERE id = 2`, true},
		{`SELECT * FROM orders WHERE id = 1`, `select  *  from orders where ID = 987654`, false}, // ID is an identifier: text differs
		{`SELECT * FROM catalogue WHERE sku = 'a' LIMIT 5`, `SELECT * FROM catalogue WHERE sku = 'it''s' LIMIT 500`, true},
		{`SELECT * FROM catalogue WHERE sku = 'a' LIMIT 5`, `SELECT * FROM catalogue WHERE sku = E'b' LIMIT 5`, false}, // E'' is decoded: parse
		{`SELECT * FROM orders WHERE id = 1`, `SELECT * FROM orders WHERE id = 0x10`, false},
		{`SELECT 1::float(53) FROM orders WHERE id = 1`, `SELECT 1::float(54) FROM orders WHERE id = 1`, false}, // the grammar reads 53
		{`INSERT INTO orders (id) VALUES (1), (2)`, `INSERT INTO orders (id) VALUES (3), (4)`, true},
		{`SELECT * FROM customers WHERE id = 1`, `SELECT * FROM customers WHERE id = 2`, true},
		{`SELECT lattice_reshard('orders', 4)`, `SELECT lattice_reshard('orders', 8)`, false},
		{`SELECT * FROM orders WHERE id = 1; SELECT 2`, `SELECT * FROM orders WHERE id = 3; SELECT 4`, false},
	}
	for _, c := range cases {
		p.Plan(c.first, trees, 1)
		before := p.shapeHits.Load()
		got, err := p.Plan(c.second, trees, 1)
		if hit := p.shapeHits.Load() > before; hit != c.hit {
			t.Errorf("%s then %s: hit %v, want %v", c.first, c.second, hit, c.hit)
		}
		want, werr := NewPlanner(0).Plan(c.second, trees, 1)
		if d := sameOutcome(t, got, err, want, werr); d != "" {
			t.Errorf("%s: %s", c.second, d)
		}
	}
	// A refused value under a known shape is refused with the full message.
	p.Plan(`SELECT * FROM orders WHERE id = 1`, trees, 1)
	got, _ := p.Plan(`SELECT * FROM orders WHERE id = '1.5'`, trees, 1)
	if got[0].Kind != Catalog && (got[0].Kind != Refused || !strings.Contains(got[0].Err.Message, "'1.5'")) {
		t.Fatal(got[0])
	}
	// Another version does not use the template.
	before := p.shapeHits.Load()
	got, _ = p.Plan(`SELECT * FROM orders WHERE id = 99`, treeMap{}, 2)
	if got[0].Kind != Catalog || p.shapeHits.Load() != before {
		t.Fatal(got[0])
	}
}

// FuzzShape checks derived plans against full parses for literal variants
// of arbitrary statements.
func FuzzShape(f *testing.F) {
	for _, s := range readStatementsFile(f) {
		f.Add(s, int64(len(s)))
	}
	trees := testTrees()
	f.Fuzz(func(t *testing.T, sql string, seed int64) {
		if len(sql) > 2000 {
			return
		}
		rng := rand.New(rand.NewSource(seed))
		p := NewPlanner(100)
		p.Plan(sql, trees, 1)
		for i := 0; i < 4; i++ {
			v := literalVariant(t, sql, rng)
			got, gerr := p.Plan(v, trees, 1)
			want, werr := NewPlanner(0).Plan(v, trees, 1)
			if d := sameOutcome(t, got, gerr, want, werr); d != "" {
				t.Fatalf("%q\nvariant %q\n%s", sql, v, d)
			}
			if gerr == nil && len(got) > 0 {
				if d := preparedMismatch(got[0]); d != "" {
					t.Fatalf("%q\nvariant %q\n%s", sql, v, d)
				}
			}
		}
	})
}
