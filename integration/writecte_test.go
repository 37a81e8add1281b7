package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestWriteCTEMovesRows moves a key's rows to a colocated archive tree
// with a deleting CTE, in both protocols, and checks that the forms whose
// writes would not all land on the statement's one shard are refused and
// change nothing.
func TestWriteCTEMovesRows(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	ctx := context.Background()
	mustExec(t, c, `CREATE TABLE wo (cid int, oid int, amt int, PRIMARY KEY (cid, oid))`)
	mustExec(t, c, `INSERT INTO wo SELECT g % 40, g, g % 7 FROM generate_series(1, 400) g`)
	mustExec(t, c, `SELECT lattice_create_tree('wo', 'cid', shard_count => 8)`)
	mustExec(t, c, `CREATE TABLE wa (cid int, oid int, amt int, PRIMARY KEY (cid, oid))`)
	mustExec(t, c, `SELECT lattice_create_tree('wa', 'cid', colocate_with => 'wo')`)

	const move = `WITH d AS (DELETE FROM wo WHERE cid = $1 AND amt < 3 RETURNING *) INSERT INTO wa (cid, oid, amt) SELECT cid, oid, amt FROM d RETURNING oid`
	moved := 0
	for i, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		rows, err := c.Query(ctx, move, mode, 3+i)
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		if rows.Close(); rows.Err() != nil || n == 0 {
			t.Fatalf("%v: %d rows moved, %v", mode, n, rows.Err())
		}
		moved += n
	}
	var sum int
	if err := c.QueryRow(ctx, `WITH u AS (UPDATE wa SET amt = amt + 10 WHERE cid = $1 RETURNING cid, amt) SELECT sum(u.amt) FROM u JOIN wo USING (cid)`, 3).Scan(&sum); err != nil || sum == 0 {
		t.Fatalf("an updating CTE joined by USING: sum %d, %v", sum, err)
	}
	for _, q := range []string{
		// Not fixed in the CTE, or fixed there to another key than the
		// statement's: its writes would run on the wrong shards.
		`WITH d AS (DELETE FROM wo WHERE amt = 6 RETURNING *) INSERT INTO wa (cid, oid, amt) SELECT cid, oid, amt FROM d`,
		`WITH d AS (DELETE FROM wo RETURNING *) INSERT INTO wa (cid, oid, amt) SELECT cid, oid, amt FROM d WHERE cid = 5`,
		`WITH d AS (DELETE FROM wo WHERE cid = 5 RETURNING *) SELECT count(*) FROM d WHERE cid = 6`,
	} {
		if _, err := c.Exec(ctx, q); pgCode(err) != "0A000" {
			t.Fatalf("%s: want 0A000, got %v", q, err)
		}
	}
	var left, archived, wrong int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM wo`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE cid NOT IN (3, 4) OR amt % 10 >= 3) FROM wa`).Scan(&archived, &wrong); err != nil {
		t.Fatal(err)
	}
	if left+archived != 400 || archived != moved || wrong != 0 {
		t.Fatalf("%d rows left, %d archived (%d of them wrongly), %d moved; want 400 in all, all moved archived", left, archived, wrong, moved)
	}
	// Each archived row is read by its key, so each is on its key's shard.
	for _, k := range []int{3, 4} {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM wa WHERE cid = $1`, k).Scan(&n); err != nil || n == 0 {
			t.Fatalf("key %d: %d archived rows by its key, %v", k, n, err)
		}
	}
}
