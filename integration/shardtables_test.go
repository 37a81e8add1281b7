package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestShardTablesWrittenOnlyThroughTree: through the proxy a shard's table
// can be read by name, but not written or changed: a row put there
// directly, whose key the shard may not own, would be found by no routed
// statement. Each write and change gets 42501 and the tree is as it was.
// An error of a shard's table names the tree's schema.
func TestShardTablesWrittenOnlyThroughTree(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE st (k int PRIMARY KEY, v int NOT NULL)`)
	mustExec(t, c, `INSERT INTO st SELECT g, g FROM generate_series(1, 100) g`)
	mustExec(t, c, `SELECT lattice_create_tree('st', 'k', shard_count => 2)`)
	var inShard int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM lattice_s0000.st`).Scan(&inShard); err != nil || inShard == 0 || inShard == 100 {
		t.Fatalf("shard 0 read by name: %d rows (%v)", inShard, err)
	}
	for _, sql := range []string{
		`INSERT INTO lattice_s0000.st VALUES (1000, 1)`,
		`UPDATE lattice_s0000.st SET k = k + 1000`,
		`DELETE FROM lattice_s0000.st`,
		`WITH d AS (DELETE FROM lattice_s0000.st RETURNING k) SELECT count(*) FROM d`,
		`TRUNCATE lattice_s0000.st`,
		`ALTER TABLE lattice_s0000.st ADD COLUMN w int`,
		`DROP TABLE lattice_s0000.st`,
		`DROP SCHEMA lattice_s0000 CASCADE`,
	} {
		if _, err := c.Exec(ctx, sql); pgCode(err) != "42501" {
			t.Errorf("%s: %v, want 42501", sql, err)
		}
	}
	// An error of a shard's table names the tree's schema, as on one
	// server, not the shard's.
	_, err := c.Exec(ctx, `INSERT INTO st VALUES (1, 1)`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" || pe.SchemaName != "public" || pe.TableName != "st" {
		t.Fatalf("a duplicate key through the tree: %#v, want 23505 on public.st", err)
	}
	var rows, sum int
	if err := c.QueryRow(ctx, `SELECT count(*), sum(v) FROM st`).Scan(&rows, &sum); err != nil || rows != 100 || sum != 5050 {
		t.Fatalf("the tree after the refusals: %d rows, sum %d (%v)", rows, sum, err)
	}
	var still int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM lattice_s0000.st`).Scan(&still); err != nil || still != inShard {
		t.Fatalf("shard 0 after the refusals: %d rows (%v), want %d", still, err, inShard)
	}
}
