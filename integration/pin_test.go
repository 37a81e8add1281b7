package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// metricSum adds up the series of a metric whose labels include match.
func metricSum(t *testing.T, p *proxyProc, name string, match map[string]string) float64 {
	t.Helper()
	fam := scrape(t, p)[name]
	if fam == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	sum, _ := familySum(fam, match)
	return sum
}

func wantPinned(t *testing.T, p *proxyProc, want float64) {
	t.Helper()
	if got := metricSum(t, p, "lattice_proxy_pinned_sessions", nil); got != want {
		t.Fatalf("lattice_proxy_pinned_sessions = %v, want %v", got, want)
	}
}

func oneString(t *testing.T, c *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var v *string
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if v == nil {
		return "<null>"
	}
	return *v
}

// churn runs clients that reuse the pool's backends while a test works:
// each, in every round, must not see the temp table foo or the prepared
// statement q of the pinned session, and takes its own ON COMMIT DROP temp
// table foo inside a transaction, which fails with 42P07 on a backend where
// another session's foo still exists. It returns a function that stops
// them and reports the first failure.
func churn(t *testing.T, p *proxyProc, clients int) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		c := connect(t, p.DSN("lattice"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ctx.Err() == nil; round++ {
				var reg *string
				if err := c.QueryRow(ctx, `SELECT to_regclass('pg_temp.foo')::text`).Scan(&reg); err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("churn round %d: %w", round, err)
					}
					return
				}
				if reg != nil {
					errs <- fmt.Errorf("churn round %d: another session's temp table is visible: %s", round, *reg)
					return
				}
				var n int
				if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name = 'q'`).Scan(&n); err != nil || n != 0 {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("churn round %d: prepared statement q of another session: %d %v", round, n, err)
					}
					return
				}
				tx, err := c.Begin(ctx)
				if err == nil {
					_, err = tx.Exec(ctx, `CREATE TEMP TABLE foo (x int) ON COMMIT DROP`)
					if err == nil {
						err = tx.Commit(ctx)
					} else {
						_ = tx.Rollback(context.Background())
					}
				}
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("churn round %d: own ON COMMIT DROP temp table: %w", round, err)
					}
					return
				}
			}
		}()
	}
	var once sync.Once
	halt := func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			close(errs)
		})
	}
	// Registered after the connections: on a failed test the clients stop
	// before their connections close.
	t.Cleanup(halt)
	return func() {
		t.Helper()
		halt()
		for err := range errs {
			t.Fatal(err)
		}
	}
}

// TestPinTempTable: a temp table lives across many statements of its
// session, in both protocols and inside and outside transactions, while
// other clients churn a small pool; they never see it nor collide with
// it. Statements on a tree still run on the shards. DISCARD TEMP ends the
// pin, and the backend goes back clean.
func TestPinTempTable(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "3")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	mustExec(t, a, `CREATE TABLE pt (k int PRIMARY KEY, v int)`)
	mustExec(t, a, `SELECT lattice_create_tree('pt', 'k', shard_count => 4)`)

	wantPinned(t, p, 0)
	mustExec(t, a, `CREATE TEMP TABLE foo (v int)`)
	wantPinned(t, p, 1)
	if got := metricSum(t, p, "lattice_proxy_pins_total", map[string]string{"reason": "temp_table"}); got != 1 {
		t.Fatalf("lattice_proxy_pins_total{reason=temp_table} = %v, want 1", got)
	}
	pid := oneString(t, a, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol)

	stop := churn(t, p, 3)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec}
	for i := 1; i <= 60; i++ {
		mode := modes[i%len(modes)]
		switch i % 4 {
		case 0:
			tx, err := a.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO foo VALUES ($1)`, mode, i); err != nil {
				t.Fatalf("statement %d in a transaction: %v", i, err)
			}
			// The same transaction writes the tree: the catalog node, where
			// the temp table is, commits in one phase (PostgreSQL cannot
			// PREPARE a transaction that used temp objects).
			if _, err := tx.Exec(ctx, `INSERT INTO pt VALUES ($1, $1)`, mode, i); err != nil {
				t.Fatalf("statement %d on the tree in a transaction: %v", i, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		default:
			if _, err := a.Exec(ctx, `INSERT INTO foo VALUES ($1)`, mode, i); err != nil {
				t.Fatalf("statement %d: %v", i, err)
			}
			if _, err := a.Exec(ctx, `INSERT INTO pt VALUES ($1, $1)`, mode, i); err != nil {
				t.Fatalf("statement %d on the tree: %v", i, err)
			}
		}
		var n int
		if err := a.QueryRow(ctx, `SELECT count(*) FROM foo`, mode).Scan(&n); err != nil || n != i {
			t.Fatalf("after %d inserts the temp table has %d rows (%v)", i, n, err)
		}
	}
	stop()
	if got := oneString(t, a, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol); got != pid {
		t.Fatalf("the pinned session moved from backend %s to %s", pid, got)
	}
	var n int
	if err := a.QueryRow(ctx, `SELECT count(*) FROM pt`).Scan(&n); err != nil || n != 60 {
		t.Fatalf("tree rows: %d %v, want 60", n, err)
	}

	mustExec(t, a, `DISCARD TEMP`)
	wantPinned(t, p, 0)
	if got := oneString(t, a, `SELECT to_regclass('pg_temp.foo')::text`); got != "<null>" {
		t.Fatalf("after DISCARD TEMP foo is %s", got)
	}
}

// TestPinAdvisoryLock: a session advisory lock stays held across
// statements (another session cannot take it, however the pool turns)
// until it is released; pg_advisory_unlock_all ends the pin.
func TestPinAdvisoryLock(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "2")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	b := connect(t, p.DSN("lattice"))
	c := connect(t, p.DSN("lattice"))

	mustExec(t, a, `SELECT pg_advisory_lock(4242)`)
	wantPinned(t, p, 1)
	for i := 0; i < 30; i++ {
		for _, other := range []*pgx.Conn{b, c} {
			var got bool
			if err := other.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(4242)`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got {
				t.Fatalf("round %d: another session took the advisory lock held by the pinned session", i)
			}
		}
		var held int
		if err := a.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&held); err != nil || held != 1 {
			t.Fatalf("round %d: the session's own backend holds %d advisory locks (%v), want 1", i, held, err)
		}
	}
	mustExec(t, a, `SELECT pg_advisory_unlock(4242)`)
	wantPinned(t, p, 1) // one unlock cannot tell whether it was the last
	mustExec(t, a, `SELECT pg_advisory_unlock_all()`)
	wantPinned(t, p, 0)
	var got bool
	if err := b.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(4242)`).Scan(&got); err != nil || !got {
		t.Fatalf("after unlock the lock is still held: %v %v", got, err)
	}
	if got := metricSum(t, p, "lattice_proxy_pins_total", map[string]string{"reason": "advisory_lock"}); got != 1 {
		t.Fatalf("lattice_proxy_pins_total{reason=advisory_lock} = %v, want 1", got)
	}

	// In a query string of several statements too.
	mustExec(t, a, `SELECT 1; SELECT pg_advisory_lock(4243)`)
	wantPinned(t, p, 1)
	if err := b.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(4243)`).Scan(&got); err != nil || got {
		t.Fatalf("another session took the lock of a query string: %v %v", got, err)
	}
	mustExec(t, a, `SELECT pg_advisory_unlock_all(); SELECT 2`)
	wantPinned(t, p, 0)
}

// TestPinPrepare: SQL-level PREPARE, EXECUTE and DEALLOCATE work across
// statements and protocols while other clients churn the pool; DEALLOCATE
// ALL ends the pin and drops the driver's protocol-level statements too, as
// on PostgreSQL, and the proxy's own prepared statements on that backend
// are prepared again afterwards.
func TestPinPrepare(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "3")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))

	mustExec(t, a, `PREPARE q (int) AS SELECT $1 * 2`)
	mustExec(t, a, `PREPARE r AS SELECT 'r'`)
	wantPinned(t, p, 1)
	stop := churn(t, p, 3)
	for i := 0; i < 40; i++ {
		mode := []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement}[i%2]
		var v int
		if err := a.QueryRow(ctx, fmt.Sprintf(`EXECUTE q (%d)`, i), mode).Scan(&v); err != nil || v != 2*i {
			t.Fatalf("EXECUTE q (%d) = %d, %v", i, v, err)
		}
		// One of the proxy's own statements on the pinned backend.
		if err := a.QueryRow(ctx, `SELECT $1::int + 1`, i).Scan(&v); err != nil || v != i+1 {
			t.Fatalf("extended statement: %d %v", v, err)
		}
	}
	stop()
	mustExec(t, a, `DEALLOCATE q`)
	if _, err := a.Exec(ctx, `EXECUTE q (1)`); sqlStateOf(err) != "26000" {
		t.Fatalf("EXECUTE after DEALLOCATE: %v, want 26000", err)
	}
	wantPinned(t, p, 1) // r is still there
	if got := oneString(t, a, `EXECUTE r`, pgx.QueryExecModeSimpleProtocol); got != "r" {
		t.Fatalf("EXECUTE r = %s", got)
	}
	// What pgx sees of its cached statement after DEALLOCATE ALL, on a
	// node directly and through the proxy.
	afterDeallocateAll := func(c *pgx.Conn) string {
		t.Helper()
		var out []string
		for i := 0; i < 3; i++ {
			if i == 1 {
				mustExec(t, c, `DEALLOCATE ALL`)
			}
			var v int
			err := c.QueryRow(ctx, `SELECT $1::int + 1`, 5).Scan(&v)
			out = append(out, fmt.Sprintf("%d %s", v, sqlStateOf(err)))
		}
		return strings.Join(out, ", ")
	}
	want := afterDeallocateAll(connect(t, testNodeDSN(t, 0)))
	if got := afterDeallocateAll(a); got != want {
		t.Fatalf("extended statement around DEALLOCATE ALL: %s, want %s (PostgreSQL)", got, want)
	}
	if !strings.Contains(want, "26000") {
		t.Fatalf("on PostgreSQL the driver's statement outlived DEALLOCATE ALL (%s): the comparison shows nothing", want)
	}
	wantPinned(t, p, 0)
}

// TestPinDiscardAndDisconnect: DISCARD ALL ends a pin over every kind of
// state, and a client that disconnects while pinned leaves nothing on the
// backend: with a pool of one backend, the next client gets that very
// backend, with no temp table, lock, prepared statement, cursor or setting
// left.
func TestPinDiscardAndDisconnect(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "1")
	ctx := context.Background()
	state := []string{
		`CREATE TEMP TABLE bar (v int)`,
		`SELECT pg_advisory_lock(77)`,
		`PREPARE pq AS SELECT 1`,
		`BEGIN`, `DECLARE cur CURSOR WITH HOLD FOR SELECT 1`, `COMMIT`,
		`SELECT set_config('lattice_test.x', 'left', false)`,
	}
	leftovers := func(c *pgx.Conn) string {
		t.Helper()
		return oneString(t, c, `SELECT concat_ws(',',
			to_regclass('pg_temp.bar')::text,
			(SELECT 'lock' FROM pg_locks WHERE locktype = 'advisory' LIMIT 1),
			(SELECT 'prepared ' || name FROM pg_prepared_statements LIMIT 1),
			(SELECT 'cursor ' || name FROM pg_cursors LIMIT 1),
			nullif(current_setting('lattice_test.x', true), ''))`, pgx.QueryExecModeSimpleProtocol)
	}

	a := connect(t, p.DSN("lattice"))
	for _, sql := range state {
		mustExec(t, a, sql)
	}
	wantPinned(t, p, 1)
	if got := metricSum(t, p, "lattice_proxy_pins_total", nil); got != 5 {
		t.Fatalf("lattice_proxy_pins_total = %v, want one per kind of state (5)", got)
	}
	if got := leftovers(a); got == "" {
		t.Fatal("the pinned session does not see its own state")
	}
	pid := oneString(t, a, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol)
	mustExec(t, a, `DISCARD ALL`)
	wantPinned(t, p, 0)
	if got := leftovers(a); got != "" {
		t.Fatalf("after DISCARD ALL: %s", got)
	}

	for _, sql := range state {
		mustExec(t, a, sql)
	}
	if got := oneString(t, a, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol); got != pid {
		t.Fatalf("pool of one: backend %s, then %s", pid, got)
	}
	a.Close(ctx)

	b := connect(t, p.DSN("lattice"))
	if got := oneString(t, b, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol); got != pid {
		t.Fatalf("the next client got backend %s, not the reset backend %s", got, pid)
	}
	if got := leftovers(b); got != "" {
		t.Fatalf("the next client finds the last one's state: %s", got)
	}
	wantPinned(t, p, 0)
}

// TestPinLimit: past --max-pinned the statement that would pin is refused
// with 53300 and a hint naming the fix; transaction-scoped state still
// works, and once a pin ends another session may pin.
func TestPinLimit(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--max-pinned", "1")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	b := connect(t, p.DSN("lattice"))

	mustExec(t, a, `CREATE TEMP TABLE foo (v int)`)
	for _, sql := range []string{`CREATE TEMP TABLE foo (v int)`, `SELECT pg_advisory_lock(1)`, `PREPARE x AS SELECT 1`} {
		for _, extended := range []bool{false, true} {
			var err error
			if extended {
				err = b.PgConn().ExecParams(ctx, sql, nil, nil, nil, nil).Read().Err
			} else {
				_, err = b.Exec(ctx, sql)
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Hint, "--max-pinned") || !strings.Contains(pe.Hint, "ON COMMIT DROP") {
				t.Fatalf("%s (extended %v) past --max-pinned: %v (hint %q), want 53300 naming the fix", sql, extended, err, hintOf(err))
			}
		}
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE foo (v int) ON COMMIT DROP`); err != nil {
		t.Fatalf("ON COMMIT DROP inside a transaction must not pin: %v", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantPinned(t, p, 1)
	mustExec(t, a, `DISCARD ALL`)
	mustExec(t, b, `CREATE TEMP TABLE foo (v int)`)
	wantPinned(t, p, 1)
}

func hintOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Hint
	}
	return ""
}

// TestPinBackendLost: when the pinned backend dies, the statement on it
// fails and the pin is gone: the gauge says so before the client hears of
// it. The backend's FATAL error reaches the client as it is, and then the
// proxy ends the session with FATAL 08006, so that a client whose driver
// reads on after a FATAL does not go on without its state.
func TestPinBackendLost(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "2")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	mustExec(t, a, `CREATE TEMP TABLE gone (v int)`)
	wantPinned(t, p, 1)
	pid := oneString(t, a, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol)
	var ok bool
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, `SELECT pg_terminate_backend($1::int)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%s): %v %v", pid, ok, err)
	}
	if _, err := a.Exec(ctx, `INSERT INTO gone VALUES (1)`, pgx.QueryExecModeSimpleProtocol); err == nil {
		t.Fatal("a statement on the terminated pinned backend succeeded")
	}
	wantPinned(t, p, 0)
	b := connect(t, p.DSN("lattice"))
	if got := oneString(t, b, `SELECT to_regclass('pg_temp.gone')::text`, pgx.QueryExecModeSimpleProtocol); got != "<null>" {
		t.Fatalf("after the pinned backend died another session sees %s", got)
	}

	// A client that does not close on the relayed FATAL (libpq and psql
	// read on) must not go on believing it holds its advisory lock: the
	// proxy ends the session, as PostgreSQL's end of the connection would.
	w := dialWire(t, p.DSN("lattice"))
	got := w.round(&pgproto3.Query{String: `SELECT pg_advisory_lock(42), pg_backend_pid()`})
	_, pid, ok = strings.Cut(strings.Fields(got)[1], ",")
	pid = strings.TrimSuffix(pid, ")")
	if !ok {
		t.Fatalf("advisory lock: %s", got)
	}
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, `SELECT pg_terminate_backend($1::int)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%s): %v %v", pid, ok, err)
	}
	if got := w.round(&pgproto3.Query{String: `SELECT 1`}); !strings.HasPrefix(got, "ErrorResponse") {
		t.Fatalf("the statement on the lost pinned backend: %s", got)
	}
	w.send(&pgproto3.Query{String: `SELECT 2`})
	var after []string
	for {
		msg, err := w.fe.Receive()
		if err != nil {
			break
		}
		after = append(after, fmt.Sprintf("%T", msg))
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			after[len(after)-1] += ":" + e.Severity + ":" + e.Code
		}
	}
	if len(after) != 1 || after[0] != "*pgproto3.ErrorResponse:FATAL:08006" {
		t.Fatalf("after the lost advisory lock the session answered %v, want one FATAL 08006 and its end", after)
	}
}

// TestPinExtended: the extended protocol pins and unpins as the simple one
// does. A state-ending statement counts only once its batch commits at
// Sync: DISCARD TEMP followed by an error in the same pipeline is rolled
// back with it, in PostgreSQL and through the proxy alike, and the session
// stays pinned.
func TestPinExtended(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "2", "--max-pinned", "1")
	ctx := context.Background()
	pc := connect(t, p.DSN("lattice")).PgConn()
	other := connect(t, p.DSN("lattice")).PgConn()
	direct := connect(t, testNodeDSN(t, 0)).PgConn()
	want := func(c *pgconn.PgConn, sql, want string) {
		t.Helper()
		if got := step(t, c, sql, true); got != want {
			t.Fatalf("%s: %s, want %s", sql, got, want)
		}
	}
	want(pc, `CREATE TEMP TABLE ext (v int)`, "CREATE TABLE [I]")
	wantPinned(t, p, 1)
	want(other, `CREATE TEMP TABLE ext (v int)`, "ERROR 53300 [I]")
	want(pc, `INSERT INTO ext VALUES (1)`, "INSERT 0 1 [I]")
	want(pc, `SELECT count(*) FROM ext`, "SELECT 1 1 [I]")
	want(pc, `PREPARE e AS SELECT 7`, "PREPARE [I]")
	want(pc, `EXECUTE e`, "SELECT 1 7 [I]")
	want(pc, `DEALLOCATE ALL`, "DEALLOCATE ALL [I]")
	wantPinned(t, p, 1) // the temp table is still there

	pipeline := func(c *pgconn.PgConn) {
		t.Helper()
		pl := c.StartPipeline(ctx)
		pl.SendQueryParams(`DISCARD TEMP`, nil, nil, nil, nil)
		pl.SendQueryParams(`SELECT 1/0`, nil, nil, nil, nil)
		if err := pl.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := pl.Close(); sqlStateOf(err) != "22012" {
			t.Fatalf("pipeline: %v, want 22012", err)
		}
	}
	want(direct, `CREATE TEMP TABLE ext (v int)`, "CREATE TABLE [I]")
	pipeline(direct)
	want(direct, `SELECT to_regclass('pg_temp.ext')::text`, "SELECT 1 ext [I]")
	pipeline(pc)
	want(pc, `SELECT to_regclass('pg_temp.ext')::text`, "SELECT 1 ext [I]")
	wantPinned(t, p, 1)

	// Parse, Describe, Bind and Execute in one batch of a transaction: the
	// pinned backend describes the statement, then joins the transaction.
	want(pc, `BEGIN`, "BEGIN [T]")
	pl := pc.StartPipeline(ctx)
	pl.SendPrepare("ins", `INSERT INTO ext VALUES ($1)`, nil)
	pl.SendQueryPrepared("ins", [][]byte{[]byte("5")}, nil, nil)
	if err := pl.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := pl.Close(); err != nil {
		t.Fatalf("prepare and insert in one batch: %v", err)
	}
	want(pc, `COMMIT`, "COMMIT [I]")
	wantPinned(t, p, 1)
	want(pc, `SELECT count(*) FROM ext WHERE v = 5`, "SELECT 1 1 [I]")

	want(pc, `DISCARD TEMP`, "DISCARD TEMP [I]")
	wantPinned(t, p, 0)
	want(other, `CREATE TEMP TABLE ext (v int)`, "CREATE TABLE [I]")
	wantPinned(t, p, 1)
}

// TestTempTableUnderTreeName: a temporary relation named like a tree or a
// reference table is refused (0A000, with a hint to use another name),
// however the statement makes it: TEMP, pg_temp or the session's
// pg_temp_N, IF NOT EXISTS, AS, SELECT INTO, a view (also one made
// temporary by reading a temporary table), a sequence, or a rename.
// PostgreSQL would look in pg_temp first, so the session's bare name would
// mean the temporary relation while the proxy routes it to the tree:
// DELETE FROM tt meant for the scratch table would empty the tree. Before,
// CREATE TEMP TABLE IF NOT EXISTS tt, CREATE TABLE pg_temp.tt and every
// form for a reference table made one. Temporary relations under other
// names, and CREATE TABLE IF NOT EXISTS of the tree itself, still work.
func TestTempTableUnderTreeName(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE tt (k bigint PRIMARY KEY, v int)`)
	mustExec(t, c, `INSERT INTO tt SELECT g, g FROM generate_series(1, 10) g`)
	mustExec(t, c, `SELECT lattice_create_tree('tt', 'k', shard_count => 4)`)
	mustExec(t, c, `CREATE TABLE tref (id int PRIMARY KEY, name text)`)
	mustExec(t, c, `INSERT INTO tref VALUES (1, 'one')`)
	mustExec(t, c, `SELECT lattice_create_reference_table('tref')`)

	// {temp} is the session's own temporary schema, pg_temp_N.
	var refused []string
	for _, name := range []string{"tt", "tref"} {
		for _, sql := range []string{
			`CREATE TEMP TABLE %s (k bigint)`,
			`CREATE TEMP TABLE IF NOT EXISTS %s (k bigint)`,
			`CREATE TEMPORARY TABLE IF NOT EXISTS %s (LIKE scratch)`,
			`CREATE TABLE pg_temp.%s (k bigint)`,
			`CREATE TABLE IF NOT EXISTS pg_temp.%s (k bigint)`,
			`CREATE TABLE {temp}.%s (k bigint)`,
			`CREATE TEMP TABLE %s AS SELECT 1 AS k`,
			`CREATE TEMP TABLE IF NOT EXISTS %s AS SELECT 1 AS k`,
			`EXPLAIN ANALYZE CREATE TEMP TABLE %s AS SELECT 1 AS k`,
			`SELECT 1 AS k INTO TEMP %s`,
			`SELECT 1 AS k INTO pg_temp.%s`,
			`CREATE TEMP VIEW %s AS SELECT 1 AS k`,
			`CREATE OR REPLACE VIEW pg_temp.%s AS SELECT 1 AS k`,
			`CREATE VIEW %s AS SELECT * FROM scratch`,
			`CREATE TEMP SEQUENCE %s`,
			`CREATE SEQUENCE IF NOT EXISTS pg_temp.%s`,
			`ALTER TABLE scratch RENAME TO %s`,
			`ALTER TABLE pg_temp.scratch RENAME TO %s`,
			`ALTER TABLE IF EXISTS {temp}.scratch RENAME TO %s`,
		} {
			refused = append(refused, fmt.Sprintf(sql, name))
		}
	}
	tempSchema := func(t *testing.T) string {
		t.Helper()
		return oneString(t, c, `SELECT nspname::text FROM pg_catalog.pg_namespace WHERE oid = pg_catalog.pg_my_temp_schema()`)
	}
	for _, sql := range refused {
		for _, simple := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s simple=%v", sql, simple), func(t *testing.T) {
				mustExec(t, c, `CREATE TEMP TABLE scratch (k bigint)`)
				defer mustExec(t, c, `DISCARD TEMP`)
				sql := strings.ReplaceAll(sql, "{temp}", tempSchema(t))
				var err error
				if simple {
					_, err = c.Exec(ctx, sql)
				} else {
					_, err = c.PgConn().ExecParams(ctx, sql, nil, nil, nil, nil).Close()
				}
				if pgCode(err) != "0A000" || !strings.Contains(hintOf(err), "another name") {
					t.Errorf("%s: %v (hint %q), want 0A000 with a hint to use another name", sql, err, hintOf(err))
				}
				if got := oneString(t, c, `SELECT count(*)::text FROM pg_catalog.pg_class WHERE relpersistence = 't' AND relname IN ('tt', 'tref')`); got != "0" {
					t.Errorf("after %s: %s temporary relations named tt or tref", sql, got)
				}
				if got := oneString(t, c, `SELECT count(*)::text FROM tt`); got != "10" {
					t.Fatalf("after %s the tree has %s rows, want 10", sql, got)
				}
			})
		}
	}

	// Other names, and the tree's own CREATE TABLE IF NOT EXISTS (a no-op).
	for _, sql := range []string{
		`CREATE TABLE IF NOT EXISTS tt (k bigint PRIMARY KEY, v int)`,
		`CREATE TABLE IF NOT EXISTS tref (id int PRIMARY KEY, name text)`,
		`CREATE TEMP TABLE scratch (k bigint)`,
		`INSERT INTO scratch VALUES (1), (2)`,
		`CREATE TEMP TABLE scratch2 AS SELECT * FROM scratch`,
		`SELECT * INTO TEMP scratch3 FROM scratch`,
		`CREATE VIEW scratch_v AS SELECT * FROM scratch`,
		`CREATE TEMP SEQUENCE scratch_s`,
		`ALTER TABLE scratch3 RENAME TO scratch4`,
		`DELETE FROM scratch WHERE k = 1`,
	} {
		mustExec(t, c, sql)
	}
	for sql, want := range map[string]string{
		`SELECT count(*)::text FROM scratch`:     "1",
		`SELECT count(*)::text FROM scratch_v`:   "1",
		`SELECT count(*)::text FROM scratch4`:    "2",
		`SELECT nextval('scratch_s')::text`:      "1",
		`SELECT count(*)::text FROM tt`:          "10",
		`SELECT count(*)::text FROM public.tref`: "1",
	} {
		if got := oneString(t, c, sql); got != want {
			t.Fatalf("%s = %s, want %s", sql, got, want)
		}
	}
}
