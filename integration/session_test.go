package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestSessionStateInterleaved: two clients share two pooled backends per
// node (--pool-size 2) and interleave statements, so each statement may run
// on a backend the other client used last. Settings, application_name,
// search_path, named and unnamed prepared statements and DISCARD ALL must
// each stay with their own session.
func TestSessionStateInterleaved(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--pool-size", "2")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice")+"&application_name=alpha")
	b := connect(t, p.DSN("lattice")+"&application_name=beta")

	mustExec(t, a, `CREATE SCHEMA sa`)
	mustExec(t, a, `CREATE SCHEMA sb`)
	mustExec(t, a, `CREATE TABLE sa.who (v text)`)
	mustExec(t, a, `CREATE TABLE sb.who (v text)`)
	mustExec(t, a, `INSERT INTO sa.who VALUES ('a')`)
	mustExec(t, a, `INSERT INTO sb.who VALUES ('b')`)

	one := func(c *pgx.Conn, sql string, args ...any) string {
		t.Helper()
		var v string
		if err := c.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return v
	}
	type check struct {
		c    *pgx.Conn
		sql  string
		args []any
		want string
	}
	run := func(checks []check) {
		t.Helper()
		// Twice, on both protocols, so that each check runs after the other
		// client's statements on whatever backend is free.
		for round := 0; round < 2; round++ {
			for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
				for _, ck := range checks {
					if got := one(ck.c, ck.sql, append([]any{mode}, ck.args...)...); got != ck.want {
						t.Fatalf("round %d mode %v: %s = %q, want %q", round, mode, ck.sql, got, ck.want)
					}
				}
			}
		}
	}

	mustExec(t, a, `SET search_path = sa, public`)
	mustExec(t, b, `SET search_path TO sb, public`)
	mustExec(t, a, `SET statement_timeout = '17s'`)
	mustExec(t, b, `SET application_name = 'gamma'`)
	run([]check{
		{a, `SELECT v FROM who`, nil, "a"},
		{b, `SELECT v FROM who`, nil, "b"},
		{a, `SELECT current_setting('application_name')`, nil, "alpha"},
		{b, `SELECT current_setting('application_name')`, nil, "gamma"},
		{a, `SELECT current_setting('statement_timeout')`, nil, "17s"},
		{b, `SELECT current_setting('statement_timeout')`, nil, "0"},
		{a, `SELECT v FROM who WHERE v = $1`, []any{"a"}, "a"},
		{b, `SELECT v FROM who WHERE v = $1`, []any{"b"}, "b"},
	})
	// SHOW goes through the simple protocol as PostgreSQL's own command.
	for _, ck := range []check{
		{a, `SHOW search_path`, nil, "sa, public"},
		{b, `SHOW search_path`, nil, "sb, public"},
		{b, `SHOW application_name`, nil, "gamma"},
		{a, `SHOW statement_timeout`, nil, "17s"},
	} {
		if got := one(ck.c, ck.sql, pgx.QueryExecModeSimpleProtocol); got != ck.want {
			t.Fatalf("%s = %q, want %q", ck.sql, got, ck.want)
		}
	}

	// RESET returns to the startup value, RESET ALL to all of them.
	mustExec(t, b, `RESET application_name`)
	mustExec(t, a, `RESET ALL`)
	run([]check{
		{b, `SELECT current_setting('application_name')`, nil, "beta"},
		{a, `SELECT current_setting('application_name')`, nil, "alpha"},
		{a, `SELECT current_setting('statement_timeout')`, nil, "0"},
		{a, `SELECT current_setting('search_path')`, nil, `"$user", public`},
		{b, `SELECT v FROM who`, nil, "b"},
	})

	// A SET inside a transaction lasts only if the transaction commits, as
	// in PostgreSQL; SET LOCAL never outlives it.
	for _, end := range []string{"ROLLBACK", "COMMIT"} {
		mustExec(t, b, `BEGIN`)
		mustExec(t, b, `SET search_path = sa, public`)
		mustExec(t, b, `SET LOCAL statement_timeout = '3s'`)
		if got := one(b, `SELECT v FROM who`, pgx.QueryExecModeSimpleProtocol); got != "a" {
			t.Fatalf("inside the transaction: %q", got)
		}
		mustExec(t, b, end)
		want := map[string]string{"ROLLBACK": "b", "COMMIT": "a"}[end]
		run([]check{
			{b, `SELECT v FROM who`, nil, want},
			{b, `SELECT current_setting('statement_timeout')`, nil, "0"},
			{a, `SELECT current_setting('search_path')`, nil, `"$user", public`},
		})
		mustExec(t, b, `SET search_path = sb, public`)
	}
	// A failed transaction's COMMIT rolls back its SETs too.
	mustExec(t, b, `BEGIN`)
	mustExec(t, b, `SET search_path = sa, public`)
	if _, err := b.Exec(ctx, `SELECT 1/0`); pgCode(err) != "22012" {
		t.Fatalf("1/0: %v", err)
	}
	mustExec(t, b, `COMMIT`)
	run([]check{{b, `SELECT v FROM who`, nil, "b"}})

	// Named prepared statements with the same name in both sessions, and
	// unnamed ones, run on whichever backend is free.
	if _, err := a.Prepare(ctx, "q", `SELECT 'a:' || $1::text`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(ctx, "q", `SELECT 'b:' || ($1::int * 2)::text`); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		if got := one(a, "q", "x"); got != "a:x" {
			t.Fatalf("a's q = %q", got)
		}
		if got := one(b, "q", 21); got != "b:42" {
			t.Fatalf("b's q = %q", got)
		}
		res := a.PgConn().ExecParams(ctx, `SELECT $1::text || 'u'`, [][]byte{[]byte("a")}, nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "au" {
			t.Fatalf("unnamed statement: %v %q", res.Err, res.Rows)
		}
	}

	// DISCARD ALL: settings back to the startup state, prepared statements gone.
	mustExec(t, a, `SET search_path = sb`)
	mustExec(t, a, `DISCARD ALL`)
	if got := one(a, `SHOW search_path`, pgx.QueryExecModeSimpleProtocol); got != `"$user", public` {
		t.Fatalf("search_path after DISCARD ALL = %q", got)
	}
	if got := one(a, `SELECT current_setting('application_name')`, pgx.QueryExecModeSimpleProtocol); got != "alpha" {
		t.Fatalf("application_name after DISCARD ALL = %q (the startup value stays)", got)
	}
	res := a.PgConn().ExecPrepared(ctx, "q", [][]byte{[]byte("x")}, nil, nil).Read()
	if code := pgCode(res.Err); code != "26000" {
		t.Fatalf("prepared statement after DISCARD ALL: %v (SQLSTATE %s), want 26000", res.Err, code)
	}
	if got := one(b, "q", 1); got != "b:2" {
		t.Fatalf("b's q after a's DISCARD ALL = %q", got)
	}
}

// TestSessionExtendedResponses: statements the proxy handles itself (SET,
// transaction control, LISTEN, DISCARD) answer each extended-protocol message
// exactly once, as PostgreSQL does; strict drivers (pgjdbc) fail otherwise.
func TestSessionExtendedResponses(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pc, err := pgconn.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	hj, err := pc.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	defer hj.Conn.Close()
	fe := pgproto3.NewFrontend(hj.Conn, hj.Conn)
	const ok = "ParseComplete BindComplete NoData CommandComplete ReadyForQuery"
	for _, tc := range []struct{ sql, want string }{
		{`SET application_name = 'x'`, ok},
		{`BEGIN`, ok},
		{`SELECT 1`, "ParseComplete BindComplete RowDescription DataRow CommandComplete ReadyForQuery"},
		{`SET search_path = public`, ok},
		{`COMMIT`, ok},
		{`LISTEN ch`, ok},
		{`UNLISTEN *`, ok},
		{`DISCARD ALL`, ok},
		{`RESET ALL`, ok},
	} {
		fe.SendParse(&pgproto3.Parse{Query: tc.sql})
		fe.SendBind(&pgproto3.Bind{})
		fe.SendDescribe(&pgproto3.Describe{ObjectType: 'P'})
		fe.SendExecute(&pgproto3.Execute{})
		fe.SendSync(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		_ = hj.Conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		var got []string
		for {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatalf("%s: %v after %v", tc.sql, err, got)
			}
			got = append(got, strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3."))
			if _, done := msg.(*pgproto3.ReadyForQuery); done {
				break
			}
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s: got %s, want %s", tc.sql, s, tc.want)
		}
	}
}
