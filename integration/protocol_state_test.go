package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// wire is a raw protocol connection, for sequences a driver would not send.
type wire struct {
	t  testing.TB
	nc net.Conn
	fe *pgproto3.Frontend
	// types adds each column's type to a RowDescription's summary.
	types bool
	// pid and key are the BackendKeyData the server sent, for cancel.
	pid uint32
	key []byte
}

func dialWire(t testing.TB, dsn string) *wire {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	hj, err := pc.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hj.Conn.Close() })
	return &wire{t: t, nc: hj.Conn, fe: pgproto3.NewFrontend(hj.Conn, hj.Conn), pid: hj.PID, key: hj.SecretKey}
}

// cancel sends a CancelRequest for the connection and returns once the
// server closed the request's connection, as it does when it has handled it.
func (w *wire) cancel() {
	w.t.Helper()
	c, err := net.DialTimeout(w.nc.RemoteAddr().Network(), w.nc.RemoteAddr().String(), 20*time.Second)
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	req := &pgproto3.CancelRequest{ProcessID: w.pid, SecretKey: w.key}
	buf, err := req.Encode(nil)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := c.Write(buf); err != nil {
		w.t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		w.t.Fatalf("cancel request: %v, want the server to close", err)
	}
}

// round sends msgs and reads up to the ReadyForQuery of every Sync or Query
// among them, summing up each response as its type, with the SQLSTATE of an
// error and the values of a row.
func (w *wire) round(msgs ...pgproto3.FrontendMessage) string {
	w.t.Helper()
	ends := 0
	for _, m := range msgs {
		w.fe.Send(m)
		switch m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			ends++
		}
	}
	if err := w.fe.Flush(); err != nil {
		w.t.Fatal(err)
	}
	return w.read(func(m pgproto3.BackendMessage) bool {
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			ends--
		}
		return ends == 0
	})
}

// send sends msgs at once, reading nothing.
func (w *wire) send(msgs ...pgproto3.FrontendMessage) {
	w.t.Helper()
	for _, m := range msgs {
		w.fe.Send(m)
	}
	if err := w.fe.Flush(); err != nil {
		w.t.Fatal(err)
	}
}

// read sums up responses as round does, up to the one last reports.
func (w *wire) read(last func(pgproto3.BackendMessage) bool) string {
	w.t.Helper()
	_ = w.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []string
	for {
		msg, err := w.fe.Receive()
		if err != nil {
			w.t.Fatalf("%v after %v", err, got)
		}
		name := strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3.")
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			name += ":" + m.Code
		case *pgproto3.RowDescription:
			var cols []string
			for _, f := range m.Fields {
				col := string(f.Name)
				if w.types {
					col += ":" + fmt.Sprint(f.DataTypeOID)
				}
				cols = append(cols, col)
			}
			name += "(" + strings.Join(cols, ",") + ")"
		case *pgproto3.DataRow:
			var vals []string
			for _, v := range m.Values {
				vals = append(vals, string(v))
			}
			name += "(" + strings.Join(vals, ",") + ")"
		case *pgproto3.ReadyForQuery:
			name += ":" + string(m.TxStatus)
		case *pgproto3.ParameterStatus, *pgproto3.NoticeResponse:
			continue
		}
		got = append(got, name)
		if last(msg) {
			return strings.Join(got, " ")
		}
	}
}

// both runs the same rounds on plain PostgreSQL and through the proxy and
// fails where the answers differ.
func bothWires(t *testing.T, direct, proxied *wire, rounds ...[]pgproto3.FrontendMessage) {
	t.Helper()
	for i, r := range rounds {
		want := direct.round(r...)
		got := proxied.round(r...)
		if got != want {
			t.Fatalf("round %d:\n got  %s\n want %s (PostgreSQL)", i, got, want)
		}
	}
}

func text(s string) []byte { return []byte(s) }

// execOne is Parse (unnamed unless named), Bind, Execute of sql with params.
func execOne(stmt, sql string, params ...string) []pgproto3.FrontendMessage {
	var ps [][]byte
	for _, p := range params {
		ps = append(ps, text(p))
	}
	return []pgproto3.FrontendMessage{
		&pgproto3.Parse{Name: stmt, Query: sql},
		&pgproto3.Bind{PreparedStatement: stmt, Parameters: ps},
		&pgproto3.Execute{},
	}
}

func seq(parts ...[]pgproto3.FrontendMessage) []pgproto3.FrontendMessage {
	var out []pgproto3.FrontendMessage
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var syncMsg = []pgproto3.FrontendMessage{&pgproto3.Sync{}}

// TestProtocolState checks that the proxy's idea of what each backend has
// prepared and bound stays PostgreSQL's through errors, aborted pipelines,
// Close, DEALLOCATE and DISCARD. One backend per node (--pool-size 1), so
// every round lands where the last one left its state.
func TestProtocolState(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "1")
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE plain (k integer PRIMARY KEY, v text)`)
	mustExec(t, c, `INSERT INTO plain SELECT i, 'v' || i FROM generate_series(1, 10) i`)
	direct, proxied := dialWire(t, testNodeDSN(t, 0)), dialWire(t, p.DSN("lattice"))

	t.Run("pipeline with an error, then a statement after Sync", func(t *testing.T) {
		bothWires(t, direct, proxied,
			seq(execOne("", "select $1::int + 1", "1"), execOne("", "select 1/$1::int", "0"), execOne("", "select $1::text", "a"), syncMsg),
			seq(execOne("", "select $1::text", "b"), syncMsg),
		)
	})
	t.Run("error at Bind", func(t *testing.T) {
		bothWires(t, direct, proxied,
			seq(execOne("", "select $1::int * 2", "x"), execOne("", "select $1::int * 3", "2"), syncMsg),
			seq(execOne("", "select $1::int * 3", "2"), execOne("", "select $1::int * 2", "4"), syncMsg),
		)
	})
	t.Run("Close of a statement and of a portal", func(t *testing.T) {
		bothWires(t, direct, proxied,
			[]pgproto3.FrontendMessage{&pgproto3.Query{String: "BEGIN"}},
			[]pgproto3.FrontendMessage{
				&pgproto3.Parse{Name: "s1", Query: "select v from plain where k = $1"},
				&pgproto3.Bind{DestinationPortal: "p1", PreparedStatement: "s1", Parameters: [][]byte{text("1")}},
				&pgproto3.Execute{Portal: "p1"},
				&pgproto3.Close{ObjectType: 'P', Name: "p1"},
				&pgproto3.Bind{DestinationPortal: "p1", PreparedStatement: "s1", Parameters: [][]byte{text("2")}},
				&pgproto3.Execute{Portal: "p1"},
				&pgproto3.Sync{},
			},
			[]pgproto3.FrontendMessage{
				&pgproto3.Bind{DestinationPortal: "p1", PreparedStatement: "s1", Parameters: [][]byte{text("3")}},
				&pgproto3.Sync{},
			},
			[]pgproto3.FrontendMessage{&pgproto3.Query{String: "ROLLBACK"}},
			[]pgproto3.FrontendMessage{
				&pgproto3.Close{ObjectType: 'S', Name: "s1"},
				&pgproto3.Bind{PreparedStatement: "s1", Parameters: [][]byte{text("1")}},
				&pgproto3.Sync{},
			},
			seq(execOne("s1", "select v from plain where k = $1", "4"), syncMsg),
			[]pgproto3.FrontendMessage{&pgproto3.Close{ObjectType: 'S', Name: "s1"}, &pgproto3.Sync{}},
		)
	})
	t.Run("DEALLOCATE ALL and DISCARD ALL", func(t *testing.T) {
		// Both drop the proxy's statements on the backend, which must be
		// prepared again, and the client's named statements, which share
		// one namespace with SQL PREPARE.
		bothWires(t, direct, proxied,
			seq(execOne("s2", "select v from plain where k = $1", "4"), syncMsg),
			seq(execOne("", "select v from plain where k = $1", "5"), syncMsg),
			[]pgproto3.FrontendMessage{&pgproto3.Query{String: "DEALLOCATE ALL"}},
			[]pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: "s2", Parameters: [][]byte{text("5")}}, &pgproto3.Sync{}},
			seq(execOne("", "select v from plain where k = $1", "6"), syncMsg),
			seq(execOne("s2", "select v from plain where k = $1", "5"), syncMsg),
			// DEALLOCATE ALL in the extended protocol keeps the unnamed
			// statement, which is itself.
			seq(execOne("", "DEALLOCATE ALL"), syncMsg),
			[]pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: "s2", Parameters: [][]byte{text("5")}}, &pgproto3.Sync{}},
			seq(execOne("s2", "select v from plain where k = $1", "5"), syncMsg),
			[]pgproto3.FrontendMessage{&pgproto3.Query{String: "DISCARD ALL"}},
			[]pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: "s2", Parameters: [][]byte{text("5")}}, &pgproto3.Sync{}},
			seq(execOne("s2", "select v from plain where k = $1", "6"), syncMsg),
			seq(execOne("", "select v from plain where k = $1", "7"), syncMsg),
			[]pgproto3.FrontendMessage{&pgproto3.Close{ObjectType: 'S', Name: "s2"}, &pgproto3.Sync{}},
		)
	})
	t.Run("SQL DEALLOCATE of a protocol statement", func(t *testing.T) {
		query := func(sql string) []pgproto3.FrontendMessage {
			return []pgproto3.FrontendMessage{&pgproto3.Query{String: sql}}
		}
		bindS3 := []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: "s3", Parameters: [][]byte{text("1")}}, &pgproto3.Execute{}, &pgproto3.Sync{}}
		bothWires(t, direct, proxied,
			seq(execOne("s3", "select $1::int + 10", "1"), syncMsg),
			query("DEALLOCATE s3"),
			bindS3,
			query("DEALLOCATE s3"),
			// In the extended protocol, and under a name taken again.
			seq(execOne("s3", "select $1::int + 20", "1"), syncMsg),
			seq(execOne("", "DEALLOCATE PREPARE s3"), syncMsg),
			bindS3,
			// SQL PREPARE of a protocol statement's name.
			seq(execOne("s3", "select $1::int + 30", "1"), syncMsg),
			query("PREPARE s3 AS SELECT 1"),
			bindS3,
			// Not transactional, and refused in a failed transaction.
			query("BEGIN"),
			query("DEALLOCATE s3"),
			query("ROLLBACK"),
			bindS3,
			seq(execOne("s3", "select $1::int + 40", "1"), syncMsg),
			query("BEGIN"),
			query("SELECT 1/0"),
			query("DEALLOCATE s3"),
			query("ROLLBACK"),
			bindS3,
			query("DEALLOCATE s3"),
		)
	})
}

// TestProtocolStateFanOutsInTransaction runs two SELECTs over several shards
// in one transaction in the extended protocol: each binds a portal on every
// node, and the second must not find the first's still open (42P03).
func TestProtocolStateFanOutsInTransaction(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	setupCatalogue(t, c, 100)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for i := 0; i < 3; i++ {
		rows, err := tx.Query(ctx, `SELECT sku FROM catalogue WHERE qty BETWEEN $1 AND $2`, 10, 59)
		if err != nil {
			t.Fatal(err)
		}
		if skus, err := pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(skus) != 50 {
			t.Fatalf("fan-out %d: %d rows, %v", i, len(skus), err)
		}
		rows, err = tx.Query(ctx, `SELECT sku FROM catalogue WHERE qty BETWEEN $1 AND $2 ORDER BY qty`, 10, 19)
		if err != nil {
			t.Fatal(err)
		}
		skus, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(skus) != 10 || skus[0] != "sku10" {
			t.Fatalf("ordered fan-out %d: %v %v", i, skus, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestProtocolStateOversizeBind sends Binds past PostgreSQL's limits: the
// client gets PostgreSQL's ErrorResponse and keeps its session.
func TestProtocolStateOversizeBind(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	setupCatalogue(t, c, 10)
	direct, proxied := dialWire(t, testNodeDSN(t, 0)), dialWire(t, p.DSN("lattice"))
	many := make([][]byte, 65535)
	for i := range many {
		many[i] = text("1")
	}
	bind := func(sql string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: sql},
			&pgproto3.Bind{Parameters: many},
			&pgproto3.Execute{},
			&pgproto3.Sync{},
		}
	}
	bothWires(t, direct, proxied,
		bind("select $1::int"),
		seq(execOne("", "select $1::int", "3"), syncMsg),
	)
	// On a tree the proxy routes by the parameters before a node sees them.
	got := proxied.round(bind("SELECT qty FROM catalogue WHERE sku = $1")...)
	if !strings.HasPrefix(got, "ParseComplete ErrorResponse:08P01 ReadyForQuery:I") {
		t.Fatalf("tree statement with 65535 parameters: got %s", got)
	}
	if got := proxied.round(seq(execOne("", "SELECT qty FROM catalogue WHERE sku = $1", "sku3"), syncMsg)...); got != "ParseComplete BindComplete DataRow(3) CommandComplete ReadyForQuery:I" {
		t.Fatalf("after the oversize Bind: %s", got)
	}
}

// TestProtocolStateResultTypeChange alters a table under a prepared
// SELECT *: statements parsed after the ALTER see the new column on every
// backend, and one parsed before fails once with PostgreSQL's 0A000, after
// which the driver prepares it again and it works.
func TestProtocolStateResultTypeChange(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "3")
	ctx := context.Background()
	admin := connect(t, p.DSN("lattice"))
	setupCatalogue(t, admin, 10)
	mustExec(t, admin, `CREATE TABLE plain (k integer PRIMARY KEY, v text)`)
	mustExec(t, admin, `INSERT INTO plain SELECT i, 'v' || i FROM generate_series(1, 10) i`)
	for _, tc := range []struct{ table, query, arg, cols, colsAfter string }{
		{"plain", `SELECT * FROM plain WHERE k = $1`, "3", "2", "3"},
		{"catalogue", `SELECT * FROM catalogue WHERE sku = $1`, "sku3", "3", "4"},
	} {
		t.Run(tc.table, func(t *testing.T) {
			// Three clients in transactions at once hold three backends,
			// so the statement is prepared on each of them.
			columns := func(conns []*pgx.Conn) []string {
				var out []string
				var txs []pgx.Tx
				for _, c := range conns {
					tx, err := c.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					txs = append(txs, tx)
					rows, err := tx.Query(ctx, tc.query, tc.arg)
					if err != nil {
						out = append(out, pgCode(err))
						continue
					}
					vals, err := pgx.CollectOneRow(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
					if err != nil {
						out = append(out, pgCode(err))
						continue
					}
					out = append(out, fmt.Sprint(len(vals)))
				}
				for _, tx := range txs {
					_ = tx.Rollback(ctx)
				}
				return out
			}
			old := []*pgx.Conn{connect(t, p.DSN("lattice")), connect(t, p.DSN("lattice")), connect(t, p.DSN("lattice"))}
			before := columns(old)
			mustExec(t, admin, `ALTER TABLE `+tc.table+` ADD COLUMN extra integer DEFAULT 7`)
			fresh := []*pgx.Conn{connect(t, p.DSN("lattice")), connect(t, p.DSN("lattice")), connect(t, p.DSN("lattice"))}
			after := columns(fresh)
			again := columns(old)
			healed := columns(old)
			for i := range before {
				if before[i] != tc.cols {
					t.Fatalf("before ALTER: %v, want %s columns", before, tc.cols)
				}
				if after[i] != tc.colsAfter {
					t.Fatalf("parsed after ALTER: %v, want %s columns", after, tc.colsAfter)
				}
				if again[i] != "0A000" && again[i] != tc.colsAfter {
					t.Fatalf("parsed before ALTER: %v, want 0A000 or %s columns", again, tc.colsAfter)
				}
				if healed[i] != tc.colsAfter {
					t.Fatalf("prepared again after 0A000: %v, want %s columns", healed, tc.colsAfter)
				}
			}
		})
	}
}

// TestProtocolStateBackendReplaced prepares statements on pooled backends,
// kills every one of them with pg_terminate_backend, and uses the
// statements again: the proxy prepares them on the new backends.
func TestProtocolStateBackendReplaced(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "2")
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	setupCatalogue(t, c, 10)
	mustExec(t, c, `CREATE TABLE plain (k integer PRIMARY KEY, v text)`)
	mustExec(t, c, `INSERT INTO plain SELECT i, 'v' || i FROM generate_series(1, 10) i`)
	use := func() error {
		var n int
		var v string
		if err := c.QueryRow(ctx, `SELECT qty FROM catalogue WHERE sku = $1`, "sku4").Scan(&n); err != nil {
			return err
		}
		if err := c.QueryRow(ctx, `SELECT v FROM plain WHERE k = $1`, 4).Scan(&v); err != nil {
			return err
		}
		if n != 4 || v != "v4" {
			return fmt.Errorf("got %d %q", n, v)
		}
		return nil
	}
	for i := 0; i < 3; i++ {
		if err := use(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		d := connect(t, testNodeDSN(t, i))
		var killed int
		if err := d.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&killed); err != nil {
			t.Fatal(err)
		}
		if killed == 0 {
			t.Fatalf("node %d: no backend to kill", i)
		}
	}
	// A backend that died while idle in the pool is found dead when it is
	// next taken (after it sat idle a moment); the statements are prepared
	// again on its replacement.
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 3; i++ {
		if err := use(); err != nil {
			t.Fatalf("after the backends were replaced, use %d: %v", i, err)
		}
	}
}

// TestProtocolStateTypeRolledBack creates a type in a transaction, uses it
// in a statement and rolls back, twice: the backend statement of the first
// round names a type that is gone, and must not serve the second.
func TestProtocolStateTypeRolledBack(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	direct, proxied := dialWire(t, testNodeDSN(t, 0)), dialWire(t, p.DSN("lattice"))
	rounds := [][]pgproto3.FrontendMessage{
		{&pgproto3.Query{String: "BEGIN"}},
		{&pgproto3.Query{String: "CREATE TYPE fruit AS ENUM ('orange', 'pear')"}},
		seq(execOne("", "select $1::fruit", "pear"), syncMsg),
		{&pgproto3.Query{String: "ROLLBACK"}},
	}
	// One wire at a time: the uncommitted type of one would block the
	// other's CREATE TYPE on the same node.
	var want, got []string
	for i := 0; i < 2; i++ {
		for _, r := range rounds {
			want = append(want, direct.round(r...))
		}
	}
	for i := 0; i < 2; i++ {
		for _, r := range rounds {
			got = append(got, proxied.round(r...))
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("round %d:\n got  %s\n want %s (PostgreSQL)", i, got[i], want[i])
		}
	}
}

// TestProtocolStateSessionResults describes FETCH and EXECUTE statements,
// whose result columns are those of the session's cursor or SQL-level
// statement when they are parsed, after the cursor or the statement changed.
// PostgreSQL 15 dies of a segfault describing a FETCH statement parsed while
// its cursor was open once the cursor is gone: the proxy must not describe
// a backend statement another statement of the session left behind. One
// backend (--pool-size 1), so the rounds share it.
func TestProtocolStateSessionResults(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "1")
	direct, proxied := dialWire(t, testNodeDSN(t, 0)), dialWire(t, p.DSN("lattice"))
	query := func(sql string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Query{String: sql}}
	}
	describe := func(stmt, sql string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{
			&pgproto3.Parse{Name: stmt, Query: sql},
			&pgproto3.Describe{ObjectType: 'S', Name: stmt},
			&pgproto3.Sync{},
		}
	}
	fetch := seq(execOne("", `FETCH 1 IN c`)[:2], []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}})
	bothWires(t, direct, proxied,
		query("BEGIN"),
		query(`DECLARE c CURSOR FOR SELECT n, n::text AS str FROM generate_series(1, 3) n`),
		fetch,
		query("ROLLBACK"),
		// The cursor is gone: no columns.
		describe("f1", `FETCH 1 IN c`),
		query("BEGIN"),
		query(`DECLARE c CURSOR FOR SELECT n FROM generate_series(1, 3) n`),
		describe("f2", `FETCH 1 IN c`),
		fetch,
		query("ROLLBACK"),
		// A SQL-level statement defined again under its name.
		query(`PREPARE q AS SELECT 1 AS one`),
		seq(execOne("", `EXECUTE q`), syncMsg),
		query(`DEALLOCATE q`),
		query(`PREPARE q AS SELECT 1 AS one, 2 AS two`),
		describe("e1", `EXECUTE q`),
		seq(execOne("", `EXECUTE q`), syncMsg),
		query(`DEALLOCATE q`),
	)
}

// TestProtocolStateParse checks that what fails a Parse on PostgreSQL fails
// it through the proxy too, in its place before ParseComplete, and leaves no
// statement: an unknown column or relation, and a statement_timeout that
// runs out while the client pauses between Parse and Describe (pgx's
// Prepare, TestPrepareHandlesTimeoutBetweenParseAndDescribe).
func TestProtocolStateParse(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "1")
	direct, proxied := dialWire(t, testNodeDSN(t, 0)), dialWire(t, p.DSN("lattice"))
	prepare := func(name, sql string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Parse{Name: name, Query: sql}, &pgproto3.Describe{ObjectType: 'S', Name: name}, &pgproto3.Sync{}}
	}
	bothWires(t, direct, proxied,
		prepare("s1", "select foo"),
		prepare("s1", "select 1 as foo"),
		prepare("", "select * from no_such_table"),
		[]pgproto3.FrontendMessage{&pgproto3.Parse{Name: "s2", Query: "select * from no_such_table"}, &pgproto3.Sync{}},
		prepare("s2", "select 2 as bar"),
		[]pgproto3.FrontendMessage{&pgproto3.Query{String: "SET statement_timeout = '50ms'"}},
	)
	for _, name := range []string{"s3", "", "s4"} {
		// PostgreSQL times the Parse from its arrival: the timeout runs
		// out before the Describe comes, which fails (57014). The
		// statement was parsed: it runs.
		direct.send(&pgproto3.Parse{Name: name, Query: "select $1::varchar"})
		proxied.send(&pgproto3.Parse{Name: name, Query: "select $1::varchar"})
		time.Sleep(time.Second)
		describe := []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'S', Name: name}, &pgproto3.Sync{}}
		if want := direct.round(describe...); !strings.Contains(want, "ErrorResponse:57014") {
			t.Fatalf("PostgreSQL answered %s", want)
		} else if got := proxied.round(describe...); got != want {
			t.Fatalf("Describe after a pause of %q:\n got  %s\n want %s (PostgreSQL)", name, got, want)
		}
		bothWires(t, direct, proxied, []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: name, Parameters: [][]byte{text("x")}}, &pgproto3.Execute{}, &pgproto3.Sync{},
		})
	}
	// A pause after the Bind (pgx's QueryExecModeExec sends Parse, Bind,
	// Describe, Execute, Sync): the Describe fails as well.
	direct.send(&pgproto3.Parse{Query: "select 2"}, &pgproto3.Bind{})
	proxied.send(&pgproto3.Parse{Query: "select 2"}, &pgproto3.Bind{})
	time.Sleep(time.Second)
	rest := []pgproto3.FrontendMessage{&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}}
	if want := direct.round(rest...); !strings.Contains(want, "ErrorResponse:57014") {
		t.Fatalf("PostgreSQL answered %s", want)
	} else if got := proxied.round(rest...); got != want {
		t.Fatalf("Describe after a pause past Bind:\n got  %s\n want %s (PostgreSQL)", got, want)
	}
}

// TestProtocolStateCopyError checks that an error PostgreSQL sends in the
// middle of a COPY FROM STDIN reaches the client then, before it ends the
// COPY: a client streaming rows stops at the error (pgx's
// TestConnCopyFromFailServerSideMidwayAbortsWithoutWaiting).
func TestProtocolStateCopyError(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "1")
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE copied (a integer NOT NULL)`)
	direct, proxied := dialWire(t, testNodeDSN(t, 0)), dialWire(t, p.DSN("lattice"))
	copyUntilError := func(w *wire, rounds ...[]pgproto3.FrontendMessage) string {
		w.send(&pgproto3.Query{String: "COPY copied FROM STDIN"})
		got := w.read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.CopyInResponse); return ok })
		w.send(&pgproto3.CopyData{Data: []byte("1\n2\n")}, &pgproto3.CopyData{Data: []byte("\\N\n")})
		// No CopyDone yet: the error must come without it.
		got += " | " + w.read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.ReadyForQuery); return ok })
		w.send(&pgproto3.CopyData{Data: []byte("3\n")}, &pgproto3.CopyDone{})
		got += " | " + w.round(&pgproto3.Query{String: "SELECT count(*) FROM copied"})
		return got + " | " + w.round(seq(execOne("", "SELECT count(*) FROM copied"), syncMsg)...)
	}
	want := copyUntilError(direct)
	if got := copyUntilError(proxied); got != want {
		t.Fatalf("\n got  %s\n want %s (PostgreSQL)", got, want)
	}
}

// TestProtocolStateOwnBackendTerminated ends the client's own backend with
// pg_terminate_backend(pg_backend_pid()), in both protocols and as a
// BeginTx's BEGIN: the client gets PostgreSQL's FATAL, which pgx takes as
// the end of its connection (pgx's TestBeginTxFatalErrorKillsConn), and the
// pool serves the next client. Signals to any other backend stay refused.
func TestProtocolStateOwnBackendTerminated(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "1")
	ctx := context.Background()
	const kill = "select pg_terminate_backend(pg_backend_pid())"
	for name, run := range map[string]func(c *pgx.Conn) error{
		"simple":   func(c *pgx.Conn) error { _, err := c.Exec(ctx, kill); return err },
		"extended": func(c *pgx.Conn) error { _, err := c.Exec(ctx, kill, pgx.QueryExecModeExec); return err },
		"begin": func(c *pgx.Conn) error {
			_, err := c.BeginTx(ctx, pgx.TxOptions{BeginQuery: kill})
			return err
		},
	} {
		c := connect(t, p.DSN("lattice"))
		err := run(c)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.SeverityUnlocalized != "FATAL" || pe.Code != "57P01" || !c.IsClosed() {
			t.Fatalf("%s: %v (closed %v), want FATAL 57P01 and a closed connection", name, err, c.IsClosed())
		}
		var one int
		if err := connect(t, p.DSN("lattice")).QueryRow(ctx, "select 1").Scan(&one); err != nil {
			t.Fatalf("%s: the next client: %v", name, err)
		}
	}
	c := connect(t, p.DSN("lattice"))
	_, err := c.Exec(ctx, "select pg_terminate_backend(pg_backend_pid() + 1)")
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("another backend: %v, want 42501", err)
	}
}
