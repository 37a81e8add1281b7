package integration

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestUpdateKeepsKey runs the UPDATEs that name the shard key in SET
// without changing it, as an ORM that sets every column sends them, in
// both protocols, and one that would change it, which is refused with its
// hint and changes nothing.
func TestUpdateKeepsKey(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	ctx := context.Background()
	mustExec(t, c, `CREATE TABLE ka (k int, id int, v text, PRIMARY KEY (k, id))`)
	mustExec(t, c, `INSERT INTO ka SELECT g % 20, g, 'v' FROM generate_series(1, 200) g`)
	mustExec(t, c, `SELECT lattice_create_tree('ka', 'k', shard_count => 4)`)

	// The simple protocol sends pgx's arguments as constants.
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		var n int
		if err := c.QueryRow(ctx, `WITH u AS (UPDATE ka SET k = $1, id = $2, v = $3 WHERE k = $1 AND id = $2 RETURNING k) SELECT count(*) FROM u`,
			mode, 7, 27, "orm").Scan(&n); err != nil || n != 1 {
			t.Fatalf("%v: SET k = $1 ... WHERE k = $1: %d rows, %v", mode, n, err)
		}
		tag, err := c.Exec(ctx, `UPDATE ka o SET k = o.k, v = 'all' WHERE o.id > $1`, mode, 190)
		if err != nil || tag.RowsAffected() != 10 {
			t.Fatalf("%v: SET k = o.k over every shard: %v rows, %v", mode, tag.RowsAffected(), err)
		}
	}
	// The last refused, with constants, has the shape of this one.
	if tag, err := c.Exec(ctx, `UPDATE ka SET k = 3, v = 'kept' WHERE k = 3`, pgx.QueryExecModeSimpleProtocol); err != nil || tag.RowsAffected() != 10 {
		t.Fatalf("SET k = 3 WHERE k = 3: %v rows, %v", tag.RowsAffected(), err)
	}
	for _, q := range []string{`UPDATE ka SET k = $2, v = 'moved' WHERE k = $1`, `UPDATE ka SET k = 4, v = 'moved' WHERE k = 3`} {
		_, err := c.Exec(ctx, q, 3, 4)
		if strings.Contains(q, "4,") {
			_, err = c.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Hint, "sets it to itself") {
			t.Fatalf("%s: want 0A000 with the hint, got %v", q, err)
		}
	}
	var orm, all, kept, moved, onShard int
	if err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE v = 'orm'), count(*) FILTER (WHERE v = 'all'), count(*) FILTER (WHERE v = 'kept'),
		count(*) FILTER (WHERE v = 'moved'), count(*) FILTER (WHERE k = id % 20) FROM ka`).Scan(&orm, &all, &kept, &moved, &onShard); err != nil {
		t.Fatal(err)
	}
	if orm != 1 || all != 10 || kept != 10 || moved != 0 || onShard != 200 {
		t.Fatalf("after the updates: %d orm, %d all, %d kept, %d moved rows, %d of 200 with their keys; want 1, 10, 10, 0, 200", orm, all, kept, moved, onShard)
	}
	// Upserts that set the key to the conflicting row's: one row, rows
	// split by shard, and rows the proxy pulls from a SELECT.
	for _, u := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO ka (k, id, v) VALUES ($1, $2, 'up1') ON CONFLICT (k, id) DO UPDATE SET k = excluded.k, id = excluded.id, v = excluded.v`, []any{5, 5}},
		{`INSERT INTO ka AS a (k, id, v) VALUES (1, 1, 'up2'), (2, 2, 'up2'), (3, 3, 'up2') ON CONFLICT (id, k) DO UPDATE SET k = a.k, v = excluded.v`, nil},
		{`INSERT INTO ka (k, id, v) SELECT g % 20, g, 'up3' FROM generate_series(100, 109) g ON CONFLICT (k, id) DO UPDATE SET k = excluded.k, v = excluded.v`, nil},
	} {
		if _, err := c.Exec(ctx, u.q, u.args...); err != nil {
			t.Fatalf("%s: %v", u.q, err)
		}
	}
	var ups int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM ka WHERE v LIKE 'up%' AND k = id % 20`).Scan(&ups); err != nil || ups != 14 {
		t.Fatalf("after the upserts: %d rows updated in place, %v; want 14", ups, err)
	}
	// Each row is read by its key, so each is on its key's shard.
	for k := range 20 {
		var rows int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM ka WHERE k = $1`, k).Scan(&rows); err != nil || rows != 10 {
			t.Fatalf("key %d: %d rows by its key, %v; want 10", k, rows, err)
		}
	}
}
