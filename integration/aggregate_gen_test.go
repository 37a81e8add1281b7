package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// aggregateQueries generates n aggregating SELECTs over table @T from
// seed: aggregates the two steps combine and ones that run over the
// gathered rows, grouping sets, HAVING, DISTINCT ON, windows over groups,
// a derived table and a scalar subquery around them.
func aggregateQueries(seed uint64, n int) []string {
	rng := rand.New(rand.NewPCG(seed, seed))
	aggs := []string{"count(*)", "count(n)", "sum(id)", "string_agg(s, ',' ORDER BY s, id)", "array_agg(id ORDER BY id) FILTER (WHERE id < 40)",
		"bool_and(id > 3)", "bool_or(n > 600)", "max(s)", "min(n)", "avg(id)::numeric(20,4)", "stddev_samp(id)::numeric(20,4)",
		"percentile_disc(0.5) WITHIN GROUP (ORDER BY id)", "count(DISTINCT g)", "count(*) FILTER (WHERE g > 2)",
		"sum(n) FILTER (WHERE s LIKE 'v1%')", "count(DISTINCT (g, s))", "mode() WITHIN GROUP (ORDER BY g)", "bit_or(id)", "min(ts)"}
	keys := []string{"g", "s", "g % 3", "(id % 4)", "j->>'a'", "n IS NULL", "upper(s)", "id"} // id, the key: groups run whole on the shards
	wheres := []string{"", "WHERE id < 300", "WHERE n > 100", "WHERE g IN (1, 2)", "WHERE s <> 'v3'", "WHERE id % 7 = 0", "WHERE false"}
	pick := func(from []string, k int) []string {
		out := slices.Clone(from)
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out[:k]
	}
	var qs []string
	for range n {
		k := pick(keys, 1+rng.IntN(2))
		a := pick(aggs, 1+rng.IntN(2))
		w := wheres[rng.IntN(len(wheres))]
		var sel []string
		for i, x := range k {
			sel = append(sel, fmt.Sprintf("%s AS k%d", x, i))
		}
		for i, x := range a {
			sel = append(sel, fmt.Sprintf("%s AS a%d", x, i))
		}
		from := fmt.Sprintf("SELECT %s FROM @T %s", strings.Join(sel, ", "), w)
		group := strings.Join(k, ", ")
		var q string
		switch rng.IntN(8) {
		case 0:
			q = from + " GROUP BY " + group
		case 1:
			q = from + " GROUP BY ROLLUP (" + group + ")"
		case 2:
			q = from + " GROUP BY GROUPING SETS ((" + group + "), ())"
		case 3:
			q = from + " GROUP BY DISTINCT " + group + ", ()"
		case 4:
			q = from + " GROUP BY " + group + fmt.Sprintf(" HAVING count(*) > %d", []int{1, 10, 100}[rng.IntN(3)])
		case 5:
			q = fmt.Sprintf("SELECT DISTINCT ON (%s) %s AS d, id, s FROM @T %s ORDER BY %s, s DESC, id", k[0], k[0], w, k[0])
		case 6:
			q = fmt.Sprintf("SELECT count(*), count(DISTINCT a0) FROM (%s GROUP BY %s) sub", from, group)
		default:
			q = fmt.Sprintf("SELECT (SELECT %s FROM @T %s) AS x", a[0], w)
		}
		qs = append(qs, q)
	}
	return qs
}

// TestAggregatesEqualPostgres runs generated aggregating SELECTs on a
// tree and on a plain table holding the same rows, in the simple and the
// extended protocol, while the tree is resharded: each result must be
// PostgreSQL's, rows in any order.
func TestAggregatesEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	const cols = `(id int PRIMARY KEY, g int, s text, n numeric, ts timestamptz, j jsonb)`
	const fill = `SELECT i, i % 7, 'v' || (i % 13), CASE WHEN i % 5 = 0 THEN NULL ELSE i / 3.0 END,
		timestamptz '2026-01-01' + i * interval '1 hour', jsonb_build_object('a', i % 4) FROM generate_series(1, 6000) i`
	for _, table := range []string{"agt", "agp"} {
		mustExec(t, c, `CREATE TABLE `+table+` `+cols)
		mustExec(t, c, `INSERT INTO `+table+` `+fill)
	}
	mustExec(t, c, `SELECT lattice_create_tree('agt', 'id', shard_count => 8)`)

	// Reshards run beside the queries, so that some read mixed shards
	// and frozen slots.
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reshards := startReshardsBeside(ctx, pool, "agt", 16, 5, 11, 8)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement}
	check := func(q string, mode pgx.QueryExecMode, args ...any) {
		t.Helper()
		got, gerr := queryStrings(t, c, strings.ReplaceAll(q, "@T", "agt"), append([]any{mode}, args...)...)
		want, werr := queryStrings(t, c, strings.ReplaceAll(q, "@T", "agp"), append([]any{mode}, args...)...)
		if werr != nil {
			t.Fatalf("on the plain table: %s: %v", q, werr)
		}
		if gerr != nil {
			t.Errorf("through the tree: %s: %v", q, gerr)
			return
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %d rows through the tree, %d on one table; %s", q, len(got), len(want), firstDiff(got, want))
		}
	}
	for i, q := range aggregateQueries(genSeedOr(t, 1), 120) {
		check(q, modes[i%len(modes)])
	}
	// TABLESAMPLE of all rows and of none reads the same on a tree as on a
	// table, and PostgreSQL types the clause's parameter. Before, each of
	// these was refused (0A000) or failed (42601): the clause stayed on
	// the union of a node's shards.
	for _, mode := range modes {
		for _, q := range []string{
			"SELECT count(*), sum(id) FROM @T TABLESAMPLE SYSTEM (100)",
			"SELECT g, count(*) FROM @T TABLESAMPLE BERNOULLI (100) REPEATABLE (3) WHERE id < 300 GROUP BY g",
			"SELECT count(*) FROM @T a TABLESAMPLE SYSTEM (100) JOIN @T b USING (id)",
			"SELECT count(*) FROM (SELECT id FROM @T TABLESAMPLE BERNOULLI (0)) s",
		} {
			check(q, mode)
		}
	}
	check("SELECT count(*), max(s) FROM @T TABLESAMPLE BERNOULLI ($1) WHERE g = $2", pgx.QueryExecModeCacheStatement, 100.0, 3)
	completed, err := reshards.stop()
	t.Logf("%d of 4 reshards completed while the queries ran", completed)
	if err != nil {
		t.Fatalf("reshard: %v", err)
	}
}
