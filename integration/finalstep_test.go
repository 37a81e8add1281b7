package integration

import (
	"context"
	"strings"
	"testing"

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
