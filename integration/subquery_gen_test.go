package integration

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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

// TestSubqueriesEqualPostgres runs subqueryQueries through the proxy and on
// plain tables of the same rows: each is refused (0A000), or fails as on
// the plain tables, or returns their rows.
func TestSubqueriesEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	tables := []struct{ name, cols, fill string }{
		{"sqa", "(a int PRIMARY KEY, x int, y text)", "SELECT g, g % 9, 'y' || g % 5 FROM generate_series(1, 400) g"},
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
	plain := regexp.MustCompile(`\b(sqa|sqb|sqr)\b`)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement}
	ran, refused := 0, 0
	for i, q := range subqueryQueries(7, 160) {
		mode := modes[i%len(modes)]
		got, gerr := queryStrings(t, c, q, mode)
		want, werr := queryStrings(t, c, plain.ReplaceAllString(q, "${1}_p"), mode)
		switch {
		case gerr != nil && pgCode(gerr) == "0A000":
			refused++
		case gerr != nil || werr != nil:
			if pgCode(gerr) != pgCode(werr) {
				t.Errorf("%s: through the trees %v, on plain tables %v", q, gerr, werr)
			}
		default:
			ran++
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s: %d rows through the trees, %d on plain tables; %s", q, len(got), len(want), firstDiff(got, want))
			}
		}
	}
	t.Logf("%d statements ran, %d were refused", ran, refused)
	if ran < 40 {
		t.Fatalf("only %d of 160 statements ran", ran)
	}
}
