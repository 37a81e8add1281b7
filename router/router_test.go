package router

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

func moreTrees() treeMap {
	m := testTrees()
	m["user"] = &shardmap.Tree{Name: "user", KeyColumn: "id", KeyType: shardmap.KeyInt, Columns: []string{"id", "name"}}
	m["items"] = &shardmap.Tree{Name: "items", KeyColumn: "sku", KeyType: shardmap.KeyText, Columns: []string{"id", "sku"}}
	m["nocols"] = &shardmap.Tree{Name: "nocols", KeyColumn: "k", KeyType: shardmap.KeyText}
	m["Upper"] = &shardmap.Tree{Name: "Upper", KeyColumn: "Key", KeyType: shardmap.KeyInt, Columns: []string{"Key"}}
	m["small"] = &shardmap.Tree{Name: "small", KeyColumn: "k", KeyType: shardmap.KeyInt, Columns: []string{"k"}}
	m[strings.Repeat("a", 63)] = &shardmap.Tree{Name: strings.Repeat("a", 63), KeyColumn: "k", KeyType: shardmap.KeyInt, Columns: []string{"k"}}
	return m
}

func planOne(t *testing.T, sql string) *Plan {
	t.Helper()
	plans, err := NewPlanner(0).Plan(sql, moreTrees(), 1)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if len(plans) != 1 {
		t.Fatalf("%s: %d plans", sql, len(plans))
	}
	return plans[0]
}

func TestRouting(t *testing.T) {
	cases := []struct {
		sql    string
		kind   Kind
		key    string // Value.String() for Single
		render string // for Single (schema lattice_s0001); "" to skip
		errHas string // substring of the refusal message
	}{
		// CTE scoping.
		{sql: `WITH catalogue AS (SELECT 'a' AS sku) SELECT * FROM public.catalogue WHERE sku = 'a'`, kind: Single, key: `'a'`,
			render: `WITH catalogue AS (SELECT 'a' AS sku) SELECT * FROM lattice_s0001.catalogue WHERE sku = 'a'`},
		{sql: `WITH catalogue AS (SELECT 1) INSERT INTO catalogue (sku) VALUES ('a')`, kind: Single, key: `'a'`},
		{sql: `SELECT * FROM (WITH orders AS (SELECT 1 AS id) SELECT * FROM orders) x`, kind: Catalog},
		{sql: `WITH a AS (SELECT * FROM orders WHERE id = 1), orders AS (SELECT 1) SELECT * FROM a`, kind: Single, key: `'1'`,
			render: `WITH a AS (SELECT * FROM lattice_s0001.orders WHERE id = 1), orders AS (SELECT 1) SELECT * FROM a`},
		{sql: `WITH RECURSIVE a AS (SELECT * FROM orders), orders AS (SELECT 1 AS id) SELECT * FROM a`, kind: Catalog},
		{sql: `SELECT * FROM orders WHERE id = 1 AND EXISTS (WITH orders AS (SELECT 1) SELECT * FROM orders)`, kind: Single, key: `'1'`},
		{sql: `WITH x AS (SELECT * FROM customers) SELECT * FROM orders WHERE id = 1`, kind: Refused, errHas: `together with table "customers"`},

		// Keys in WHERE.
		{sql: `SELECT * FROM catalogue WHERE sku = 'a' AND sku = 'b'`, kind: Single, key: `'a'`},
		{sql: `SELECT * FROM catalogue WHERE sku = $1 AND sku = $2`, kind: Single, key: `$1`},
		{sql: `SELECT * FROM catalogue WHERE sku = upper($1) AND sku = 'x'`, kind: Single, key: `'x'`},
		{sql: `SELECT * FROM catalogue WHERE sku = 'a'::text::varchar`, kind: FanOut},
		{sql: `SELECT * FROM catalogue WHERE sku = 'a' COLLATE "C"`, kind: FanOut},
		{sql: `SELECT * FROM catalogue WHERE sku OPERATOR(pg_catalog.=) 'a'`, kind: FanOut},
		{sql: `SELECT * FROM catalogue WHERE sku NOT IN ('a')`, kind: FanOut},
		{sql: `SELECT * FROM catalogue WHERE sku = 'a'::citext`, kind: Refused, errHas: "cast to citext"},
		{sql: `SELECT * FROM catalogue WHERE sku = 'a'::name`, kind: Refused, errHas: "cast to name"},
		{sql: `SELECT * FROM catalogue WHERE sku = $1::varchar`, kind: Single, key: `$1`},
		{sql: `SELECT * FROM catalogue WHERE sku = text 'typed'`, kind: Single, key: `'typed'`},
		{sql: `SELECT * FROM catalogue WHERE sku = 'x' AND qty IN (SELECT qty FROM customers)`, kind: Refused, errHas: "together with"},
		{sql: `SELECT * FROM catalogue CROSS JOIN generate_series(1, 3) g WHERE sku = 'x'`, kind: Single, key: `'x'`},
		{sql: `SELECT * FROM catalogue c LEFT JOIN (VALUES ('x')) v(s) ON v.s = c.sku WHERE c.sku = 'x'`, kind: Single, key: `'x'`},
		{sql: `DELETE FROM catalogue WHERE CURRENT OF cur`, kind: Refused, errHas: "does not fix"},
		// Without the key, UPDATE and DELETE run on every shard.
		{sql: `DELETE FROM catalogue WHERE qty > 1`, kind: WriteAll},
		{sql: `UPDATE catalogue SET qty = qty + 1 WHERE sku = upper('a') RETURNING sku`, kind: WriteAll},
		{sql: `UPDATE catalogue SET sku = 'b' WHERE qty = 0`, kind: Refused, errHas: "assigns the shard key"},
		{sql: `DELETE FROM catalogue WHERE sku = 'a' AND qty IN (SELECT 1 FROM customers)`, kind: Refused, errHas: "together with"},
		{sql: `UPDATE catalogue SET (name, qty) = (SELECT name, 1 FROM customers) WHERE sku = 'a'`, kind: Refused, errHas: "together with"},
		{sql: `UPDATE catalogue SET (name, qty) = (SELECT 'n', 1) WHERE sku = 'a'`, kind: Single, key: `'a'`},
		{sql: `UPDATE catalogue AS c SET name = 'n' FROM (VALUES (1)) v(x) WHERE c.sku = $3`, kind: Single, key: `$3`},

		// Integer keys.
		{sql: `SELECT * FROM orders WHERE id = 1::int2`, kind: Single, key: `'1'`},
		{sql: `SELECT * FROM orders WHERE id = '  12  '`, kind: Single, key: `'12'`},
		{sql: `SELECT * FROM orders WHERE id = '1_000'`, kind: Single, key: `'1000'`},
		{sql: `SELECT * FROM orders WHERE id = '0x10'`, kind: Single, key: `'16'`},
		{sql: `SELECT * FROM orders WHERE id = '017'`, kind: Single, key: `'17'`},
		{sql: `SELECT * FROM orders WHERE id = '-5'::bigint`, kind: Single, key: `'-5'`},
		{sql: `SELECT * FROM orders WHERE id = - 5`, kind: Single, key: `'-5'`},
		{sql: `SELECT * FROM orders WHERE id = 99999999999999999999`, kind: Refused, errHas: "numeric constant"},
		{sql: `SELECT * FROM orders WHERE id = 1e3`, kind: Refused, errHas: "numeric constant"},
		{sql: `SELECT * FROM orders WHERE id = B'101'`, kind: Refused, errHas: "bit string"},
		{sql: `SELECT * FROM orders WHERE id = $1::text`, kind: Refused, errHas: "cast to text"},
		{sql: `SELECT * FROM orders WHERE id = NULL::int8`, kind: Single, key: `NULL`},

		// uuid keys.
		{sql: `SELECT * FROM "MixedCase" WHERE k = 'a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11'`, kind: Single, key: `'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'`},
		{sql: `SELECT * FROM "MixedCase" WHERE k = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1'`, kind: Refused, errHas: "uuid"},
		{sql: `SELECT * FROM "MixedCase" WHERE k = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11 '`, kind: Refused, errHas: "uuid"},
		{sql: `SELECT * FROM mixedcase WHERE k = 'x'`, kind: Catalog},

		// Names: keywords, case, truncation, schemas.
		{sql: `SELECT * FROM "user" WHERE id = 4`, kind: Single, key: `'4'`, render: `SELECT * FROM lattice_s0001."user" WHERE id = 4`},
		{sql: `SELECT * FROM "Upper" WHERE "Key" = 4`, kind: Single, key: `'4'`, render: `SELECT * FROM lattice_s0001."Upper" WHERE "Key" = 4`},
		{sql: `SELECT * FROM "Upper" WHERE key = 4`, kind: FanOut},
		{sql: `SELECT * FROM Upper WHERE "Key" = 4`, kind: Catalog},
		{sql: `SELECT * FROM ` + strings.Repeat("a", 64) + ` WHERE k = 1`, kind: Single, key: `'1'`,
			render: `SELECT * FROM lattice_s0001.` + strings.Repeat("a", 63) + ` WHERE k = 1`},
		{sql: `SELECT * FROM PUBLIC.Catalogue WHERE SKU = 'x'`, kind: Single, key: `'x'`, render: `SELECT * FROM lattice_s0001.catalogue WHERE SKU = 'x'`},
		{sql: `SELECT * FROM "public"."catalogue" WHERE sku = 'x'`, kind: Single, key: `'x'`, render: `SELECT * FROM lattice_s0001.catalogue WHERE sku = 'x'`},
		{sql: `SELECT * FROM public/*c*/./*d*/catalogue WHERE sku = 'x'`, kind: Single, key: `'x'`, render: `SELECT * FROM lattice_s0001.catalogue WHERE sku = 'x'`},
		{sql: `SELECT * FROM "Public".catalogue WHERE sku = 'x'`, kind: Catalog},
		{sql: `SELECT * FROM lattice_s0001.catalogue WHERE sku = 'x'`, kind: Catalog},
		{sql: `SELECT public.catalogue.* FROM catalogue WHERE public.catalogue.sku = 'x'`, kind: Single, key: `'x'`,
			render: `SELECT lattice_s0001.catalogue.* FROM lattice_s0001.catalogue WHERE lattice_s0001.catalogue.sku = 'x'`},
		{sql: `SELECT * FROM catalogue WHERE sku = 'catalogue' AND name = 'public.catalogue'`, kind: Single, key: `'catalogue'`,
			render: `SELECT * FROM lattice_s0001.catalogue WHERE sku = 'catalogue' AND name = 'public.catalogue'`},

		{sql: `SELECT * FROM ONLY (catalogue) WHERE sku = 'x'`, kind: Single, key: `'x'`, render: `SELECT * FROM ONLY (lattice_s0001.catalogue) WHERE sku = 'x'`},
		{sql: `DELETE FROM catalogue * WHERE sku = 'x'`, kind: Single, key: `'x'`, render: `DELETE FROM lattice_s0001.catalogue * WHERE sku = 'x'`},
		{sql: `SELECT * FROM catalogue TABLESAMPLE SYSTEM (10) WHERE sku = 'x'`, kind: Single, key: `'x'`},
		{sql: `SELECT sku FROM catalogue WHERE sku = 'x'
UNION ALL SELECT 'y'`, kind: Single, key: `'x'`},

		// DDL.
		{sql: `CREATE TABLE IF NOT EXISTS catalogue (sku text PRIMARY KEY)`, kind: Catalog},
		{sql: `CREATE TABLE catalogue (sku text PRIMARY KEY)`, kind: Refused, errHas: "CREATE TABLE on tree"},
		{sql: `CREATE TABLE IF NOT EXISTS x (LIKE orders)`, kind: Refused, errHas: "CREATE TABLE on tree"},
		{sql: `COMMENT ON TABLE catalogue IS 'c'`, kind: Catalog},

		// INSERT forms.
		{sql: `INSERT INTO items VALUES (1)`, kind: Refused, errHas: "in row 1"},
		{sql: `INSERT INTO items VALUES (1, 'a')`, kind: Single, key: `'a'`},
		{sql: `INSERT INTO nocols VALUES ('a')`, kind: Refused, errHas: "without a column list"},
		{sql: `INSERT INTO nocols (k) VALUES ('a')`, kind: Single, key: `'a'`},
		{sql: `INSERT INTO orders (id) VALUES (1) ON CONFLICT ON CONSTRAINT orders_pkey DO UPDATE SET total = 1 WHERE orders.total < 1`, kind: Single, key: `'1'`},
		{sql: `INSERT INTO orders (id) VALUES ((1))`, kind: Single, key: `'1'`},
		{sql: `INSERT INTO orders (id) VALUES (1) ORDER BY 1`, kind: Refused, errHas: "INSERT ... SELECT"},
		{sql: `INSERT INTO orders (id) SELECT 1 UNION SELECT 2`, kind: Copy},
		{sql: `INSERT INTO orders (id) SELECT g FROM generate_series(1, 3) g RETURNING id`, kind: Refused, errHas: "with RETURNING"},
		{sql: `INSERT INTO orders (id) SELECT g FROM generate_series(1, 3) g ON CONFLICT DO NOTHING`, kind: Copy},
		{sql: `INSERT INTO orders (total) SELECT g FROM generate_series(1, 3) g`, kind: Refused, errHas: "without its shard key"},
		{sql: `INSERT INTO orders (total, id) VALUES ((VALUES (1)), 5), (2, 6)`, kind: Refused, errHas: "could not split"},
		{sql: `INSERT INTO orders (id) OVERRIDING SYSTEM VALUE VALUES (5)`, kind: Single, key: `'5'`},

		// EXPLAIN.
		{sql: `EXPLAIN ANALYZE DELETE FROM orders WHERE id = $1`, kind: Explain},
		{sql: `EXPLAIN (ANALYZE, FORMAT JSON) DELETE FROM orders WHERE id = $1`, kind: Single, key: `$1`, render: `EXPLAIN (ANALYZE, FORMAT JSON) DELETE FROM lattice_s0001.orders WHERE id = $1`},
		{sql: `EXPLAIN SELECT lattice_trees()`, kind: Refused, errHas: "EXPLAIN of lattice_trees"},
		{sql: `EXPLAIN CREATE TABLE x AS SELECT * FROM orders WHERE id = 1`, kind: Refused, errHas: "CREATE TABLE AS"},

		// lattice functions.
		{sql: `SELECT public.lattice_trees()`, kind: Function},
		{sql: `SELECT other.lattice_trees()`, kind: Refused, errHas: "called by name"},
		{sql: `SELECT lattice_trees() FROM customers`, kind: Refused, errHas: "composes as a FROM item"},
		{sql: `SELECT lattice_reshard_complete('c') FROM customers`, kind: Function},
		{sql: `SELECT * FROM lattice_shards('c') AS s`, kind: Function},
		{sql: `SELECT * FROM lattice_shards('c') WITH ORDINALITY`, kind: Function},
		{sql: `SELECT lattice_reshard(VARIADIC ARRAY['a'])`, kind: Refused, errHas: "called by name"},
		{sql: `SELECT count(lattice_trees())`, kind: Refused, errHas: "composes as a FROM item"},
		{sql: `CALL lattice_reshard('c', 2)`, kind: Refused, errHas: "CALL cannot call lattice_reshard"},
		{sql: `CREATE VIEW v AS SELECT * FROM lattice_trees()`, kind: Refused, errHas: "CREATE VIEW cannot call lattice_trees"},
		{sql: `SELECT lattice_reshard(tree => 'c', n => $1)`, kind: Function},

		// Settings and others.
		{sql: `SET LOCAL standard_conforming_strings = on`, kind: LocalSet},
		{sql: `SET standard_conforming_strings TO DEFAULT`, kind: SessionSet},
		{sql: `SET standard_conforming_strings = 'of'`, kind: Refused, errHas: "standard_conforming_strings"},
		{sql: `SET NAMES 'LATIN1'`, kind: Refused, errHas: "client_encoding"},
		{sql: `SET client_encoding = 'utf-8'`, kind: SessionSet},
		{sql: `SET client_encoding = SQL_ASCII`, kind: SessionSet},
		{sql: `SET client_encoding TO DEFAULT`, kind: SessionSet},
		{sql: `SET TRANSACTION SNAPSHOT '0001'`, kind: LocalSet},
		{sql: `DO $$ BEGIN PERFORM 1; END $$`, kind: Catalog},
		{sql: `DISCARD TEMP`, kind: Catalog},
		{sql: `COPY customers FROM STDIN`, kind: Catalog},
		{sql: `ROLLBACK AND CHAIN`, kind: Transaction},
		{sql: `DROP TRIGGER trg ON catalogue`, kind: Refused, errHas: "DROP TRIGGER"},
		{sql: `DROP TABLE other.catalogue`, kind: Catalog},
		{sql: `ALTER TABLE customers ADD FOREIGN KEY (id) REFERENCES orders (id)`, kind: Refused, errHas: "ALTER TABLE"},
		{sql: `CREATE TRIGGER t BEFORE INSERT ON catalogue FOR EACH ROW EXECUTE FUNCTION f()`, kind: Refused, errHas: "CREATE TRIGGER"},
		{sql: `ALTER TABLE catalogue RENAME TO c2`, kind: Refused, errHas: "ALTER TABLE"},
		{sql: `REINDEX TABLE orders`, kind: DDL},
		{sql: `CLUSTER orders`, kind: DDL},
	}
	for _, c := range cases {
		t.Run(c.sql, func(t *testing.T) {
			p := planOne(t, c.sql)
			if p.Kind != c.kind {
				t.Fatalf("kind %v, want %v (%s)", p.Kind, c.kind, p)
			}
			if c.key != "" && p.Key.String() != c.key {
				t.Errorf("key %s, want %s", p.Key, c.key)
			}
			if c.render != "" {
				if got := p.Render("lattice_s0001"); got != c.render {
					t.Errorf("render\n got %s\nwant %s", got, c.render)
				}
			}
			if c.errHas != "" && !strings.Contains(p.Err.Message, c.errHas) {
				t.Errorf("message %q lacks %q", p.Err.Message, c.errHas)
			}
			if p.Kind == Refused && p.Err.Code != sqlstate.FeatureNotSupported {
				t.Errorf("code %s", p.Err.Code)
			}
			if p.Kind == Single {
				if got, want := deparse(t, p.Render("lattice_s0001")), requalified(t, p.SQL, p.Tree.Name, "lattice_s0001"); got != want {
					t.Errorf("rendered %s\nwant     %s", got, want)
				}
			}
		})
	}
}

func TestFunctionCall(t *testing.T) {
	p := planOne(t, `SELECT lattice_create_tree('catalogue', $1, shard_count => 64, dry => true, note => NULL)`)
	want := &FuncCall{Name: "lattice_create_tree", Args: []Value{{Text: "catalogue"}, {Param: 1}},
		Named: map[string]Value{"shard_count": {Text: "64"}, "dry": {Text: "true"}, "note": {Null: true}}}
	if !reflect.DeepEqual(p.Func, want) || p.Kind != Function || p.Tag != "SELECT" {
		t.Fatalf("got %+v", p.Func)
	}
	p = planOne(t, `SELECT * FROM lattice_shards('orders'::text)`)
	if !p.Func.Star || p.Func.Name != "lattice_shards" || p.Func.Args[0].Text != "orders" || p.Func.Named != nil {
		t.Fatalf("got %+v", p.Func)
	}
}

func TestTransactions(t *testing.T) {
	cases := []struct {
		sql  string
		tx   TxKind
		opts string
		sp   string
		tag  string
	}{
		{"BEGIN READ ONLY DEFERRABLE", Begin, "READ ONLY DEFERRABLE", "", "BEGIN"},
		{"BEGIN TRANSACTION ISOLATION LEVEL READ COMMITTED", Begin, "ISOLATION LEVEL READ COMMITTED", "", "BEGIN"},
		{"START TRANSACTION", Begin, "", "", "START TRANSACTION"},
		{"COMMIT WORK", Commit, "", "", "COMMIT"},
		{"SAVEPOINT \"A b\"", Savepoint, "", "A b", "SAVEPOINT"},
		{"ROLLBACK TRANSACTION TO SAVEPOINT x", RollbackTo, "", "x", "ROLLBACK"},
	}
	for _, c := range cases {
		p := planOne(t, c.sql)
		if p.Kind != Transaction || p.Tx != c.tx || p.TxOptions != c.opts || p.Savepoint != c.sp || p.Tag != c.tag {
			t.Errorf("%s: %s", c.sql, p)
		}
	}
	p := planOne(t, "PREPARE TRANSACTION 'x'")
	if p.Kind != Refused || p.Tx != PrepareTx {
		t.Errorf("%s", p)
	}
}

func TestStatementText(t *testing.T) {
	plans, err := NewPlanner(0).Plan("  SELECT 1 ;\n\t/* c */ SELECT * FROM orders WHERE id = 3 -- x\n; ;", moreTrees(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(plans) != 2 || plans[0].SQL != "SELECT 1" || plans[1].SQL != "/* c */ SELECT * FROM orders WHERE id = 3" {
		t.Fatalf("%q", []string{plans[0].SQL, plans[1].SQL})
	}
	if got := plans[1].Render("lattice_s0002"); got != "/* c */ SELECT * FROM lattice_s0002.orders WHERE id = 3" {
		t.Fatal(got)
	}
	for _, empty := range []string{"", " ", ";", ";;", "-- only a comment", "/* c */;"} {
		plans, err := NewPlanner(0).Plan(empty, moreTrees(), 1)
		if err != nil || len(plans) != 0 {
			t.Errorf("%q: %v %v", empty, plans, err)
		}
	}
	// Multibyte text before the reference: offsets are bytes.
	p := planOne(t, "SELECT 'ñandú' AS x, * FROM catalogue WHERE sku = 'ü'")
	if got := p.Render("s"); got != "SELECT 'ñandú' AS x, * FROM s.catalogue WHERE sku = 'ü'" || p.Key.Text != "ü" {
		t.Fatal(got)
	}
}

func TestSyntaxError(t *testing.T) {
	_, err := NewPlanner(10).Plan("SELECT * FROM WHERE", moreTrees(), 1)
	var e *sqlstate.Error
	if !errors.As(err, &e) || e.Code != sqlstate.SyntaxError || !strings.Contains(e.Message, "syntax error") || e.Position != 15 {
		t.Fatalf("%#v", err)
	}
	if !strings.Contains(e.Error(), "42601") {
		t.Fatal(e.Error())
	}
}

func TestNilTrees(t *testing.T) {
	plans, err := NewPlanner(10).Plan("SELECT * FROM catalogue", nil, 0)
	if err != nil || plans[0].Kind != Catalog {
		t.Fatal(plans, err)
	}
}

func TestRenderRows(t *testing.T) {
	sql := `WITH x AS (SELECT $5::int AS n) INSERT INTO orders (id, customer, total) VALUES ($1, $4, 1), ($2, $4, $6), (3, $4, $1) ON CONFLICT (id) DO UPDATE SET total = $7 RETURNING id`
	p := planOne(t, sql)
	if p.Kind != InsertSplit || fmt.Sprint(p.Rows) != "[$1 $2 '3']" {
		t.Fatal(p)
	}
	cases := []struct {
		rows   []int
		sql    string
		params []int
	}{
		{[]int{1}, `WITH x AS (SELECT $1::int AS n) INSERT INTO lattice_s0003.orders (id, customer, total) VALUES ($2, $3, $4) ON CONFLICT (id) DO UPDATE SET total = $5 RETURNING id`, []int{5, 2, 4, 6, 7}},
		{[]int{2, 0}, `WITH x AS (SELECT $1::int AS n) INSERT INTO lattice_s0003.orders (id, customer, total) VALUES (3, $2, $3), ($3, $2, 1) ON CONFLICT (id) DO UPDATE SET total = $4 RETURNING id`, []int{5, 4, 1, 7}},
		{[]int{0, 1, 2}, `WITH x AS (SELECT $1::int AS n) INSERT INTO lattice_s0003.orders (id, customer, total) VALUES ($2, $3, 1), ($4, $3, $5), (3, $3, $2) ON CONFLICT (id) DO UPDATE SET total = $6 RETURNING id`, []int{5, 1, 4, 2, 6, 7}},
	}
	for _, c := range cases {
		s, params := p.RenderRows("lattice_s0003", c.rows)
		if s != c.sql || !reflect.DeepEqual(params, c.params) {
			t.Errorf("rows %v:\n got %s %v\nwant %s %v", c.rows, s, params, c.sql, c.params)
		}
	}
	if got := p.Render("lattice_s0003"); !strings.Contains(got, "INTO lattice_s0003.orders (id") || !strings.Contains(got, "$7") {
		t.Error(got)
	}

	// Parenthesised VALUES source.
	p = planOne(t, `INSERT INTO orders (id) (VALUES (1), (2))`)
	if s, _ := p.RenderRows("s", []int{1}); s != `INSERT INTO s.orders (id) (VALUES (2))` {
		t.Error(s)
	}

	func() {
		defer func() {
			if recover() == nil {
				t.Error("RenderRows on a Single plan did not panic")
			}
		}()
		planOne(t, `SELECT * FROM orders WHERE id = 1`).RenderRows("s", []int{0})
	}()
}

// TestRenderMatchesAST checks each rendered statement of the golden file
// against the parse tree: parsing the rendered text must give the same tree
// as the original with the tree's RangeVar (and public.tree column
// references) moved to the shard schema, and RenderRows must keep exactly
// the chosen rows with their keys.
func TestRenderMatchesAST(t *testing.T) {
	const schema = "lattice_s0042"
	pl := NewPlanner(0)
	n := 0
	for _, sql := range readStatements(t) {
		plans, err := pl.Plan(sql, testTrees(), 1)
		if err != nil {
			continue
		}
		for _, p := range plans {
			if p.Kind != Single && p.Kind != InsertSplit {
				continue
			}
			n++
			want := requalified(t, p.SQL, p.Tree.Name, schema)
			got := deparse(t, p.Render(schema))
			if got != want {
				t.Errorf("%s\nrendered: %s\nwant:     %s", p.SQL, got, want)
			}
			if p.Kind == InsertSplit {
				for i := range p.Rows {
					// Rendered into public, the row is again a Single INSERT.
					s, params := p.RenderRows("public", []int{i})
					sub := planOne(t, s)
					if sub.Kind != Single {
						t.Fatalf("%s: row %d renders to %s", p.SQL, i, sub)
					}
					k := sub.Key
					if k.Param > 0 {
						k.Param = params[k.Param-1]
					}
					if k != p.Rows[i] {
						t.Errorf("%s: row %d key %v, want %v", p.SQL, i, k, p.Rows[i])
					}
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d routed statements checked", n)
	}
}

// requalified deparses sql after setting the schema of every RangeVar and
// public.<tree>.col reference naming the tree.
func requalified(t *testing.T, sql, tree, schema string) string {
	t.Helper()
	res, err := pg.Parse(sql)
	if err != nil {
		t.Fatal(err)
	}
	var fix func(n any)
	fix = func(n any) {
		switch v := n.(type) {
		case *pg.RangeVar:
			if v.Relname == tree && (v.Schemaname == "" || v.Schemaname == "public") {
				v.Schemaname = schema
			}
		case *pg.ColumnRef:
			if len(v.Fields) >= 3 && v.Fields[0].GetString_().GetSval() == "public" && v.Fields[1].GetString_().GetSval() == tree {
				v.Fields[0] = pg.MakeStrNode(schema)
			}
		}
	}
	root, _ := nodeMessage(res.Stmts[0].Stmt)
	w := walkStmt(root)
	for _, r := range w.rels {
		if !r.cte {
			fix(r.rv)
		}
	}
	for _, c := range w.cols {
		fix(c)
	}
	out, err := pg.Deparse(res)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func deparse(t *testing.T, sql string) string {
	t.Helper()
	res, err := pg.Parse(sql)
	if err != nil {
		t.Fatalf("rendered SQL does not parse: %v\n%s", err, sql)
	}
	out, err := pg.Deparse(res)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCacheVersions(t *testing.T) {
	p := NewPlanner(100)
	noOrders := treeMap{}
	plans, _ := p.Plan("SELECT * FROM orders WHERE id = 1", noOrders, 1)
	if plans[0].Kind != Catalog {
		t.Fatal(plans[0])
	}
	again, _ := p.Plan("SELECT * FROM orders WHERE id = 1", noOrders, 1)
	if again[0] != plans[0] {
		t.Fatal("same version did not hit the cache")
	}
	plans, _ = p.Plan("SELECT * FROM orders WHERE id = 1", testTrees(), 2)
	if plans[0].Kind != Single {
		t.Fatal("a new version did not re-plan:", plans[0])
	}
	// A statement that names no relation is valid under every version.
	one, _ := p.Plan("SELECT 1", testTrees(), 2)
	other, _ := p.Plan("SELECT 1", testTrees(), 3)
	if one[0] != other[0] {
		t.Fatal("SELECT 1 was planned again for a new version")
	}
	// Errors are cached too, and stay *sqlstate.Error.
	_, e1 := p.Plan("SELEC 1", nil, 1)
	_, e2 := p.Plan("SELEC 1", nil, 1)
	if e1 == nil || e1 != e2 {
		t.Fatal(e1, e2)
	}
}

func TestCacheBound(t *testing.T) {
	for _, max := range []int{1, 10, 1000} {
		p := NewPlanner(max)
		for i := 0; i < 5*max+100; i++ {
			if _, err := p.Plan(fmt.Sprintf("SELECT %d", i), nil, 1); err != nil {
				t.Fatal(err)
			}
			if p.Len() > max {
				t.Fatalf("max %d: %d entries", max, p.Len())
			}
		}
	}
	// A statement in constant use survives a stream of one-off statements.
	p := NewPlanner(64)
	hot, _ := p.Plan("SELECT 'hot'", nil, 1)
	for i := 0; i < 1000; i++ {
		p.Plan(fmt.Sprintf("SELECT %d", i), nil, 1)
		if i%8 == 0 {
			if again, _ := p.Plan("SELECT 'hot'", nil, 1); again[0] != hot[0] {
				t.Fatalf("hot statement evicted after %d statements", i)
			}
		}
	}
}

func TestConcurrentPlan(t *testing.T) {
	p := NewPlanner(50)
	trees := testTrees()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				sql := fmt.Sprintf("SELECT * FROM orders WHERE id = %d", (i*7+g)%80)
				plans, err := p.Plan(sql, trees, uint64(i%3))
				if err != nil || plans[0].Kind != Single {
					t.Error(sql, plans, err)
					return
				}
				want := fmt.Sprintf("SELECT * FROM lattice_s0001.orders WHERE id = %d", (i*7+g)%80)
				if got := plans[0].Render("lattice_s0001"); got != want {
					t.Error(got)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestQuoteIdent(t *testing.T) {
	cases := map[string]string{
		"catalogue":     "catalogue",
		"lattice_s0005": "lattice_s0005",
		"MixedCase":     `"MixedCase"`,
		"user":          `"user"`,
		"select":        `"select"`,
		"name":          "name", // unreserved keyword
		"int":           `"int"`,
		"_x1":           "_x1",
		"1x":            `"1x"`,
		`a"b`:           `"a""b"`,
		"":              `""`,
		"ñ":             `"ñ"`,
	}
	for in, want := range cases {
		if got := quoteIdent(in); got != want {
			t.Errorf("quoteIdent(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestParsers(t *testing.T) {
	ints := map[string]any{
		"0": int64(0), "-0": int64(0), "+7": int64(7), "007": int64(7), "1_000_000": int64(1000000), "0x_1": nil,
		"0xFF": int64(255), "0o17": int64(15), "0b101": int64(5), "-0x10": int64(-16), "1__0": nil, "_1": nil, "1_": nil,
		"9223372036854775807": int64(9223372036854775807), "9223372036854775808": nil, "-9223372036854775808": int64(-9223372036854775808),
		"1.0": nil, "1e3": nil, "": nil, "-": nil, "0x": nil, "12a": nil,
	}
	for in, want := range ints {
		v, ok := parsePgInt(in)
		if want == nil && ok || want != nil && (!ok || v != want.(int64)) {
			t.Errorf("parsePgInt(%q) = %d %v, want %v", in, v, ok, want)
		}
	}
	uuids := map[string]string{
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11":    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11":    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}":  "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc999c0b4ef8bb6d6bb9bd380a11":        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-":   "",
		"a0e-ebc99-9c0b-4ef8-bb6d-6bb9bd380a11":   "",
		"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11":   "",
		"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g":    "",
	}
	for in, want := range uuids {
		got, ok := parseUUID(in)
		if ok != (want != "") || got != want {
			t.Errorf("parseUUID(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for in, want := range map[string]int{"on": 1, "ON": 1, "t": 1, "tru": 1, "yes": 1, "1": 1, "off": 0, "of": 0, "o": -1, "f": 0, "no": 0, "0": 0, "maybe": -1, "": -1} {
		b, ok := parseBool(in)
		got := -1
		if ok {
			got = 0
			if b {
				got = 1
			}
		}
		if got != want {
			t.Errorf("parseBool(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestStrings(t *testing.T) {
	if Refused.String() != "Refused" || Kind(99).String() != "Kind(99)" || RollbackTo.String() != "RollbackTo" || TxKind(-1).String() != "TxKind(-1)" {
		t.Fatal("names")
	}
	if (Value{Text: "it's"}).String() != `'it''s'` || (Value{Param: 3}).String() != "$3" || (Value{Null: true}).String() != "NULL" {
		t.Fatal("values")
	}
}

func TestCacheTenants(t *testing.T) {
	p := NewPlanner(100)
	a := testTrees()
	b := treeMap{} // a tenant without trees
	const sql = "SELECT * FROM orders WHERE id = $1"
	pa, _ := p.Plan(sql, a, 10)
	pb, _ := p.Plan(sql, b, 11)
	if pa[0].Kind != Single || pb[0].Kind != Catalog {
		t.Fatal(pa[0], pb[0])
	}
	for i := 0; i < 3; i++ {
		qa, _ := p.Plan(sql, a, 10)
		qb, _ := p.Plan(sql, b, 11)
		if qa[0] != pa[0] || qb[0] != pb[0] {
			t.Fatal("tenants evicted each other's plans")
		}
	}
	// More versions than an entry keeps: still correct.
	for v := uint64(20); v < 30; v++ {
		tr := b
		if v%2 == 0 {
			tr = a
		}
		got, _ := p.Plan(sql, tr, v)
		if (got[0].Kind == Single) != (v%2 == 0) {
			t.Fatal(v, got[0])
		}
	}
}

// TestNotifyOnCatalog: a notification is delivered only on the node that
// commits it, and listeners are on the catalog node, so pg_notify never
// follows a transaction to another node as other reads naming no relation do.
func TestNotifyOnCatalog(t *testing.T) {
	cases := []struct {
		sql      string
		anywhere bool
	}{
		{"SELECT 1", true},
		{"SELECT pg_notify('c', 'x')", false},
		{"SELECT upper(pg_notify('c', 'x')::text)", false},
		{"NOTIFY c, 'x'", false},
	}
	for _, tc := range cases {
		plans, err := NewPlanner(0).Plan(tc.sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if p := plans[0]; p.Kind != Catalog || p.Anywhere != tc.anywhere {
			t.Errorf("%s: %v anywhere=%v, want Catalog anywhere=%v", tc.sql, p.Kind, p.Anywhere, tc.anywhere)
		}
	}
}

// Plans derived from a cached shape keep the flags of the plan the shape
// was made from: a second pg_notify with other literals still notifies.
func TestShapeCacheKeepsCatalogFlags(t *testing.T) {
	p := NewPlanner(10)
	for _, c := range []struct {
		first, second    string
		anywhere, notify bool
	}{
		{"SELECT pg_notify('a', 'x')", "SELECT pg_notify('b', 'y')", false, true},
		{"SELECT 1", "SELECT 2", true, false},
	} {
		for _, sql := range []string{c.first, c.second} {
			pl, err := p.Plan(sql, nil, 1)
			if err != nil {
				t.Fatal(err)
			}
			if pl[0].Anywhere != c.anywhere || pl[0].Notify != c.notify {
				t.Errorf("%s: anywhere %v notify %v, want %v %v", sql, pl[0].Anywhere, pl[0].Notify, c.anywhere, c.notify)
			}
		}
	}
}
