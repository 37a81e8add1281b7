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
// changed its result. One given back inside a transaction is closed, not
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

