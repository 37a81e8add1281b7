package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestSnapshotAcrossReshard: a transaction that keeps its snapshots
// (REPEATABLE READ, SERIALIZABLE) and reads a tree after a reshard
// flipped and released since its first statement gets a serialization
// failure (40001), where it used to read moved rows where they are now,
// under a snapshot from before they got there: point reads of moved keys
// found nothing, scans found rows twice. A READ COMMITTED transaction
// reads every row once across the same reshard.
func TestSnapshotAcrossReshard(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	p := startProxy(t, 2)
	admin := makeRR(t, ctx, p)
	shards := 2
	for _, c := range []struct {
		name  string
		begin []string // the transaction's statements before the reshard
		fails bool
	}{
		{"repeatable read, first on the catalog node", []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT 1"}, true},
		{"repeatable read, first on the tree", []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT count(*) FROM rr"}, true},
		{"serializable by SET TRANSACTION", []string{"BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SELECT 1"}, true},
		{"repeatable read, begun in one query string", []string{"BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1"}, true},
		{"repeatable read by the session's default", []string{"SET default_transaction_isolation = 'repeatable read'", "BEGIN", "SELECT count(*) FROM rr"}, true},
		{"read committed", []string{"RESET default_transaction_isolation", "BEGIN", "SELECT count(*) FROM rr"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := connect(t, p.DSN("lattice"))
			defer conn.Close(ctx)
			for _, q := range c.begin {
				mustExec(t, conn, q)
			}
			before := shards
			shards = 6 - shards // 2 and 4 in turn
			if _, err := admin.Exec(ctx, fmt.Sprintf("SELECT lattice_reshard('rr', %d)", shards)); err != nil {
				t.Fatal(err)
			}
			waitFlip(t, ctx, admin, before)
			err := readEveryKey(ctx, conn)
			switch {
			case c.fails && pgCode(err) != "40001":
				t.Fatalf("reads after the reshard: %v, want 40001", err)
			case !c.fails && err != nil:
				t.Fatalf("reads after the reshard: %v", err)
			}
			mustExec(t, conn, "ROLLBACK")
			waitReshardComplete(t, ctx, admin, "rr", 2*time.Minute)
		})
	}
}

// makeRR makes tree rr of 2000 rows in two shards through p, and returns a
// pool of p that the test's end closes.
func makeRR(t *testing.T, ctx context.Context, p *proxyProc) *pgxpool.Pool {
	t.Helper()
	return proxyPool(t, ctx, p,
		"CREATE TABLE rr (k int PRIMARY KEY, v int NOT NULL)",
		"INSERT INTO rr SELECT g, g * 10 FROM generate_series(1, 2000) g",
		"SELECT lattice_create_tree('rr', 'k', shard_count => 2)")
}

// waitFlip waits until a migration of rr flipped: the shards that own
// slots are no longer the owning ones before. Waiting for every flip could
// wait forever: a release, and a migration that waits for it, may wait for
// the test's open transaction, since dropping a source's fence waits for
// the locks its reads took.
func waitFlip(t *testing.T, ctx context.Context, pool *pgxpool.Pool, owning int) {
	t.Helper()
	pollUntil(t, 2*time.Minute, "a migration of rr to flip", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM lattice_shards('rr') WHERE slot_count > 0").Scan(&n)
		return n != owning, err
	})
}

// readEveryKey reads rr's keys one by one in a few statements and then
// all at once, and fails on a row missing or doubled.
func readEveryKey(ctx context.Context, c *pgx.Conn) error {
	for k := 1; k <= 2000; k += 97 {
		var v int
		if err := c.QueryRow(ctx, "SELECT v FROM rr WHERE k = $1", k).Scan(&v); err != nil {
			return fmt.Errorf("key %d: %w", k, err)
		}
	}
	var n, sum int64
	if err := c.QueryRow(ctx, "SELECT count(*), sum(v) FROM rr").Scan(&n, &sum); err != nil {
		return err
	}
	if n != 2000 || sum != 20010000 {
		return fmt.Errorf("%d rows summing to %d, want 2000 summing to 20010000", n, sum)
	}
	return nil
}

// TestImportedSnapshotAcrossReshard: a transaction that imported another's
// snapshot (pg_dump --jobs, on a deployment of one node) reads a tree under
// the exporter's routing: it reads every row while the tree stays put, and
// gets 40001 once a reshard flipped since the export. A snapshot no open
// transaction of the proxy exported is refused for trees.
func TestImportedSnapshotAcrossReshard(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 1)
	admin := makeRR(t, ctx, p)
	leader := connect(t, p.DSN("lattice"))
	mustExec(t, leader, "BEGIN ISOLATION LEVEL REPEATABLE READ")
	var id string
	if err := leader.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	worker := func() *pgx.Conn {
		c := connect(t, p.DSN("lattice"))
		mustExec(t, c, "BEGIN ISOLATION LEVEL REPEATABLE READ")
		mustExec(t, c, "SET TRANSACTION SNAPSHOT '"+id+"'")
		return c
	}
	w := worker()
	if err := readEveryKey(ctx, w); err != nil {
		t.Fatalf("an imported snapshot, no reshard: %v", err)
	}
	mustExec(t, w, "ROLLBACK")

	if _, err := admin.Exec(ctx, "SELECT lattice_reshard('rr', 4)"); err != nil {
		t.Fatal(err)
	}
	waitFlip(t, ctx, admin, 2)
	w = worker()
	if err := readEveryKey(ctx, w); pgCode(err) != "40001" {
		t.Fatalf("an imported snapshot after the flip: %v, want 40001", err)
	}
	mustExec(t, w, "ROLLBACK")
	mustExec(t, leader, "ROLLBACK")
	waitReshardComplete(t, ctx, admin, "rr", 2*time.Minute)

	// Exported on the node, past the proxy.
	node := connect(t, testNodeDSN(t, 0))
	mustExec(t, node, "BEGIN ISOLATION LEVEL REPEATABLE READ")
	if err := node.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	w = worker()
	if err := readEveryKey(ctx, w); pgCode(err) != "0A000" {
		t.Fatalf("a snapshot exported past the proxy: %v, want 0A000", err)
	}
}
