package integration

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestFreezeRolledBackGivesSlotsBack rolls back a freeze after its fence
// was armed, and checks that the source's ownership record owns the moving
// slots again: the arm takes them out of the record into a lattice_moving
// row, and the rollback's drop of the fence must put them back, or a
// recovery from the nodes alone (lattice recover-map) would find slots no
// shard owns. The record and the rows are read in one statement, so the
// check holds whatever attempt runs next; the runner waits a freeze budget
// before it, so the read falls between the rollback and the next arm.
//
// The final drain is held past the budget by a row lock on the target: an
// update of that row, made through the proxy on the source, cannot be
// applied there until the lock goes. The freeze is held back until the
// lock and the update are in place by the node-wide advisory lock its
// fence's preparation takes on the source, before the pause: a move of
// 100 rows otherwise flipped before the test took the row lock, and the
// update, routed to the target, waited for that lock for ever.
func TestFreezeRolledBackGivesSlotsBack(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Without verification: its write log's trigger, attached before the
	// arm, would wait for the held update as the drain does.
	p := startProxy(t, 2, "--reshard-tick", "200ms", "--freeze-budget", "1s", "--verify-moves=false")
	c := connect(t, p.DSN("lattice"))
	for _, q := range []string{
		"CREATE TABLE rb (id bigint PRIMARY KEY, v bigint NOT NULL)",
		"INSERT INTO rb SELECT g, 0 FROM generate_series(1, 400) g",
		"SELECT lattice_create_tree('rb', 'id', shard_count => 4)",
	} {
		mustExec(t, c, q)
	}
	// Shard 0 is on n1; the move takes it to n2 under the same index.
	n1, n2 := connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1))
	var key, rows int64
	if err := n1.QueryRow(ctx, "SELECT min(id), count(*) FROM lattice_s0000.rb").Scan(&key, &rows); err != nil {
		t.Fatal(err)
	}
	// The slots the source owns, with those handed over to a move (its
	// lattice_moving table comes with the move): the same set before,
	// during and after any freeze that did not flip.
	const ownerSQL = `coalesce((SELECT slots FROM lattice_s0000.lattice_owner WHERE tree = 'rb'), '{}')`
	const ownedSQL = ownerSQL + ` + coalesce((SELECT range_agg(r) FROM lattice_s0000.lattice_moving m, unnest(m.slots) r WHERE m.tree = 'rb'), '{}')`
	var owned string
	if err := n1.QueryRow(ctx, "SELECT ("+ownerSQL+")::text").Scan(&owned); err != nil {
		t.Fatal(err)
	}
	if owned == "{}" {
		t.Fatal("shard 0 owns no slots before the move")
	}

	hold, err := n1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(context.WithoutCancel(ctx))
	if _, err := hold.Exec(ctx, fencePrepareLock); err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, "SELECT lattice_move_shard('rb', 0, 'n2')")
	pollUntil(t, 60*time.Second, "the move's copy to commit on n2", func() (bool, error) {
		var made bool
		if err := n2.QueryRow(ctx, "SELECT to_regclass('lattice_s0000.rb') IS NOT NULL").Scan(&made); err != nil || !made {
			return false, err
		}
		var copied int64
		err := n2.QueryRow(ctx, "SELECT count(*) FROM lattice_s0000.rb").Scan(&copied)
		return copied == rows, err
	})
	lock, err := n2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.WithoutCancel(ctx))
	if _, err := lock.Exec(ctx, "SELECT FROM lattice_s0000.rb WHERE id = $1 FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, "UPDATE rb SET v = 7 WHERE id = $1", key)
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	pollUntil(t, 60*time.Second, "a freeze of the move to be rolled back", func() (bool, error) {
		return strings.Contains(p.Log(), "freeze rolled back"), nil
	})
	var after string
	if err := n1.QueryRow(ctx, "SELECT ("+ownedSQL+")::text").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != owned {
		t.Fatalf("after a freeze rolled back, shard 0 on n1 owns %s (its record and its moves' rows), want %s", after, owned)
	}

	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 60*time.Second, "the move to complete", func() (bool, error) {
		var ok bool
		err := c.QueryRow(ctx, "SELECT lattice_rebalance_complete('rb')").Scan(&ok)
		return ok, err
	})
	var v, n int64
	if err := c.QueryRow(ctx, "SELECT v FROM rb WHERE id = $1", key).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT count(*) FROM rb").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if v != 7 || n != 400 {
		t.Fatalf("after the move: row %d has v = %d, want 7; %d rows, want 400", key, v, n)
	}
}

// fencePrepareLock is the node-wide advisory lock (pgshard schemaLockClass,
// -1) that a fence's preparation takes on the source node before a
// freeze's pause: held, it keeps a migration out of its freeze.
const fencePrepareLock = "SELECT pg_advisory_xact_lock(1281455153, -1)"
