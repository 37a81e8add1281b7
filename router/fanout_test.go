package router

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/sqlstate"
)

func TestFanOutRefusals(t *testing.T) {
	cases := []struct{ sql, errHas string }{
		// Aggregating.
		{`SELECT name FROM catalogue ORDER BY count(*)`, "column \"name\" is neither grouped nor aggregated"},
		{`SELECT (SELECT max(c.price)) FROM catalogue c`, "a subquery in an aggregating SELECT"},
		{`SELECT JSON_ARRAYAGG(name) FROM catalogue`, "JSON_ARRAYAGG() over several shards"},
		// Aggregates that run over the gathered rows (windowstep.go).
		{`SELECT name, qty, string_agg(sku, ',') FROM catalogue GROUP BY name`, "column \"qty\" is neither grouped nor aggregated"},
		{`SELECT name, string_agg(sku, ',') FROM catalogue GROUP BY name HAVING qty > 1`, "column \"qty\" is neither grouped nor aggregated"},
		{`SELECT array_agg(c.*) FROM catalogue c`, "a whole-row reference (c.*) in an aggregate"},
		{`SELECT DISTINCT ON (3) name FROM catalogue`, "a DISTINCT ON position is not in the select list"},
		{`SELECT c.name AS n, string_agg(sku, ',') FROM catalogue c JOIN plans USING (name) GROUP BY n`, "cannot tell whether GROUP BY \"n\" names an output column"},
		{`SELECT c.name AS n, count(*) FROM catalogue c JOIN plans USING (name) GROUP BY ROLLUP (n)`, "cannot tell whether GROUP BY \"n\" names an output column"},
		{`SELECT string_agg(name, ',') FROM catalogue FOR UPDATE`, "FOR UPDATE/SHARE"},
		// A derived table in the final step: its outer query reads no table.
		{`SELECT x.n FROM (SELECT name AS n, count(*) FROM catalogue GROUP BY name) x WHERE x.n IN (SELECT name FROM plans)`, "not correlated"},
		{`SELECT count(*) FROM (SELECT DISTINCT name FROM catalogue FOR UPDATE) x`, "not correlated"},
		{`SELECT *, count(*) FROM catalogue c, generate_series(1, 2) g GROUP BY 1`, "the columns of *"},
		// Windows, locking.
		{`SELECT DISTINCT name, rank() OVER (ORDER BY price) FROM catalogue`, "window functions beside DISTINCT over several shards"},
		{`SELECT name, rank() OVER (ORDER BY (SELECT 1)) FROM catalogue`, "a subquery beside window functions"},
		{`WITH x AS (SELECT random() AS r) SELECT name, rank() OVER (ORDER BY price) FROM catalogue, x`, "evaluate random() once per node"},
		{`SELECT c.*, rank() OVER (ORDER BY price) FROM catalogue c JOIN plans USING (name)`, "the columns of * in a window function"},
		{`SELECT public.catalogue.name, rank() OVER (ORDER BY price) FROM catalogue`, "schema-qualified column references in a window function"},
		{`SELECT * FROM catalogue FOR UPDATE`, "FOR UPDATE/SHARE"},
		{`SELECT * FROM catalogue c FOR SHARE OF c SKIP LOCKED`, "FOR UPDATE/SHARE"},
		// Set operations and nesting: a part that is not correlated on the key.
		{`SELECT sku FROM catalogue UNION ALL SELECT 'x'`, "reads no tree in its own FROM"},
		{`SELECT * FROM (SELECT sku FROM catalogue ORDER BY price OFFSET 3) s`, "inside a subquery, CTE or set operation"},
		{`SELECT (SELECT count(*) FROM catalogue), (SELECT 1)`, "inside a subquery, CTE or set operation"},
		{`SELECT ARRAY(SELECT sku FROM catalogue WHERE qty > 1)`, "does not gather a tree's rows whole"},
		{`SELECT 1 IN (SELECT qty FROM catalogue)`, "does not gather a tree's rows whole"},
		{`WITH c AS MATERIALIZED (SELECT * FROM catalogue) SELECT * FROM c`, "inside a subquery, CTE or set operation"},
		{`SELECT * FROM catalogue JOIN customers ON true`, "together with"},
		{`SELECT * FROM catalogue a, catalogue b`, "not joined on equal shard keys"},
		{`SELECT * INTO t FROM catalogue`, "SELECT INTO"},
		// LIMIT, OFFSET, FETCH.
		{`SELECT * FROM catalogue LIMIT 1 + 1`, "LIMIT over several shards must be an integer constant or a $n parameter"},
		{`SELECT * FROM catalogue LIMIT 'five'`, "LIMIT over several shards must be"},
		{`SELECT * FROM catalogue LIMIT 2.5`, "LIMIT over several shards must be"},
		{`SELECT * FROM catalogue LIMIT $1::numeric`, "LIMIT over several shards must be"},
		{`SELECT * FROM catalogue LIMIT (SELECT 1)`, "LIMIT over several shards must be"},
		{`SELECT * FROM catalogue LIMIT -1`, "LIMIT must not be negative"},
		{`SELECT * FROM catalogue OFFSET $1 + 1`, "OFFSET over several shards must be"},
		// ORDER BY keys.
		{`SELECT * FROM catalogue ORDER BY price USING >`, "USING"},
		{`SELECT sku FROM catalogue ORDER BY 0`, "position 0 is not in the select list"},
		{`SELECT sku FROM catalogue ORDER BY 2`, "position 2 is not in the select list"},
		{`SELECT sku FROM catalogue ORDER BY 'x'`, "not a column position"},
		{`SELECT sku AS x, name AS x FROM catalogue ORDER BY x`, "ambiguous"},
		{`SELECT (SELECT 1), sku FROM catalogue ORDER BY sku`, "cannot tell whether ORDER BY"},
		{`SELECT *, price * 2 AS p2 FROM catalogue ORDER BY p2`, "follows *"},
		{`SELECT * FROM catalogue c, generate_series(1, 2) g ORDER BY price`, "whose columns the proxy does not know"},
		// Rewriting.
		{`(SELECT * FROM catalogue ORDER BY 1) LIMIT 3`, "could not rewrite"},
		{`TABLE catalogue ORDER BY sku`, "could not rewrite"},
		{`EXPLAIN TABLE catalogue ORDER BY sku`, "could not rewrite"},
		// EXPLAIN ANALYZE would write some shards only; the plan is text.
		{`EXPLAIN ANALYZE UPDATE catalogue SET qty = 0`, "EXPLAIN ANALYZE of UPDATE over every shard"},
		{`EXPLAIN (ANALYZE 1) DELETE FROM orders WHERE total > 1`, "EXPLAIN ANALYZE of DELETE over every shard"},
		{`EXPLAIN (FORMAT YAML) SELECT * FROM catalogue`, "EXPLAIN (FORMAT YAML)"},
	}
	for _, c := range cases {
		t.Run(c.sql, func(t *testing.T) {
			p := planOne(t, c.sql)
			if p.Kind != Refused {
				t.Fatalf("kind %v, want Refused (%s)", p.Kind, p)
			}
			if p.Err.Code != sqlstate.FeatureNotSupported || p.Err.Hint == "" {
				t.Errorf("error %+v: want 0A000 with a hint", p.Err)
			}
			if !strings.Contains(p.Err.Message, c.errHas) {
				t.Errorf("message %q lacks %q", p.Err.Message, c.errHas)
			}
		})
	}
}

// TestFanOutCollations plans ORDER BY under any collation: a key with
// COLLATE "C" or "POSIX" on the outside merges as bytes; any other key gets
// a collation probe, which tells the proxy the collation PostgreSQL derives
// for it (column, database default, or a COLLATE inside the expression).
func TestFanOutCollations(t *testing.T) {
	for _, c := range []struct {
		sql   string
		bytes []bool
		probe bool
	}{
		{`SELECT sku FROM catalogue ORDER BY name COLLATE "en_US"`, []bool{false}, true},
		{`SELECT sku FROM catalogue ORDER BY upper(name COLLATE "C")`, []bool{false}, true},
		{`SELECT name COLLATE "de_DE" AS n FROM catalogue ORDER BY n`, []bool{false}, true},
		{`SELECT name FROM catalogue ORDER BY name`, []bool{false}, true},
		{`SELECT name FROM catalogue ORDER BY qty, name`, []bool{false, false}, true},
		{`SELECT name FROM catalogue ORDER BY name COLLATE "C", sku COLLATE pg_catalog."POSIX" DESC`, []bool{true, true}, false},
		{`SELECT name FROM catalogue ORDER BY name COLLATE "C", qty`, []bool{true, false}, true},
	} {
		t.Run(c.sql, func(t *testing.T) {
			p := planOne(t, c.sql)
			if p.Kind != FanOut {
				t.Fatalf("kind %v, want FanOut (%s)", p.Kind, p)
			}
			var got []bool
			for _, k := range p.Sort {
				got = append(got, k.ByteOrder)
			}
			if !reflect.DeepEqual(got, c.bytes) {
				t.Errorf("byte order %v, want %v", got, c.bytes)
			}
			if (p.CollationProbe != "") != c.probe {
				t.Errorf("probe %q, want one: %v", p.CollationProbe, c.probe)
			}
		})
	}
}

func TestFanOutPlans(t *testing.T) {
	cases := []struct {
		sql           string
		sort          []btreeindex.SortKey
		hidden        int
		limit, offset string // Value.String(), "" for nil
		branch        string // RenderFanOut of lattice_s0001 alone
	}{
		{sql: `SELECT * FROM catalogue`,
			branch: `(SELECT * FROM lattice_s0001.catalogue)`},
		{sql: `SELECT name, price FROM catalogue ORDER BY price DESC LIMIT $1 OFFSET $2`,
			sort: []btreeindex.SortKey{{Column: 1, Desc: true, NullsFirst: true}}, limit: "$1", offset: "$2",
			branch: `(SELECT name, price FROM lattice_s0001.catalogue) ORDER BY 2 DESC NULLS FIRST LIMIT 7`},
		{sql: `SELECT name FROM catalogue ORDER BY price NULLS FIRST, qty DESC NULLS LAST, name`,
			sort:   []btreeindex.SortKey{{Column: 1, NullsFirst: true}, {Column: 2, Desc: true}, {Column: 0}},
			hidden: 2,
			branch: `(SELECT name, price AS lattice_sort_1, qty AS lattice_sort_2 FROM lattice_s0001.catalogue) ORDER BY 2 ASC NULLS FIRST, 3 DESC NULLS LAST, 1 ASC NULLS LAST LIMIT 7`},
		{sql: `SELECT name AS n FROM catalogue ORDER BY n COLLATE "C"`,
			sort: []btreeindex.SortKey{{Column: 1, ByteOrder: true}}, hidden: 1,
			branch: `(SELECT name AS n, n COLLATE "C" AS lattice_sort_1 FROM lattice_s0001.catalogue) ORDER BY 2 ASC NULLS LAST LIMIT 7`},
		{sql: `SELECT name COLLATE pg_catalog."C" AS n FROM catalogue ORDER BY 1 DESC`,
			sort:   []btreeindex.SortKey{{Column: 0, Desc: true, NullsFirst: true, ByteOrder: true}},
			branch: `(SELECT name COLLATE pg_catalog."C" AS n FROM lattice_s0001.catalogue) ORDER BY 1 DESC NULLS FIRST LIMIT 7`},
		{sql: `SELECT price AS qty, qty AS price FROM catalogue ORDER BY qty, price`,
			sort:   []btreeindex.SortKey{{Column: 0}, {Column: 1}},
			branch: `(SELECT price AS qty, qty AS price FROM lattice_s0001.catalogue) ORDER BY 1 ASC NULLS LAST, 2 ASC NULLS LAST LIMIT 7`},
		{sql: `SELECT c.name, c.price::int FROM catalogue c ORDER BY price, name`,
			sort:   []btreeindex.SortKey{{Column: 1}, {Column: 0}},
			branch: `(SELECT c.name, c.price::int FROM lattice_s0001.catalogue c) ORDER BY 2 ASC NULLS LAST, 1 ASC NULLS LAST LIMIT 7`},
		{sql: `SELECT * FROM "user" ORDER BY name DESC LIMIT ALL`,
			sort: []btreeindex.SortKey{{Column: 2, Desc: true, NullsFirst: true}}, hidden: 1,
			branch: `(SELECT *, name AS lattice_sort_1 FROM lattice_s0001."user") ORDER BY 3 DESC NULLS FIRST LIMIT 7`},
		{sql: `SELECT "Key" FROM "Upper" WHERE "Key" > $1 ORDER BY "Key" FETCH FIRST $2 ROWS ONLY`,
			sort: []btreeindex.SortKey{{Column: 0}}, limit: "$2",
			branch: `(SELECT "Key" FROM lattice_s0001."Upper" WHERE "Key" > $1) ORDER BY 1 ASC NULLS LAST LIMIT 7`},
		{sql: `SELECT sku FROM items OFFSET 10000000000 LIMIT 3::int8`, limit: "'3'", offset: "'10000000000'",
			branch: `(SELECT sku FROM lattice_s0001.items) LIMIT 7`},
		{sql: `SELECT sku FROM items LIMIT ' 5'`, limit: "'5'",
			branch: `(SELECT sku FROM lattice_s0001.items) LIMIT 7`},
		{sql: `SELECT * FROM orders WHERE total > 10;`,
			branch: `(SELECT * FROM lattice_s0001.orders WHERE total > 10)`},
	}
	for _, c := range cases {
		t.Run(c.sql, func(t *testing.T) {
			p := planOne(t, c.sql)
			if p.Kind != FanOut {
				t.Fatalf("kind %v, want FanOut (%s)", p.Kind, p)
			}
			if !reflect.DeepEqual(p.Sort, c.sort) {
				t.Errorf("sort %v, want %v", p.Sort, c.sort)
			}
			if p.Hidden != c.hidden {
				t.Errorf("hidden %d, want %d", p.Hidden, c.hidden)
			}
			str := func(v *Value) string {
				if v == nil {
					return ""
				}
				return v.String()
			}
			if str(p.Limit) != c.limit || str(p.Offset) != c.offset {
				t.Errorf("limit %q offset %q, want %q %q", str(p.Limit), str(p.Offset), c.limit, c.offset)
			}
			limit := int64(7)
			if len(p.Sort) == 0 && p.Limit == nil {
				limit = -1
			}
			if got := p.RenderFanOut(btreeindex.Schemas("lattice_s0001"), limit); got != c.branch {
				t.Errorf("render\n got %s\nwant %s", got, c.branch)
			}
			checkFanOutSQL(t, p)
		})
	}
}

// TestFanOutRenderParses renders every FanOut plan of plans.txt over one,
// two and three schemas and checks the parse of the result.
func TestFanOutRenderParses(t *testing.T) {
	n := 0
	for _, sql := range readStatements(t) {
		plans, err := NewPlanner(0).Plan(sql, testTrees(), 1)
		if err != nil {
			continue
		}
		for _, p := range plans {
			switch {
			case p.Kind == FanOut && p.Agg != nil:
				checkAggSQL(t, p)
			case p.Kind == FanOut:
				n++
				checkFanOutSQL(t, p)
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d FanOut statements in testdata/plans.txt", n)
	}
}

// filtered marks a filter in the sources of the render tests.
const filtered = "lattice_owned"

// checkFanOutSQL checks that RenderFanOut parses to a UNION ALL of one
// branch per schema, each reading the tree in its schema (through a
// subquery with the filter when there is one), with the outer ORDER BY of
// the plan's keys and the LIMIT given.
func checkFanOutSQL(t testing.TB, p *Plan) {
	t.Helper()
	for _, schemas := range [][]btreeindex.Source{btreeindex.Schemas("lattice_s0001"), btreeindex.Schemas("lattice_s0001", "Odd Schema"), btreeindex.Schemas("lattice_s0001", "lattice_s0002", "lattice_s0003"),
		{{Schema: "lattice_s0001", Filter: filtered}}, {{Schema: "lattice_s0001"}, {Schema: "Odd Schema", Filter: filtered}, {Schema: "lattice_s0003"}}} {
		for _, limit := range []int64{-1, 0, 25} {
			sql := p.RenderFanOut(schemas, limit)
			res, err := pg.Parse(sql)
			if err != nil || len(res.Stmts) != 1 {
				t.Fatalf("%s: renders to %s, which does not parse as one statement: %v", p.SQL, sql, err)
			}
			top := res.Stmts[0].Stmt.GetSelectStmt()
			if top == nil {
				t.Fatalf("%s: renders to %s: not a SELECT", p.SQL, sql)
			}
			var leaves []*pg.SelectStmt
			var walk func(s *pg.SelectStmt)
			walk = func(s *pg.SelectStmt) {
				if s.Op == pg.SetOperation_SETOP_NONE {
					leaves = append(leaves, s)
					return
				}
				if s.Op != pg.SetOperation_SETOP_UNION || !s.All {
					t.Fatalf("%s: renders to %s: not UNION ALL", p.SQL, sql)
				}
				walk(s.Larg)
				walk(s.Rarg)
			}
			walk(top)
			if per := setOpBranches(t, p.SQL); per > 1 {
				// A set operation's part per schema is the whole set
				// operation: its branches read their trees in that schema.
				checkSetOpParts(t, p.SQL, sql, leaves, schemas, per)
				continue
			}
			_, queryNested := treeRefs(t, p.SQL, p.Tree.Name)
			if len(leaves) != len(schemas) {
				t.Fatalf("%s: renders to %s: %d branches, want %d", p.SQL, sql, len(leaves), len(schemas))
			}
			for i, l := range leaves {
				w := walkStmt(l)
				found, nested := 0, 0
				for _, r := range w.rels {
					if r.rv.Relname == p.Tree.Name {
						if r.rv.Schemaname != schemas[i].Schema {
							t.Fatalf("%s: branch %d reads %s.%s", sql, i, r.rv.Schemaname, r.rv.Relname)
						}
						// A filter wraps the tree in a subquery; without one
						// the tree is nested only where the query nested it.
						if schemas[i].Filter != "" && !r.nested {
							t.Fatalf("%s: branch %d reads the tree unwrapped with filter %q", sql, i, schemas[i].Filter)
						}
						if r.nested {
							nested++
						}
						found++
					}
				}
				// A join of the tree with itself on its key reads it once per
				// reference, each checked above for its schema and filter.
				if found == 0 {
					t.Fatalf("%s: branch %d does not read the tree", sql, i)
				}
				if schemas[i].Filter == "" && nested != queryNested {
					t.Fatalf("%s: branch %d reads the tree %d times nested, the query %d", sql, i, nested, queryNested)
				}
				if schemas[i].Filter != "" {
					checkFiltered(t, sql, l, p.Tree.Name)
				}
				if len(schemas) > 1 && (len(l.SortClause) > 0 || l.LimitCount != nil || l.LimitOffset != nil) {
					t.Fatalf("%s: branch %d keeps ORDER BY/LIMIT/OFFSET", sql, i)
				}
				if len(schemas) > 1 && len(l.TargetList) < p.Hidden {
					t.Fatalf("%s: branch %d has too few columns", sql, i)
				}
			}
			if len(top.SortClause) != len(p.Sort) {
				t.Fatalf("%s: renders to %s: %d sort keys, want %d", p.SQL, sql, len(top.SortClause), len(p.Sort))
			}
			for i, k := range p.Sort {
				sb := top.SortClause[i].GetSortBy()
				if got := sb.Node.GetAConst().GetIval().GetIval(); int(got) != k.Column+1 {
					t.Fatalf("%s: sort key %d is position %d, want %d", sql, i, got, k.Column+1)
				}
			}
			if (top.LimitCount != nil) != (limit >= 0) || limit >= 0 && int64(top.LimitCount.GetAConst().GetIval().GetIval()) != limit {
				t.Fatalf("%s: renders to %s: wrong LIMIT", p.SQL, sql)
			}
			if top.LimitOffset != nil {
				t.Fatalf("%s: renders to %s: OFFSET pushed down", p.SQL, sql)
			}
		}
	}
}

// TestFanOutNotTemplated: FanOut plans vary with LIMIT/OFFSET literals and
// are never derived from a shape template.
func TestFanOutNotTemplated(t *testing.T) {
	p := NewPlanner(100)
	a, err := p.Plan("SELECT * FROM orders ORDER BY id LIMIT 5 OFFSET 1", testTrees(), 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Plan("SELECT * FROM orders ORDER BY id LIMIT 7 OFFSET 2", testTrees(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Limit.Text != "5" || a[0].Offset.Text != "1" || b[0].Limit.Text != "7" || b[0].Offset.Text != "2" {
		t.Fatalf("%s / %s", a[0], b[0])
	}
	c, _ := p.Plan("SELECT * FROM orders ORDER BY id LIMIT -1", testTrees(), 1)
	if c[0].Kind != Refused {
		t.Fatalf("%s", c[0])
	}
	if p.shapeHits.Load() != 0 {
		t.Fatal("a FanOut plan was derived from a shape template")
	}
}

func TestRenderFanOutPanics(t *testing.T) {
	for _, f := range []func(){
		func() { planOne(t, "SELECT * FROM orders WHERE id = 1").RenderFanOut(btreeindex.Schemas("s"), -1) },
		func() { planOne(t, "SELECT * FROM orders").RenderFanOut(nil, -1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		}()
	}
}

func TestFanOutCalls(t *testing.T) {
	p := planOne(t, `SELECT my_agg(qty), lower(name) FROM catalogue ORDER BY public.Score(price) LIMIT 3`)
	if p.Kind != FanOut {
		t.Fatalf("kind %v: %v", p.Kind, p.Err)
	}
	if !slices.Equal(p.Calls, []string{"my_agg", "lower", "score"}) {
		t.Fatalf("calls = %v", p.Calls)
	}
}

// checkAggSQL checks that the partial and the whole statement of an
// aggregating plan parse and read the tree in each schema once for each
// reference the statement makes to it (each branch of a set operation
// reads every schema), and that the final statement parses over a VALUES
// source.
func checkAggSQL(t testing.TB, p *Plan) {
	t.Helper()
	refs, _ := treeRefs(t, p.SQL, p.Tree.Name)
	for _, schemas := range [][]btreeindex.Source{btreeindex.Schemas("lattice_s0001"), btreeindex.Schemas("lattice_s0001", "Odd Schema", "lattice_s0003"),
		{{Schema: "lattice_s0001"}, {Schema: "Odd Schema", Filter: filtered}}} {
		for _, sql := range []string{p.RenderPartial(schemas), p.RenderWhole(schemas)} {
			res, err := pg.Parse(sql)
			if err != nil || len(res.Stmts) != 1 {
				t.Fatalf("%s: renders to %s, which does not parse as one statement: %v", p.SQL, sql, err)
			}
			seen := map[string]int{}
			for _, r := range walkStmt(selectOf(res.Stmts[0].Stmt)).rels {
				if r.rv.Relname == p.Tree.Name {
					seen[r.rv.Schemaname]++
				}
			}
			if got := strings.Count(sql, " WHERE "+filtered); got != refs && schemas[len(schemas)-1].Filter != "" {
				t.Fatalf("%s: renders to %s: the filter appears %d times, want %d", p.SQL, sql, got, refs)
			}
			for _, sc := range schemas {
				if seen[sc.Schema] != refs || len(seen) != len(schemas) {
					t.Fatalf("%s: renders to %s: reads %v", p.SQL, sql, seen)
				}
			}
		}
	}
	oids := make([]uint32, p.Agg.Columns)
	for i := range oids {
		oids[i] = oidNumeric
	}
	values := make([]string, p.Agg.Columns)
	for i := range values {
		values[i] = "1"
	}
	final, err := p.Agg.RenderFinal(oids, "(VALUES ("+strings.Join(values, ", ")+")) AS "+p.Agg.SourceColumns())
	if err != nil {
		t.Fatalf("%s: final: %v", p.SQL, err)
	}
	if res, err := pg.Parse(final); err != nil || len(res.Stmts) != 1 {
		t.Fatalf("%s: final %s does not parse as one statement: %v", p.SQL, final, err)
	}
}

// checkFiltered checks a filtered branch: its FROM reads the tree through
// a subquery whose WHERE is the filter, and no column reference still
// names a schema.
func checkFiltered(t testing.TB, sql string, branch *pg.SelectStmt, tree string) {
	t.Helper()
	found := false
	from := slices.Clone(branch.FromClause)
	for len(from) > 0 {
		f := from[0]
		from = from[1:]
		if j := f.GetJoinExpr(); j != nil {
			from = append(from, j.Larg, j.Rarg)
			continue
		}
		sub := f.GetRangeSubselect()
		if sub == nil {
			continue
		}
		inner := sub.Subquery.GetSelectStmt()
		if inner == nil {
			continue
		}
		if len(inner.FromClause) != 1 || inner.FromClause[0].GetRangeVar().GetRelname() != tree {
			// The query's own subquery: the wrapper is inside it.
			from = append(from, inner.FromClause...)
			continue
		}
		if inner.WhereClause.GetColumnRef() == nil || sub.Alias == nil {
			t.Fatalf("%s: the filtered subquery has no filter or no alias", sql)
		}
		found = true
	}
	if !found {
		t.Fatalf("%s: no filtered subquery of %s in FROM", sql, tree)
	}
	// public.tree.col must now name the subquery's alias. Other three-part
	// references (a.b.c) name no FROM item, in the statement as in the
	// branch: PostgreSQL rejects both.
	for _, c := range walkStmt(branch).cols {
		n := len(c.Fields)
		if c.Fields[n-3].GetString_().GetSval() == "public" && c.Fields[n-2].GetString_().GetSval() == tree {
			t.Fatalf("%s: a column reference still names a schema", sql)
		}
	}
}

// TestRenderFiltered pins the filtered rendering of a fan-out branch: the
// alias written after the reference is kept, the tree's name is the alias
// when there is none, and public.tree.col references follow it.
func TestRenderFiltered(t *testing.T) {
	src := []btreeindex.Source{{Schema: "lattice_s0002", Filter: "f"}}
	for _, c := range []struct{ sql, want string }{
		{"SELECT * FROM orders WHERE qty > 1",
			`(SELECT * FROM (SELECT * FROM lattice_s0002.orders WHERE f) AS orders WHERE qty > 1)`},
		{"SELECT o.id FROM orders o WHERE o.qty > 1",
			`(SELECT o.id FROM (SELECT * FROM lattice_s0002.orders WHERE f) o WHERE o.qty > 1)`},
		{"SELECT x.id FROM public.orders AS x",
			`(SELECT x.id FROM (SELECT * FROM lattice_s0002.orders WHERE f) AS x)`},
		{"SELECT public.orders.id FROM public.orders WHERE public.orders.qty > 1",
			`(SELECT orders.id FROM (SELECT * FROM lattice_s0002.orders WHERE f) AS orders WHERE orders.qty > 1)`},
	} {
		if got := planOne(t, c.sql).RenderFanOut(src, -1); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.sql, got, c.want)
		}
	}
	agg := planOne(t, "SELECT count(*) FROM orders")
	if got, want := agg.RenderPartial([]btreeindex.Source{{Schema: "lattice_s0001"}, {Schema: "lattice_s0002", Filter: "f"}}),
		"SELECT * FROM lattice_s0001.orders UNION ALL SELECT * FROM lattice_s0002.orders WHERE f"; !strings.Contains(got, want) {
		t.Errorf("partial %s does not contain %s", got, want)
	}
}

// selectOf is the SELECT of a statement: itself, or a COPY's query.
func selectOf(n *pg.Node) *pg.SelectStmt {
	if c := n.GetCopyStmt(); c != nil {
		return c.Query.GetSelectStmt()
	}
	return n.GetSelectStmt()
}

// treeRefs counts the query's references to the tree, and those of them
// inside a subquery.
func treeRefs(t testing.TB, sql, tree string) (all, nested int) {
	t.Helper()
	res, err := pg.Parse(sql)
	if err != nil || len(res.Stmts) != 1 {
		t.Fatalf("%s does not parse: %v", sql, err)
	}
	for _, r := range walkStmt(selectOf(res.Stmts[0].Stmt)).rels {
		if r.rv.Relname == tree {
			all++
			if r.nested {
				nested++
			}
		}
	}
	return all, nested
}

// setOpBranches counts the branches of the statement sql: 1 unless it is a
// set operation.
func setOpBranches(t testing.TB, sql string) int {
	t.Helper()
	res, err := pg.Parse(sql)
	if err != nil || len(res.Stmts) != 1 {
		t.Fatalf("%s does not parse: %v", sql, err)
	}
	var count func(s *pg.SelectStmt) int
	count = func(s *pg.SelectStmt) int {
		if s == nil || s.Op == pg.SetOperation_SETOP_NONE {
			return 1
		}
		return count(s.Larg) + count(s.Rarg)
	}
	return count(res.Stmts[0].Stmt.GetSelectStmt())
}

// checkSetOpParts checks the render of a set operation over schemas: per
// branches for each schema in turn, every tree they read in that schema.
func checkSetOpParts(t testing.TB, stmt, sql string, leaves []*pg.SelectStmt, schemas []btreeindex.Source, per int) {
	t.Helper()
	if len(leaves) != per*len(schemas) {
		t.Fatalf("%s: renders to %s: %d branches, want %d", stmt, sql, len(leaves), per*len(schemas))
	}
	trees := testTrees()
	for i, l := range leaves {
		want := schemas[i/per].Schema
		found := 0
		for _, r := range walkStmt(l).rels {
			if _, ok := trees[r.rv.Relname]; ok && r.rv.Schemaname != "" {
				if r.rv.Schemaname != want {
					t.Fatalf("%s: branch %d reads %s.%s, want schema %s", sql, i, r.rv.Schemaname, r.rv.Relname, want)
				}
				found++
			}
		}
		if found == 0 {
			t.Fatalf("%s: branch %d reads no tree", sql, i)
		}
	}
}
