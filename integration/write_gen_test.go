package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// writeQueries generates n writes over sqa and its colocated sqb (with
// RETURNING): UPDATE and DELETE filtered by their own columns, by EXISTS
// and IN over the other member and the reference table, joined with
// FROM and USING; INSERT ... SELECT from the other member; multi-row
// INSERT and upserts across shards; writing CTEs of one key read by
// another write; MERGE of one key.
func writeQueries(seed uint64, n int) []string {
	rng := rand.New(rand.NewPCG(seed, seed))
	filters := []string{
		"o.x > 5",
		"o.a % 7 = 0",
		"o.y = 'y3'",
		"EXISTS (SELECT 1 FROM sqb b WHERE b.a = o.a AND b.z > 5)",
		"NOT EXISTS (SELECT 1 FROM sqb b WHERE b.a = o.a)",
		"o.x IN (SELECT r FROM sqr WHERE w > 9)",
		"o.a IN (SELECT a FROM sqb WHERE z = 3)",
		"o.a < 20 OR o.x = 2",
		"o.a = 37",
		"o.a IN (12, 200, 333)",
		"o.a = 150 AND o.x > 1",
		"(o.a, o.x) IN (SELECT b.a, b.z FROM sqb b WHERE b.b > 1)",
		"(o.x, o.a) NOT IN (SELECT b.z, b.a FROM sqb b)",
	}
	forms := []string{
		"UPDATE sqa o SET x = o.x + 1 WHERE @F RETURNING o.a, o.x",
		"UPDATE sqa o SET a = o.a, x = o.x - 1 WHERE @F RETURNING o.a, o.x",
		"UPDATE sqa o SET y = (SELECT r.y2 FROM sqr r WHERE r.r = o.x) WHERE @F RETURNING o.a, o.y",
		"UPDATE sqb i SET z = i.z * 2 FROM sqa o WHERE o.a = i.a AND @F RETURNING i.a, i.b, i.z",
		"DELETE FROM sqb i USING sqa o WHERE o.a = i.a AND @F RETURNING i.a, i.b",
		"DELETE FROM sqa o WHERE @F RETURNING o.a",
		"INSERT INTO sqb (a, b, z) SELECT o.a, 100 + o.x, o.x FROM sqa o WHERE @F RETURNING a, b, z",
		"UPDATE sqa o SET x = (SELECT count(*) FROM sqb b WHERE b.a = o.a) WHERE @F RETURNING o.a, o.x",
		"INSERT INTO sqa (a, x, y) VALUES (@N1, 1, 'n'), (@N2, 2, 'n'), (5, 3, 'n') ON CONFLICT (a) DO UPDATE SET x = EXCLUDED.x + sqa.x RETURNING a, x, y",
		"INSERT INTO sqa AS o (a, x, y) SELECT a + 1000, x, y FROM sqa o WHERE @F ON CONFLICT DO NOTHING RETURNING a",
		"WITH d AS (DELETE FROM sqb WHERE a = @N2 AND z > 3 RETURNING *) INSERT INTO sqb (a, b, z) SELECT a, b + 1000, z FROM d RETURNING a, b, z",
		"WITH u AS (UPDATE sqa SET x = x + 1 WHERE a = @N2 RETURNING a, x) UPDATE sqb i SET z = u.x FROM u WHERE u.a = i.a RETURNING i.a, i.b, i.z",
		"MERGE INTO sqb t USING (VALUES (@N2, 2)) s(a, b) ON t.a = s.a AND t.b = s.b WHEN MATCHED THEN UPDATE SET z = t.z + 1 WHEN NOT MATCHED THEN INSERT (a, b, z) VALUES (s.a, s.b, 0)",
		"MERGE INTO sqa t USING sqr r ON t.a = @N2 AND t.x = r.r WHEN MATCHED AND r.w > 9 THEN DELETE WHEN MATCHED THEN UPDATE SET y = r.y2",
	}
	var out []string
	for range n {
		q := forms[rng.IntN(len(forms))]
		q = strings.ReplaceAll(q, "@F", filters[rng.IntN(len(filters))])
		q = strings.ReplaceAll(q, "@N1", strconv.Itoa(401+rng.IntN(50)))
		q = strings.ReplaceAll(q, "@N2", strconv.Itoa(1+rng.IntN(400)))
		out = append(out, q)
	}
	return out
}

// TestWritesEqualPostgres runs writeQueries through the proxy and on plain
// tables of the same rows, in turn in each of genRuns, each in a
// transaction that is rolled back,
// while the trees reshard: each is refused (0A000), or fails as on the
// plain tables, or returns their rows and leaves both tables as the plain
// tables are left.
func TestWritesEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	makeGenTables(t, c)
	reshards := reshardGenGroup(t, p)
	// write runs q in a transaction it rolls back and returns its rows
	// and, as a count and a sum of row hashes, the rows of sqa and sqb
	// after it (of their plain copies with plain).
	write := func(q string, plain bool, run genRun) ([]string, []string, error) {
		tx, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		rows, err := runGen(t, c, q, run)
		if err != nil {
			return nil, nil, err
		}
		after, err := genState(c, plain)
		if err != nil {
			t.Fatalf("after %s: %v", q, err)
		}
		return rows, after, nil
	}
	ran, refused := 0, 0
	queries := writeQueries(genSeed(t), 100)
	for start := time.Now(); ; {
		for i, q := range queries {
			run := genRuns[i%len(genRuns)]
			got, gotAfter, gerr := write(q, false, run)
			want, wantAfter, werr := write(onPlainTables(q), true, run)
			switch {
			case gerr != nil && pgCode(gerr) == "0A000":
				refused++
			case gerr != nil || werr != nil:
				if pgCode(gerr) != pgCode(werr) {
					t.Errorf("%s (%s): through the trees %v, on plain tables %v", q, run, gerr, werr)
				}
			default:
				ran++
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("%s (%s): %d rows returned through the trees, %d on plain tables; %s", q, run, len(got), len(want), firstDiff(got, want))
				}
				if !slices.Equal(gotAfter, wantAfter) {
					t.Errorf("%s (%s): the trees hold %v after it, the plain tables %v", q, run, gotAfter, wantAfter)
				}
			}
		}
		if t.Failed() || reshards.count() == 3 || time.Since(start) > time.Minute {
			break
		}
	}
	completed, err := reshards.stop()
	t.Logf("%d writes ran, %d were refused; %d of 3 reshards completed meanwhile", ran, refused, completed)
	if err != nil {
		t.Fatalf("reshard: %v", err)
	}
	if ran < (ran+refused)/2 {
		t.Fatalf("only %d of %d writes ran", ran, ran+refused)
	}
}

// genState is the rows of sqa and sqb (of their plain copies with plain)
// as a count and a sum of row hashes each.
func genState(c *pgx.Conn, plain bool) ([]string, error) {
	var state []string
	for _, name := range []string{"sqa", "sqb"} {
		table := name
		if plain {
			table += "_p"
		}
		var n int64
		var sum string
		err := c.QueryRow(context.Background(), "SELECT count(*), coalesce(sum(hashtextextended(t.*::text, 0)), 0)::text FROM "+table+" t").Scan(&n, &sum)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
		state = append(state, fmt.Sprintf("%s %d rows, hash sum %s", name, n, sum))
	}
	return state, nil
}
