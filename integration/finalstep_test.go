package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestFinalStepInTransaction: the final step of an aggregate over several
// nodes, which runs on a pooled backend of the catalog node, evaluates its
// expressions as the client's transaction block does: under its SET
// LOCALs, isolation level and READ ONLY, in both protocols, on both of its
// paths (a VALUES list of the partial rows, and past 65,535 partial values
// a temporary table). It ran outside the block, so a SET LOCAL TimeZone
// did not format its timestamps. Nothing of the block stays on the pooled
// backends afterwards, an error in the final step included.
func TestFinalStepInTransaction(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE fin (k bigint PRIMARY KEY, g int NOT NULL, v int NOT NULL)`)
	mustExec(t, c, `INSERT INTO fin SELECT i, i, i % 7 FROM generate_series(1, 40000) i`)
	mustExec(t, c, `SELECT lattice_create_tree('fin', 'k', shard_count => 8)`)

	// Each query's rows print as "<timestamp text> <TimeZone> <isolation> <read only>".
	queries := map[string]string{
		// 7 groups: the partial rows travel as parameters of a VALUES list.
		"values": `SELECT min(to_timestamp(k))::text, current_setting('TimeZone'), current_setting('transaction_isolation'),
			current_setting('transaction_read_only') FROM fin GROUP BY v ORDER BY v`,
		// 40,000 groups of two partial columns: a temporary table.
		"temporary table": `SELECT min(to_timestamp(k))::text, current_setting('TimeZone'), current_setting('transaction_isolation'),
			current_setting('transaction_read_only') FROM fin GROUP BY g ORDER BY g LIMIT 3`,
	}
	check := func(t *testing.T, mode pgx.QueryExecMode, sql, zone, isolation, readOnly string) {
		t.Helper()
		rows, err := c.Query(ctx, sql, mode)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		offset := map[string]string{"Asia/Tokyo": "+09", "Etc/UTC": "+00"}[zone]
		n := 0
		for rows.Next() {
			var ts, tz, iso, ro string
			if err := rows.Scan(&ts, &tz, &iso, &ro); err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(ts, offset) || tz != zone || iso != isolation || ro != readOnly {
				t.Fatalf("row %q %q %q %q: want a timestamp at %s, TimeZone %s, isolation %s, read only %s", ts, tz, iso, ro, offset, zone, isolation, readOnly)
			}
			n++
		}
		if err := rows.Err(); err != nil || n == 0 {
			t.Fatalf("%d rows, %v", n, err)
		}
	}
	modes := map[string]pgx.QueryExecMode{"simple": pgx.QueryExecModeSimpleProtocol, "extended": pgx.QueryExecModeCacheStatement}
	for mname, mode := range modes {
		for qname, sql := range queries {
			t.Run(mname+" "+qname, func(t *testing.T) {
				mustExec(t, c, `BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY`)
				mustExec(t, c, `SET LOCAL TimeZone = 'Asia/Tokyo'`)
				check(t, mode, sql, "Asia/Tokyo", "repeatable read", "on")
				mustExec(t, c, `COMMIT`)

				mustExec(t, c, `BEGIN`)
				mustExec(t, c, `SET LOCAL TimeZone = 'Asia/Tokyo'`)
				if _, err := c.Exec(ctx, `SELECT v, 1 / (min(v) - min(v)) FROM fin GROUP BY v`, mode); err == nil || pgCode(err) != "22012" {
					t.Fatalf("a final step that divides by zero: %v, want 22012", err)
				}
				mustExec(t, c, `ROLLBACK`)

				// Outside a block, on the same pooled backends: nothing stayed.
				for range 3 {
					check(t, mode, sql, "Etc/UTC", "read committed", "off")
				}
			})
		}
	}
}

// TestHelperBackendsParseAsTheSession: the proxy's own statements that read
// the nodes' values back in text form, the sort in PostgreSQL of a fan-out
// under a collation the merge cannot reproduce and the final step of an
// aggregate, parse them under the session's settings and the transaction
// block's SET LOCALs. Run on a pooled backend another client just left at
// the default DateStyle (ISO, MDY), the German "27.01.1970" failed to parse
// (22008), and "02.03.1970" would have been read as the 3rd of February.
// Dates in that DateStyle, which the merge cannot read, are sorted there
// too (they were refused, 0A000).
// The tree's shards are off the catalog node, so that the statement's own
// backends there are not the helpers'.
func TestHelperBackendsParseAsTheSession(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	other := connect(t, p.DSN("lattice"))
	const fill = `SELECT i, date '1970-01-01' + i * 11, 'n' || i % 2 FROM generate_series(1, 60) i`
	mustExec(t, c, `CREATE TABLE dated (k bigint PRIMARY KEY, d date NOT NULL, n text NOT NULL)`)
	mustExec(t, c, `INSERT INTO dated `+fill)
	mustExec(t, c, `SELECT lattice_create_tree('dated', 'k', shard_count => 4)`)
	mustExec(t, c, `CREATE TABLE dated_plain (k bigint PRIMARY KEY, d date NOT NULL, n text NOT NULL)`)
	mustExec(t, c, `INSERT INTO dated_plain `+fill)
	mustExec(t, c, `SELECT lattice_drain_node('n1')`)
	deadline := time.Now().Add(30 * time.Second)
	for drained := false; !drained; time.Sleep(100 * time.Millisecond) {
		if err := c.QueryRow(ctx, `SELECT lattice_drain_complete('n1')`).Scan(&drained); err != nil || time.Now().After(deadline) {
			t.Fatalf("drain of n1: done %v, %v", drained, err)
		}
	}

	same := func(t *testing.T, sql string, mode pgx.QueryExecMode) {
		t.Helper()
		// Twice: the first run's collation probe sets the session's
		// settings on the helper it takes; the second takes its sort's
		// helper straight from the other client, at the defaults.
		for range 2 {
			mustExec(t, other, `SELECT 1`)
			got, err := rawStrings(ctx, c, sql, mode)
			if err != nil {
				t.Fatalf("through the tree: %v", err)
			}
			want, err := rawStrings(ctx, c, strings.ReplaceAll(sql, "FROM dated", "FROM dated_plain"), mode)
			if err != nil {
				t.Fatalf("on the plain table: %v", err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%d rows through the tree, %d on one table; first difference:\n%s", len(got), len(want), firstDiff(got, want))
			}
		}
	}
	// The merge cannot order und-x-icu: the nodes' rows go to PostgreSQL
	// with their sort values, the dates in the session's DateStyle.
	sorted := `SELECT n COLLATE "und-x-icu" AS n, d, k FROM dated ORDER BY n, d DESC, k`
	// The merge reads dates in DateStyle ISO only: these go to PostgreSQL too.
	dates := `SELECT d, k FROM dated ORDER BY d DESC, k LIMIT 20`
	grouped := `SELECT n, min(d)::text, max(d)::text, count(*) FROM dated GROUP BY n ORDER BY n`
	modes := map[string]pgx.QueryExecMode{"simple": pgx.QueryExecModeSimpleProtocol, "extended": pgx.QueryExecModeCacheStatement}
	for name, mode := range modes {
		t.Run(name+" session", func(t *testing.T) {
			mustExec(t, c, `SET DateStyle = 'German'`)
			defer mustExec(t, c, `RESET DateStyle`)
			same(t, sorted, mode)
			same(t, dates, mode)
			same(t, grouped, mode)
		})
		t.Run(name+" transaction", func(t *testing.T) {
			mustExec(t, c, `BEGIN`)
			defer mustExec(t, c, `ROLLBACK`)
			mustExec(t, c, `SET LOCAL DateStyle = 'German'`)
			same(t, sorted, mode)
			same(t, dates, mode)
			same(t, grouped, mode)
		})
	}
}

// rawStrings runs sql and returns each row's values as the server sent
// them, joined by "|": a date in the session's DateStyle stays as it is.
func rawStrings(ctx context.Context, c *pgx.Conn, sql string, mode pgx.QueryExecMode) ([]string, error) {
	rows, err := c.Query(ctx, sql, mode)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var vals []string
		for _, v := range rows.RawValues() {
			vals = append(vals, string(v))
		}
		out = append(out, strings.Join(vals, "|"))
	}
	return out, rows.Err()
}
