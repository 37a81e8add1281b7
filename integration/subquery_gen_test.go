package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// subqueryQueries generates n SELECTs over tree sqa (alone or joined to
// its colocated sqb) whose select lists hold scalar subqueries with
// aggregates: of the outer row's columns only, of the subquery's own
// table, qualified or not, correlated or not, nested. PostgreSQL places
// each aggregate at the level its columns come from, and so must the
// proxy, or refuse.
func subqueryQueries(seed uint64, n int) []string {
	rng := rand.New(rand.NewPCG(seed, seed))
	froms := []string{
		"sqa o",
		"sqa o JOIN sqb i USING (a)",
		"sqa o LEFT JOIN sqb i ON i.a = o.a AND i.b < 3",
	}
	subs := []string{
		"(SELECT AGG(o.x))",
		"(SELECT AGG(w) FROM sqr)",
		"(SELECT AGG(x) FROM sqr)",
		"(SELECT AGG(y) FROM sqr)",
		"(SELECT AGG(r.w) FROM sqr r WHERE r.r = o.x)",
		"(SELECT AGG(o.x + r.w) FROM sqr r)",
		"(SELECT AGG(r.w) FROM sqr r WHERE r.r <= o.a % 5)",
		"(SELECT count(*) FROM sqr)",
		"(SELECT AGG(b.z) FROM sqb b WHERE b.a = o.a)",
		"(SELECT AGG(z) FROM sqb b WHERE b.a = o.a)",
		"(SELECT coalesce(AGG(r.w), 0) + o.x FROM sqr r WHERE r.r = o.a % 9)",
		"(SELECT AGG((SELECT o.x)) FROM sqr)",
		"(SELECT AGG((SELECT s.w FROM sqr s WHERE s.r = t.r)) FROM sqr t)",
		"(SELECT AGG(o.a) FROM sqr WHERE false)",
		"(SELECT AGG(i.b))",
	}
	aggs := []string{"max", "min", "sum", "count"}
	wheres := []string{"", " WHERE o.a < 50", " WHERE o.x = 3"}
	var out []string
	for range n {
		var sel []string
		if rng.IntN(3) > 0 {
			sel = append(sel, "o.a")
		}
		for k := 1 + rng.IntN(2); k > 0; k-- {
			s := strings.ReplaceAll(subs[rng.IntN(len(subs))], "AGG", aggs[rng.IntN(len(aggs))])
			sel = append(sel, s+fmt.Sprintf(" AS s%d", k))
		}
		from := froms[rng.IntN(len(froms))]
		q := "SELECT " + strings.Join(sel, ", ") + " FROM " + from + wheres[rng.IntN(len(wheres))]
		if rng.IntN(4) == 0 {
			q += " GROUP BY o.a"
		}
		out = append(out, q)
	}
	return out
}

// shapeQueries generates n SELECTs over sqa, its colocated sqb and the
// reference table sqr: joins (inner, outer, LATERAL, a derived table, a
// CTE), filters by EXISTS, IN and NOT IN, plain rows, aggregates,
// DISTINCT and windows, some sorted by every output column and cut by
// LIMIT, so that the rows PostgreSQL returns are determined.
func shapeQueries(seed uint64, n int) []string {
	rng := rand.New(rand.NewPCG(seed, seed))
	froms := []string{
		"sqa o",
		"sqa o JOIN sqb i USING (a)",
		"sqa o LEFT JOIN sqb i USING (a)",
		"sqb i RIGHT JOIN sqa o USING (a)",
		"sqa o FULL JOIN sqb i ON i.a = o.a AND i.z > 4",
		"sqa o JOIN sqr r ON r.r = o.x",
		"sqa o LEFT JOIN sqr r ON r.r = o.x + 3",
		"(SELECT a, x, y FROM sqa WHERE x > 2) o",
		"sqa o, LATERAL (SELECT count(*) AS c, max(b.z) AS mz FROM sqb b WHERE b.a = o.a) l",
		"sqa o JOIN c USING (a)",
		"sqa o JOIN (SELECT a, sum(z) AS sz FROM sqb GROUP BY a) g USING (a)",
		"sqa o NATURAL JOIN sqb i",
		"sqa o NATURAL LEFT JOIN sqb i",
	}
	wheres := []string{
		"",
		" WHERE o.x > 3",
		" WHERE EXISTS (SELECT 1 FROM sqb b WHERE b.a = o.a AND b.z > 5)",
		" WHERE o.a IN (SELECT a FROM sqb WHERE z = 3)",
		" WHERE NOT EXISTS (SELECT 1 FROM sqb b WHERE b.a = o.a)",
		" WHERE o.a NOT IN (SELECT a FROM sqb WHERE z > 8)",
		" WHERE o.y IN (SELECT y2 FROM sqr) OR o.x = 1",
		" WHERE o.x = (SELECT max(r.r) FROM sqr r WHERE r.w < 15)",
		" WHERE o.t < 'emile'",
		" WHERE o.t BETWEEN 'a' AND 'Z'",
		" WHERE o.a = 37",
		" WHERE o.a IN (12, 200, 333)",
		" WHERE o.a BETWEEN 100 AND 140 AND o.x < 7",
		" WHERE (o.a, o.x) IN (SELECT b.a, b.z FROM sqb b WHERE b.b > 1)",
		" WHERE (o.x, o.a) NOT IN (SELECT b.z, b.a FROM sqb b)",
	}
	lists := []struct {
		cols    []string
		grouped bool
	}{
		{cols: []string{"o.a", "o.x", "o.y"}},
		{cols: []string{"o.x", "count(*)", "sum(o.a)", "max(o.y)"}, grouped: true},
		{cols: []string{"count(*)", "count(DISTINCT o.x)", "min(o.a)"}},
		{cols: []string{"o.y", "avg(o.a)::numeric(10,3)", "string_agg(o.a::text, ',' ORDER BY o.a)"}, grouped: true},
		{cols: []string{"o.a", "rank() OVER (PARTITION BY o.a ORDER BY o.x)"}},
		{cols: []string{"o.a", "row_number() OVER (ORDER BY o.a, o.x, o.y)"}},
		{cols: []string{"o.x", "sum(o.a) OVER (PARTITION BY o.x)"}},
		{cols: []string{"DISTINCT o.x", "o.y"}},
		{cols: []string{"DISTINCT ON (o.x) o.x", "o.a"}},
		{cols: []string{"o.a", "o.t"}},
		{cols: []string{"o.t", "o.a"}},
		{cols: []string{"o.x", "o.t", "o.a"}},
		{cols: []string{"o.m", "o.a"}},
		{cols: []string{"o.m", "o.y", "o.a"}},
		{cols: []string{"DISTINCT o.t"}},
		{cols: []string{"o.t", "count(*)", "min(o.a)"}, grouped: true},
		{cols: []string{"min(o.t)", "max(o.t)", "count(DISTINCT o.t)"}},
		{cols: []string{"o.t", "rank() OVER (ORDER BY o.t)"}},
		{cols: []string{"o.y", "string_agg(o.t, '|' ORDER BY o.t, o.a)", "max(o.t)"}, grouped: true},
	}
	var out []string
	for range n {
		l := lists[rng.IntN(len(lists))]
		from := froms[rng.IntN(len(froms))]
		q := ""
		if strings.Contains(from, "JOIN c ") {
			q = "WITH c AS (SELECT a, z FROM sqb WHERE z > 2) "
		}
		q += "SELECT " + strings.Join(l.cols, ", ") + " FROM " + from + wheres[rng.IntN(len(wheres))]
		if l.grouped {
			q += " GROUP BY 1"
		}
		// Every output column sorts, so a LIMIT cuts known rows; DISTINCT
		// ON keeps the first row of each x in that order.
		var order []string
		for i := range l.cols {
			order = append(order, fmt.Sprintf("%d", i+1)+[]string{"", " DESC", " NULLS FIRST", " DESC NULLS LAST"}[rng.IntN(4)])
		}
		switch {
		case strings.HasPrefix(l.cols[0], "DISTINCT ON"):
			q += " ORDER BY o.x, o.a DESC"
		case rng.IntN(2) == 0:
			q += " ORDER BY " + strings.Join(order, ", ") + fmt.Sprintf(" LIMIT %d", 1+rng.IntN(30))
		}
		out = append(out, q)
	}
	return out
}

// TestSubqueriesEqualPostgres runs subqueryQueries and shapeQueries
// through the proxy and on plain tables of the same rows, in turn in each
// of genRuns, while the trees reshard: each is refused (0A000), or fails
// as on the plain tables, or returns their rows.
func TestSubqueriesEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	makeGenTables(t, c)
	reshards := reshardGenGroup(t, p)
	ran, refused := 0, 0
	seed := genSeed(t)
	queries := append(subqueryQueries(seed, 160), shapeQueries(seed+4, 200)...)
	// The statements run again until the reshards have completed, or a
	// minute has passed, so that many of them meet a migration.
	for start := time.Now(); ; {
		for i, q := range queries {
			run := genRuns[i%len(genRuns)]
			got, gerr := runGen(t, c, q, run)
			want, werr := runGen(t, c, onPlainTables(q), run)
			switch {
			case gerr != nil && pgCode(gerr) == "0A000":
				refused++
			case gerr != nil || werr != nil:
				if pgCode(gerr) != pgCode(werr) {
					t.Errorf("%s (%s): through the trees %v, on plain tables %v", q, run, gerr, werr)
				}
			default:
				ran++
				if !topOrdered(q) {
					slices.Sort(got)
					slices.Sort(want)
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s (%s): %d rows through the trees, %d on plain tables; %s", q, run, len(got), len(want), firstDiff(got, want))
				}
			}
		}
		if t.Failed() || reshards.count() == 3 || time.Since(start) > time.Minute {
			break
		}
	}
	completed, err := reshards.stop()
	t.Logf("%d statements ran, %d were refused; %d of 3 reshards completed meanwhile", ran, refused, completed)
	if err != nil {
		t.Fatalf("reshard: %v", err)
	}
	if ran < (ran+refused)/3 {
		t.Fatalf("only %d of %d statements ran", ran, ran+refused)
	}
}

// reshardGenGroup reshards the group of makeGenTables to 16, 5 and 11
// shards beside a test's statements, through a pool that the test's end
// closes: some statements read mixed shards and frozen slots.
func reshardGenGroup(t *testing.T, p *proxyProc) *reshardsBeside {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return startReshardsBeside(ctx, pool, "sqa", 16, 5, 11)
}

// makeGenTables makes the generated statements' tables through the proxy:
// tree sqa, its colocated sqb and reference table sqr, and plain copies
// of each (sqa_p, sqb_p, sqr_p) on the catalog node.
func makeGenTables(t *testing.T, c *pgx.Conn) {
	t.Helper()
	tables := []struct{ name, cols, fill string }{
		// t sorts under an ICU collation, which does not order bytes: the
		// proxy's merges and final steps must order and compare it so.
		{"sqa", `(a int PRIMARY KEY, x int, y text, t text COLLATE "en-US-x-icu", m int)`, `SELECT g, g % 9, 'y' || g % 5,
			CASE WHEN g % 17 = 0 THEN NULL ELSE (ARRAY['zoë','Zoe','émile','Emile','emile','Ärger','arger','b','B','_x','', 'a b', 'ab', 'résumé', 'resume'])[1 + g % 15] END,
			CASE WHEN g % 13 = 0 THEN NULL ELSE g % 6 END
			FROM generate_series(1, 400) g`},
		{"sqb", "(a int, b int, z int, PRIMARY KEY (a, b))", "SELECT g, h, g * h % 11 FROM generate_series(1, 400) g, generate_series(1, g % 4) h"},
		{"sqr", "(r int PRIMARY KEY, w int, y2 text)", "SELECT g, g * 3, 'r' || g FROM generate_series(0, 8) g"},
	}
	for _, tb := range tables {
		for _, name := range []string{tb.name, tb.name + "_p"} {
			mustExec(t, c, "CREATE TABLE "+name+" "+tb.cols)
			mustExec(t, c, "INSERT INTO "+name+" "+tb.fill)
		}
	}
	mustExec(t, c, `SELECT lattice_create_tree('sqa', 'a', shard_count => 8)`)
	mustExec(t, c, `SELECT lattice_create_tree('sqb', 'a', colocate_with => 'sqa')`)
	mustExec(t, c, `SELECT lattice_create_reference_table('sqr')`)
}

var genTableNames = regexp.MustCompile(`\b(sqa|sqb|sqr)\b`)

// onPlainTables is a generated statement over the plain copies.
func onPlainTables(q string) string { return genTableNames.ReplaceAllString(q, "${1}_p") }

// genSeed draws the generated statements: LATTICE_GEN_SEED draws others,
// to look further.
func genSeed(t *testing.T) uint64 { return genSeedOr(t, 7) }

// genSeedOr is genSeed for a test whose statements are drawn from seed
// unless LATTICE_GEN_SEED says otherwise.
func genSeedOr(t *testing.T, seed uint64) uint64 {
	v := os.Getenv("LATTICE_GEN_SEED")
	if v == "" {
		return seed
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("LATTICE_GEN_SEED: %v", err)
	}
	return n
}

// topOrdered reports whether a generated statement ends in its own ORDER
// BY, after every parenthesis (not a window's or a subquery's): its order
// is then total, every output column sorted, and is compared too.
func topOrdered(q string) bool {
	return strings.LastIndex(q, " ORDER BY ") > strings.LastIndex(q, ")")
}
