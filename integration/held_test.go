package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
)

// TestFreezePutOffWhileSourceHeld leaves a session through the proxy idle
// in a transaction that wrote a row of a shard, then reshards. Arming that
// shard's fence would wait for the transaction inside the write pause, so
// a freeze would hold the moving slots' writes for its whole budget and
// roll back, over and over. The migrator puts the freeze off instead:
// no freeze is rolled back, lattice_reshard_status names the session, and
// once it commits the reshard completes with its write in place.
func TestFreezePutOffWhileSourceHeld(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, c := heldTree(t, ctx, "held")

	// A read over the whole tree holds both freezes back (it was planned
	// before their marks) without an xid, so the replication slots are
	// made meanwhile; a transaction with an xid running then would hold
	// the slots' creation instead.
	reader := connect(t, p.DSN("lattice"))
	defer reader.Close(ctx)
	rctx, stopRead := context.WithCancel(ctx)
	defer stopRead()
	read := make(chan error, 1)
	go func() {
		_, err := reader.Exec(rctx, `SELECT k, pg_sleep(60) FROM held LIMIT 1`)
		read <- err
	}()
	waitNodeQueries(t, ctx, 2, "%pg_sleep(60)%", 2)
	mustExec(t, c, `SELECT lattice_reshard('held', 4)`)
	p.WaitLog(t, ctx, "phase=drain", 2)

	// Keys 1 to 8 cover both shards: the transaction holds both sources.
	holder := holdRows(t, ctx, p, "held")
	// Older than the freeze budget (2 s) before a freeze looks.
	time.Sleep(2500 * time.Millisecond)
	stopRead()
	<-read

	lastErr := waitLastError(t, ctx, p, c, "held", "idle in transaction")
	t.Logf("last_error: %s", lastErr)
	for _, want := range []string{"freeze put off", "idle_in_transaction_session_timeout"} {
		if !strings.Contains(lastErr, want) {
			t.Errorf("last_error %q does not say %q", lastErr, want)
		}
	}
	mustExec(t, holder, `COMMIT`)
	waitComplete(t, ctx, p, c, "held")
	if strings.Contains(p.Log(), "freeze rolled back") {
		t.Errorf("a freeze was tried, and rolled back, while the transaction held the source:\n%s", p.Log())
	}
	var rows, v int
	if err := c.QueryRow(ctx, `SELECT count(*), sum(v) FROM held`).Scan(&rows, &v); err != nil || rows != 1000 || v != 8 {
		t.Fatalf("after the reshard: %d rows, sum %d (%v); want 1000 rows, sum 8", rows, v, err)
	}
	noLastError(t, ctx, c, "held")
}

// TestShadowCopyWaitNamed leaves a session idle in a transaction that wrote
// to both shards, then reshards. Creating the migrations' replication
// slots waits for that transaction to end, so the copies cannot begin:
// lattice_reshard_status names the session as what they wait for, and
// once it commits the reshard completes with its writes in place.
func TestShadowCopyWaitNamed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, c := heldTree(t, ctx, "slotheld")
	holder := holdRows(t, ctx, p, "slotheld")
	mustExec(t, c, `SELECT lattice_reshard('slotheld', 4)`)
	lastErr := waitLastError(t, ctx, p, c, "slotheld", "idle in transaction")
	t.Logf("last_error: %s", lastErr)
	for _, want := range []string{"shadow copy waits", "replication slot", "idle_in_transaction_session_timeout"} {
		if !strings.Contains(lastErr, want) {
			t.Errorf("last_error %q does not say %q", lastErr, want)
		}
	}
	mustExec(t, holder, `COMMIT`)
	waitComplete(t, ctx, p, c, "slotheld")
	var rows, v int
	if err := c.QueryRow(ctx, `SELECT count(*), sum(v) FROM slotheld`).Scan(&rows, &v); err != nil || rows != 1000 || v != 8 {
		t.Fatalf("after the reshard: %d rows, sum %d (%v); want 1000 rows, sum 8", rows, v, err)
	}
	noLastError(t, ctx, c, "slotheld")
}

// TestFreezeIgnoresCatalogStatements keeps two statements of the catalog
// node running through the proxy, in the simple and the extended protocol,
// and reshards. Neither reads a tree, so no freeze waits for them: the
// reshard completes while both still run. (Each held the whole shard map
// while it ran, and a freeze waited for every statement planned before it.)
func TestFreezeIgnoresCatalogStatements(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, c := heldTree(t, ctx, "catwait")
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 2)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		sleeper := connect(t, p.DSN("lattice"))
		defer sleeper.Close(ctx)
		go func() {
			_, err := sleeper.Exec(sctx, `SELECT pg_sleep($1)`, mode, 600)
			ended <- err
		}()
	}
	waitNodeQueries(t, ctx, 1, "%pg_sleep(%", 2)
	mustExec(t, c, `SELECT lattice_reshard('catwait', 4)`)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	waitComplete(t, wctx, p, c, "catwait")
	select {
	case err := <-ended:
		t.Fatalf("a sleeper ended before the reshard completed: %v", err)
	default:
	}
	stop()
	var rows int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM catwait`).Scan(&rows); err != nil || rows != 1000 {
		t.Fatalf("after the reshard: %d rows (%v), want 1000", rows, err)
	}
}

// heldTree starts a proxy over 2 nodes and makes tree name of 1000 rows
// (k 1 to 1000, v 0) in 2 shards, one on each node.
func heldTree(t *testing.T, ctx context.Context, name string) (*proxyProc, *pgx.Conn) {
	t.Helper()
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	t.Cleanup(func() { c.Close(context.Background()) })
	mustExec(t, c, `CREATE TABLE `+name+` (k int PRIMARY KEY, v int NOT NULL)`)
	mustExec(t, c, `INSERT INTO `+name+` SELECT g, 0 FROM generate_series(1, 1000) g`)
	mustExec(t, c, `SELECT lattice_create_tree($1, 'k', shard_count => 2)`, name)
	return p, c
}

// holdRows opens a session through p that adds 1 to v of keys 1 to 8 of
// tree, which lie on both shards, and leaves its transaction open.
func holdRows(t *testing.T, ctx context.Context, p *proxyProc, tree string) *pgx.Conn {
	t.Helper()
	holder := connect(t, p.DSN("lattice"))
	t.Cleanup(func() { holder.Close(context.Background()) })
	mustExec(t, holder, `BEGIN`)
	mustExec(t, holder, `UPDATE `+tree+` SET v = v + 1 WHERE k BETWEEN 1 AND 8`)
	return holder
}

// waitLastError waits until lattice_reshard_status(tree) reports a
// last_error that holds substr, and returns it.
func waitLastError(t *testing.T, ctx context.Context, p *proxyProc, c *pgx.Conn, tree, substr string) string {
	t.Helper()
	for {
		var s *string
		if err := c.QueryRow(ctx, `SELECT last_error FROM lattice_reshard_status($1)`, tree).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s != nil && strings.Contains(*s, substr) {
			return *s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("lattice_reshard_status(%s) never said %q; last error %v\n%s", tree, substr, deref(s), p.Log())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitComplete waits through c until the reshard of tree completes.
func waitComplete(t *testing.T, ctx context.Context, p *proxyProc, c *pgx.Conn, tree string) {
	t.Helper()
	for done := false; !done; {
		if err := c.QueryRow(ctx, `SELECT lattice_reshard_complete($1)`, tree).Scan(&done); err != nil {
			t.Fatalf("the reshard of %s: %v\n%s", tree, err, p.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noLastError checks that lattice_reshard_status(tree) reports no error.
func noLastError(t *testing.T, ctx context.Context, c *pgx.Conn, tree string) {
	t.Helper()
	var s *string
	if err := c.QueryRow(ctx, `SELECT last_error FROM lattice_reshard_status($1)`, tree).Scan(&s); err != nil || s != nil {
		t.Fatalf("last_error of %s after the reshard: %v (%v), want NULL", tree, deref(s), err)
	}
}

// waitNodeQueries waits until n statements like pattern run on the first
// nodes nodes.
func waitNodeQueries(t *testing.T, ctx context.Context, nodes int, pattern string, n int) {
	t.Helper()
	for {
		seen := 0
		for i := range nodes {
			nc := connect(t, testNodeDSN(t, i))
			var k int
			err := nc.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid()`, pattern).Scan(&k)
			nc.Close(ctx)
			if err != nil {
				t.Fatal(err)
			}
			seen += k
		}
		if seen >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d statements like %q run on the nodes, want %d", seen, pattern, n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestFenceBlockers reads on a real node what a fence's arm and its removal
// would wait for: a writer's open transaction holds both back, a reader's
// only the removal, and a prepared transaction is named by its gid.
func TestFenceBlockers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, table, conn := fencedShard(t)
	fence := []pgshard.SlotFence{fencedSlots()}
	pidOf := func(c *pgx.Conn) int32 {
		var pid int32
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	reader, writer := connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 0))
	defer reader.Close(ctx)
	defer writer.Close(ctx)
	mustExec(t, reader, "BEGIN")
	mustExec(t, reader, "SELECT count(*) FROM "+table)
	mustExec(t, writer, "BEGIN")
	mustExec(t, writer, "INSERT INTO "+table+" VALUES ('w', 1)")
	// A prepared transaction holds its locks with no session.
	mustExec(t, conn, "BEGIN")
	mustExec(t, conn, "INSERT INTO "+table+" VALUES ('p', 1)")
	mustExec(t, conn, "PREPARE TRANSACTION 'lattice_test_blocker'")
	defer conn.Exec(context.Background(), "ROLLBACK PREPARED 'lattice_test_blocker'")

	got := func(bs []pgshard.Blocker, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		var named []string
		for _, b := range bs {
			named = append(named, b.String())
		}
		return strings.Join(named, "; ")
	}
	readerPid, writerPid := fmt.Sprintf("pid %d,", pidOf(reader)), fmt.Sprintf("pid %d,", pidOf(writer))
	arm := got(cl.ArmBlockers(ctx, "n1", fence, 0))
	if !strings.Contains(arm, writerPid) || strings.Contains(arm, readerPid) || !strings.Contains(arm, `prepared transaction "lattice_test_blocker"`) {
		t.Errorf("the arm's blockers are %q; want the writer (%s) and the prepared transaction, not the reader (%s)", arm, writerPid, readerPid)
	}
	drop := got(cl.DropBlockers(ctx, "n1", fence, 0))
	if !strings.Contains(drop, writerPid) || !strings.Contains(drop, readerPid) || !strings.Contains(drop, "idle in transaction") {
		t.Errorf("the removal's blockers are %q; want the writer (%s) and the reader (%s)", drop, writerPid, readerPid)
	}
	if none := got(cl.ArmBlockers(ctx, "n1", fence, time.Hour)); none != "" {
		t.Errorf("blockers older than an hour: %q", none)
	}
}

// TestFenceArmLockWaitsSaid: an arm that spends its budget waiting for the
// table's writers says so, rather than only that its context ended.
func TestFenceArmLockWaitsSaid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, table, _ := fencedShard(t)
	fence := fencedSlots()
	if err := cl.PrepareSlotFence(ctx, "n1", fence); err != nil {
		t.Fatal(err)
	}
	writer := connect(t, testNodeDSN(t, 0))
	defer writer.Close(ctx)
	mustExec(t, writer, "BEGIN")
	mustExec(t, writer, "INSERT INTO "+table+" VALUES ('w', 1)")
	actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer acancel()
	_, err := cl.ArmSlotFence(actx, "n1", fence)
	if err == nil || !strings.Contains(err.Error(), "transactions writing to the table held its lock through") {
		t.Fatalf("the arm's error: %v; want it to say the table's writers held the lock", err)
	}
	mustExec(t, writer, "ROLLBACK")
}
