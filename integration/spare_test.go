package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSpareConnections: a connection given back to the cluster serves the
// next Borrow (each move's snapshots, comparison and shadow setup and drop
// reuse backends instead of forking one each), as a new connection would:
// a statement pgx cached for one borrower does not fail the next after DDL
// changed its result, and a setting one changed is reset. One given back inside a transaction is closed, not
// lent. Borrow never waits for a connection, and at most eight are kept
// idle.
func TestSpareConnections(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := ctCluster(t, 1)
	admin, err := pgx.Connect(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	mustExec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	selectAll := func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, "SELECT * FROM spare_t WHERE k > $1", 0)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	mustExec(admin, "CREATE TABLE spare_t (k int PRIMARY KEY)")

	a, give, err := cl.Borrow(ctx, "n1", "lattice")
	if err != nil {
		t.Fatal(err)
	}
	first := a.PgConn().PID()
	if err := selectAll(a); err != nil { // pgx prepares and caches it
		t.Fatal(err)
	}
	give()
	mustExec(admin, "ALTER TABLE spare_t ADD COLUMN v int")
	b, give, err := cl.Borrow(ctx, "n1", "lattice")
	if err != nil {
		t.Fatal(err)
	}
	if pid := b.PgConn().PID(); pid != first {
		t.Fatalf("the connection given back was not lent again: backend %d, then %d", first, pid)
	}
	if err := selectAll(b); err != nil {
		t.Fatalf("a statement the last borrower left prepared: %v", err)
	}
	mustExec(b, "SET application_name = 'lattice-shadow x'")
	give()
	b, give, err = cl.Borrow(ctx, "n1", "lattice")
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := b.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if pid := b.PgConn().PID(); pid != first || name != "lattice-admin" {
		t.Fatalf("backend %d (first %d) lent with application_name %q, want the first with lattice-admin", pid, first, name)
	}

	mustExec(b, "BEGIN")
	give()
	c, give, err := cl.Borrow(ctx, "n1", "lattice")
	if err != nil {
		t.Fatal(err)
	}
	if c.PgConn().PID() == first {
		t.Fatal("a connection given back inside a transaction was lent again")
	}
	waitBackends(t, ctx, admin, []uint32{first}, 0)
	give()

	var pids []uint32
	var gives []func()
	for range 10 { // none given back meanwhile: each is another connection
		conn, give, err := cl.Borrow(ctx, "n1", "lattice")
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, conn.PgConn().PID())
		gives = append(gives, give)
	}
	seen := map[uint32]bool{}
	for _, p := range pids {
		seen[p] = true
	}
	if len(seen) != len(pids) {
		t.Fatalf("connections lent twice at once: backends %v", pids)
	}
	for _, give := range gives {
		give()
	}
	waitBackends(t, ctx, admin, pids, 8)
}

// waitBackends waits until exactly want of the backends pids are alive.
func waitBackends(t *testing.T, ctx context.Context, conn *pgx.Conn, pids []uint32, want int) {
	t.Helper()
	var alive int
	for range 100 {
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1)", pids).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		if alive == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%d of backends %v alive, want %d", alive, pids, want)
}

// TestMigrationBackends: a migration opens few backends of its own: its
// replication connection, with every other connection it needs (the shadow
// copy's source and target, snapshots, comparison, the copy's drop) a spare
// given back by an earlier one. Each new backend costs the node a fork, and
// each migration used to open nine.
func TestMigrationBackends(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--max-concurrent-migrations", "1")
	c := connect(t, p.DSN("lattice"))
	observedTree(t, c, 2000, 4)
	reshardAndWait(t, c, 5) // warms the spares and the pools up
	sessions := func() int64 {
		var n int64
		for i := range 2 {
			node := connect(t, testNodeDSN(t, i))
			var s int64
			if err := node.QueryRow(context.Background(), "SELECT sum(sessions) FROM pg_stat_database").Scan(&s); err != nil {
				t.Fatal(err)
			}
			node.Close(context.Background())
			n += s - 1 // not this one
		}
		return n
	}
	before := sessions()
	// The shadow copy's target connection, a spare, carries the run's
	// label, which a later run of the migration ends it by.
	labelled := make(chan bool, 1)
	ctx, stop := context.WithCancel(context.Background())
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1))}
	go func() {
		seen := false
		for ctx.Err() == nil && !seen {
			for _, node := range nodes {
				var here bool
				_ = node.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name LIKE 'lattice-shadow %')").Scan(&here)
				seen = seen || here
			}
			time.Sleep(5 * time.Millisecond)
		}
		labelled <- seen
	}()
	reshardAndWait(t, c, 9) // four splits
	stop()
	if !<-labelled {
		t.Error("no target connection labelled lattice-shadow <migration> during the reshard")
	}
	opened := sessions() - before
	t.Logf("4 migrations opened %d backends", opened)
	if opened > 4*4 {
		t.Fatalf("4 migrations opened %d backends, more than 4 each", opened)
	}
}
