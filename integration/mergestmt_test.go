package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestMergeStatementOneShard runs the MERGE upsert that query builders
// write, with the key fixed in ON through a one-row source, in both
// protocols, and checks that a MERGE that could touch or make rows of
// other keys is refused and changes nothing.
func TestMergeStatementOneShard(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	ctx := context.Background()
	mustExec(t, c, `CREATE TABLE mg (k int, id int, n int, PRIMARY KEY (k, id))`)
	mustExec(t, c, `INSERT INTO mg SELECT g % 20, g, 0 FROM generate_series(1, 100) g`)
	mustExec(t, c, `SELECT lattice_create_tree('mg', 'k', shard_count => 4)`)

	const upsert = `MERGE INTO mg t USING (VALUES ($1::int, $2::int)) s(k, id) ON t.k = s.k AND t.id = s.id
		WHEN MATCHED THEN UPDATE SET n = t.n + 1 WHEN NOT MATCHED THEN INSERT (k, id, n) VALUES (s.k, s.id, 1)`
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		for _, kid := range [][2]int{{3, 3}, {3, 1003}, {3, 1003}} {
			if tag, err := c.Exec(ctx, upsert, mode, kid[0], kid[1]); err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("%v: upsert %v: %v, %v", mode, kid, tag, err)
			}
		}
	}
	if tag, err := c.Exec(ctx, `MERGE INTO mg t USING (SELECT 4 AS k) s ON t.k = s.k AND t.id > 50 WHEN MATCHED THEN DELETE`); err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("delete when matched: %v, %v", tag, err)
	}
	for _, q := range []string{
		`MERGE INTO mg t USING (VALUES (1, 2), (3, 4)) s(k, id) ON t.k = s.k AND t.id = s.id WHEN MATCHED THEN UPDATE SET n = 9`,
		`MERGE INTO mg t USING (SELECT 5 AS k) s ON t.k = s.k AND t.id = 0 WHEN NOT MATCHED THEN INSERT VALUES (6, 0, 9)`,
		`MERGE INTO mg t USING (SELECT 5 AS k) s ON t.k = s.k WHEN MATCHED THEN UPDATE SET k = 6`,
		`MERGE INTO mg t USING mg s ON t.k = s.k AND t.id = s.id WHEN MATCHED THEN UPDATE SET n = 9`,
	} {
		if _, err := c.Exec(ctx, q); pgCode(err) != "0A000" {
			t.Fatalf("%s: want 0A000, got %v", q, err)
		}
	}
	var n3, ones, nines, k4, placed int
	if err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE k = 3 AND id IN (3, 1003)), sum(n) FILTER (WHERE k = 3 AND id IN (3, 1003)), count(*) FILTER (WHERE n = 9),
		count(*) FILTER (WHERE k = 4), count(*) FILTER (WHERE k = id % 20 OR id = 1003) FROM mg`).Scan(&n3, &ones, &nines, &k4, &placed); err != nil {
		t.Fatal(err)
	}
	// id 3 was bumped 2 times and 1003 made once then bumped 3 times.
	if n3 != 2 || ones != 2+4 || nines != 0 || k4 != 3 || placed != 99 {
		t.Fatalf("after the merges: %d rows of key 3 with n %d, %d rows refused ones wrote, %d rows of key 4, %d placed; want 2, 6, 0, 3, 99", n3, ones, nines, k4, placed)
	}
	var byKey int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM mg WHERE k = 3`).Scan(&byKey); err != nil || byKey != 6 {
		t.Fatalf("key 3 read by its key: %d rows, %v; want 6", byKey, err)
	}
}
