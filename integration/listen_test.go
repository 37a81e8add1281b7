package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// waitNote waits for the next notification on c, bounded so that a lost
// notification fails the test instead of hanging it.
func waitNote(t *testing.T, c *pgx.Conn) *pgconn.Notification {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n, err := c.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("waiting for a notification: %v", err)
	}
	return n
}

func wantNote(t *testing.T, n *pgconn.Notification, channel, payload string) {
	t.Helper()
	if n.Channel != channel || n.Payload != payload {
		t.Fatalf("notification %s/%q, want %s/%q", n.Channel, n.Payload, channel, payload)
	}
}

// TestListenNotify: LISTEN through the proxy holds a catalog-node backend for
// the session; NOTIFY and pg_notify from another client, in and out of
// transactions, reach it while it is idle and during its own queries.
func TestListenNotify(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--pool-size", "4")
	listener := connect(t, p.DSN("lattice"))
	notifier := connect(t, p.DSN("lattice"))
	ctx := context.Background()

	mustExec(t, notifier, `CREATE TABLE items (id bigint PRIMARY KEY, v text)`)
	mustExec(t, notifier, `SELECT lattice_create_tree('items', 'id', shard_count => 16)`)

	mustExec(t, listener, `LISTEN jobs`)

	// Idle listener: WaitForNotification only reads the socket.
	mustExec(t, notifier, `NOTIFY jobs, 'one'`)
	wantNote(t, waitNote(t, listener), "jobs", "one")
	mustExec(t, notifier, `SELECT pg_notify('jobs', 'two')`)
	wantNote(t, waitNote(t, listener), "jobs", "two")

	// pg_notify in a transaction held by another node than the catalog
	// node would be lost there: it is refused. Keys spread over the nodes,
	// so some of them are elsewhere.
	refused := 0
	for key := 1; key <= 16; key++ {
		tx, err := notifier.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'x')`, key); err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify('nobody', 'x')`)
		switch code := pgCode(err); code {
		case "":
		case "0A000":
			refused++
		default:
			t.Fatalf("pg_notify in a transaction on key %d: %v", key, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if refused == 0 {
		t.Fatalf("no key of 16 put the transaction on another node than the catalog node")
	}

	tx, err := notifier.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `NOTIFY jobs, 'in tx'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify('jobs', 'in tx 2')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantNote(t, waitNote(t, listener), "jobs", "in tx")
	wantNote(t, waitNote(t, listener), "jobs", "in tx 2")

	// A rolled-back NOTIFY is never delivered: the next one is.
	tx, err = notifier.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `NOTIFY jobs, 'rolled back'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, notifier, `NOTIFY jobs, 'after rollback'`)
	wantNote(t, waitNote(t, listener), "jobs", "after rollback")

	// Notifications arrive with the listener's own queries too, on both
	// protocols and from a fan-out.
	mustExec(t, notifier, `NOTIFY jobs, 'during query'`)
	if _, err := queryStrings(t, listener, `SELECT id FROM items`); err != nil {
		t.Fatal(err)
	}
	wantNote(t, waitNote(t, listener), "jobs", "during query")

	// UNLISTEN of one channel: PostgreSQL delivers in commit order, so if
	// "jobs" were still listened to, its notification would come first.
	mustExec(t, listener, `LISTEN other`)
	mustExec(t, listener, `UNLISTEN jobs`)
	mustExec(t, notifier, `NOTIFY jobs, 'unheard'`)
	mustExec(t, notifier, `NOTIFY other, 'heard'`)
	wantNote(t, waitNote(t, listener), "other", "heard")

	// The extended protocol runs LISTEN too.
	if _, err := listener.PgConn().ExecParams(ctx, `LISTEN "Mixed"`, nil, nil, nil, nil).Close(); err != nil {
		t.Fatalf("LISTEN over the extended protocol: %v", err)
	}
	mustExec(t, notifier, `NOTIFY "Mixed", 'ext'`)
	wantNote(t, waitNote(t, listener), "Mixed", "ext")

	// A notification to oneself arrives before the statement's ReadyForQuery.
	mustExec(t, listener, `NOTIFY other, 'self'`)
	wantNote(t, waitNote(t, listener), "other", "self")

	// LISTEN inside a transaction block is refused, not silently detached.
	tx, err = listener.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `LISTEN later`)
	if code := pgCode(err); code != "0A000" {
		t.Fatalf("LISTEN in a transaction: %v (SQLSTATE %s), want 0A000", err, code)
	}
	_ = tx.Rollback(ctx)
}

// TestListenReleasesBackend: the backend a listener holds is bounded
// (--max-listeners), given back by UNLISTEN * and DISCARD ALL, and released
// when the client disconnects.
func TestListenReleasesBackend(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--pool-size", "4", "--max-listeners", "1")
	a := connect(t, p.DSN("lattice"))
	b := connect(t, p.DSN("lattice"))

	mustExec(t, a, `LISTEN ch`)
	heldBackends(t, p, "1")
	_, err := b.Exec(context.Background(), `LISTEN ch`)
	if code := pgCode(err); code != "53300" {
		t.Fatalf("second listener over --max-listeners 1: %v (SQLSTATE %s), want 53300", err, code)
	}

	mustExec(t, a, `UNLISTEN *`)
	heldBackends(t, p, "0")
	mustExec(t, b, `LISTEN ch`) // the held backend was given back
	mustExec(t, a, `NOTIFY ch, 'x'`)
	wantNote(t, waitNote(t, b), "ch", "x")

	mustExec(t, b, `DISCARD ALL`)
	mustExec(t, a, `LISTEN ch`)
	mustExec(t, b, `NOTIFY ch, 'y'`)
	wantNote(t, waitNote(t, a), "ch", "y")

	// Disconnecting a listener releases its backend; the proxy notices the
	// closed socket asynchronously, so c retries until it may listen.
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := connect(t, p.DSN("lattice"))
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := c.Exec(context.Background(), `LISTEN ch`)
		if err == nil {
			break
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" || time.Now().After(deadline) {
			t.Fatalf("LISTEN after the listener disconnected: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustExec(t, b, `NOTIFY ch, 'z'`)
	wantNote(t, waitNote(t, c), "ch", "z")
}

// heldBackends checks the proxy's count of backends held by listeners on the
// catalog node n1.
func heldBackends(t *testing.T, p *proxyProc, want string) {
	t.Helper()
	resp, err := http.Get("http://" + p.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	line := `lattice_pool_backends_held{node="n1",tenant="lattice"} ` + want + "\n"
	if !strings.Contains(string(body), line) {
		t.Fatalf("/metrics has no %q", line)
	}
}

// TestListenBackendLost: when the backend that holds a session's LISTENs
// dies, the session ends with FATAL 08006, idle or not, as the client's own
// PostgreSQL connection would have: a client that went on would wait for
// notifications that never come. A new session listens again.
func TestListenBackendLost(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "4")
	ctx := context.Background()
	direct := connect(t, testNodeDSN(t, 0))
	terminateListener := func() {
		t.Helper()
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query ILIKE 'LISTEN %'`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("terminating the listen backend: %d %v", n, err)
		}
	}
	wantEnded := func(err error, c *pgx.Conn) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "08006" || pe.SeverityUnlocalized != "FATAL" || !c.IsClosed() {
			t.Fatalf("after the listen backend died: %v (closed %v), want FATAL 08006 and the end of the connection", err, c.IsClosed())
		}
	}

	// Idle: the client hears of it while it waits for a notification.
	idle := connect(t, p.DSN("lattice"))
	mustExec(t, idle, `LISTEN lost`)
	terminateListener()
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_, err := idle.WaitForNotification(wctx)
	cancel()
	wantEnded(err, idle)

	// Busy: a session that reads no notifications runs statements; the
	// one after the loss is its last.
	busy := connect(t, p.DSN("lattice"))
	mustExec(t, busy, `LISTEN lost`)
	tx, err := busy.Begin(ctx) // not idle: the proxy's reader does not write to it
	if err != nil {
		t.Fatal(err)
	}
	terminateListener()
	time.Sleep(100 * time.Millisecond)
	if err := tx.Commit(ctx); err != nil {
		wantEnded(err, busy)
	} else {
		_, err = busy.Exec(ctx, `SELECT 1`)
		wantEnded(err, busy)
	}

	again := connect(t, p.DSN("lattice"))
	mustExec(t, again, `LISTEN lost`)
	mustExec(t, connect(t, p.DSN("lattice")), `NOTIFY lost, 'back'`)
	wantNote(t, waitNote(t, again), "lost", "back")
}

// TestListenInQueryString: LISTEN beside other statements in one simple
// query string runs as PostgreSQL runs it, in one implicit transaction: a
// NOTIFY in the same string reaches the session itself, and an error in
// the string undoes the LISTEN. A string that also needs a tree or session
// state is refused (lib/pq's TestConnectorWithNotificationHandler_Simple
// sends the first form).
func TestListenInQueryString(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "4")
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	other := connect(t, p.DSN("lattice"))
	mustExec(t, other, `CREATE TABLE things (id bigint PRIMARY KEY)`)
	mustExec(t, other, `SELECT lattice_create_tree('things', 'id', shard_count => 4)`)
	simple := func(sql string) error {
		_, err := c.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
		return err
	}

	if err := simple(`LISTEN self; NOTIFY self, 'one'`); err != nil {
		t.Fatal(err)
	}
	wantNote(t, waitNote(t, c), "self", "one")
	mustExec(t, other, `NOTIFY self, 'two'`)
	wantNote(t, waitNote(t, c), "self", "two")

	if err := simple(`LISTEN undone; SELECT 1/0`); pgCode(err) != "22012" {
		t.Fatalf("LISTEN then an error: %v, want 22012", err)
	}
	mustExec(t, other, `NOTIFY undone, 'lost'`)
	mustExec(t, other, `NOTIFY self, 'three'`)
	wantNote(t, waitNote(t, c), "self", "three") // nothing on undone came first

	if err := simple(`LISTEN t; INSERT INTO things VALUES (1)`); pgCode(err) != "0A000" {
		t.Fatalf("LISTEN beside a statement on a tree: %v, want 0A000", err)
	}
	if err := simple(`LISTEN t; UNLISTEN *`); pgCode(err) != "0A000" {
		t.Fatalf("LISTEN beside UNLISTEN *: %v, want 0A000", err)
	}
}
