package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// step runs sql alone (simple protocol, or extended with no parameters)
// and describes what the client saw: each result's tag and values, or the
// error's SQLSTATE, then the transaction status of the ReadyForQuery.
func step(t *testing.T, c *pgconn.PgConn, sql string, extended bool) string {
	t.Helper()
	ctx := context.Background()
	var out []string
	add := func(r *pgconn.Result) {
		if r.Err != nil {
			out = append(out, "ERROR "+sqlStateOf(r.Err))
			return
		}
		var vals []string
		for _, row := range r.Rows {
			for _, v := range row {
				vals = append(vals, string(v))
			}
		}
		out = append(out, strings.TrimSpace(r.CommandTag.String()+" "+strings.Join(vals, ",")))
	}
	if extended {
		r := c.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
		add(r)
	} else {
		rs, err := c.Exec(ctx, sql).ReadAll()
		for _, r := range rs {
			add(r)
		}
		if err != nil && (len(rs) == 0 || rs[len(rs)-1].Err == nil) {
			out = append(out, "ERROR "+sqlStateOf(err))
		}
	}
	return strings.Join(out, "; ") + " [" + string(c.TxStatus()) + "]"
}

// TestTransactionChain: COMMIT AND CHAIN and ROLLBACK AND CHAIN through the
// proxy give what PostgreSQL itself gives, statement by statement, in both
// protocols: tags, errors, the transaction status, what is committed, and
// the characteristics (isolation, read only, SET TRANSACTION) and SET
// rollbacks of the chained transaction.
func TestTransactionChain(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	script := []string{
		`CREATE TABLE %[1]s (v int)`,
		`BEGIN ISOLATION LEVEL REPEATABLE READ`,
		`INSERT INTO %[1]s VALUES (1)`,
		`COMMIT AND CHAIN`,
		`SHOW transaction_isolation`,
		`INSERT INTO %[1]s VALUES (2)`,
		`ROLLBACK AND CHAIN`,
		`SHOW transaction_isolation`,
		`INSERT INTO %[1]s VALUES (3)`,
		`COMMIT`,
		`SELECT string_agg(v::text, '/' ORDER BY v) FROM %[1]s`,
		`SHOW transaction_isolation`,
		`BEGIN READ ONLY`,
		`SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`,
		`COMMIT AND CHAIN`,
		`SHOW transaction_isolation`,
		`SHOW transaction_read_only`,
		`ROLLBACK`,
		`BEGIN`,
		`SELECT 1/0`,
		`SELECT 1`,
		`COMMIT AND CHAIN`,
		`SELECT 2`,
		`COMMIT`,
		`COMMIT AND CHAIN`,
		`ROLLBACK AND CHAIN`,
		`BEGIN ISOLATION LEVEL SERIALIZABLE`,
		`COMMIT AND CHAIN`,
		`SHOW transaction_isolation`,
		`ROLLBACK AND CHAIN`,
		`SHOW transaction_isolation`,
		`COMMIT`,
		`BEGIN`,
		`SET statement_timeout = '7s'`,
		`ROLLBACK AND CHAIN`,
		`SHOW statement_timeout`,
		`SET statement_timeout = '8s'`,
		`COMMIT AND CHAIN`,
		`ROLLBACK`,
		`SHOW statement_timeout`,
		`RESET statement_timeout`,
		`SHOW statement_timeout`,
		`BEGIN`,
		`SELECT 1; COMMIT AND CHAIN; SELECT 2`,
		`SHOW transaction_isolation`,
		`COMMIT`,
		`SELECT 1; COMMIT AND CHAIN`,
	}
	for _, extended := range []bool{false, true} {
		name := fmt.Sprintf("chain_%v", extended)
		direct := connect(t, testNodeDSN(t, 0)).PgConn()
		proxied := connect(t, p.DSN("lattice")).PgConn()
		for _, sql := range script {
			if extended && strings.Count(sql, ";") > 0 {
				continue // one statement per Parse
			}
			want := step(t, direct, strings.ReplaceAll(sql, "%[1]s", name+"_d"), extended)
			got := step(t, proxied, strings.ReplaceAll(sql, "%[1]s", name+"_p"), extended)
			if got != want {
				t.Fatalf("extended=%v %s:\nproxy:      %s\nPostgreSQL: %s", extended, sql, got, want)
			}
		}
	}

	// A transaction over both nodes: COMMIT AND CHAIN commits it with
	// two-phase commit and starts the new one on both at once, with the
	// same isolation; ROLLBACK AND CHAIN rolls back on both and goes on.
	c := connect(t, p.DSN("lattice")).PgConn()
	for _, sql := range []string{
		`CREATE TABLE ct (k int PRIMARY KEY, v int)`,
		`SELECT lattice_create_tree('ct', 'k', shard_count => 4)`,
	} {
		if got := step(t, c, sql, false); strings.HasPrefix(got, "ERROR") {
			t.Fatalf("%s: %s", sql, got)
		}
	}
	rows := func(from int) string {
		var v []string
		for k := from; k < from+8; k++ {
			v = append(v, fmt.Sprintf("(%d, %d)", k, k))
		}
		return `INSERT INTO ct VALUES ` + strings.Join(v, ", ")
	}
	isolation := `SELECT string_agg(current_setting('transaction_isolation'), '/') FROM ct WHERE k = %d`
	for _, extended := range []bool{false, true} {
		for _, ck := range []struct{ sql, want string }{
			{`DELETE FROM ct`, ""},
			{`BEGIN ISOLATION LEVEL REPEATABLE READ`, "BEGIN [T]"},
			{rows(1), "INSERT 0 8 [T]"},
			{`COMMIT AND CHAIN`, "COMMIT [T]"},
			{fmt.Sprintf(isolation, 1), "SELECT 1 repeatable read [T]"},
			{fmt.Sprintf(isolation, 2), "SELECT 1 repeatable read [T]"},
			{fmt.Sprintf(isolation, 3), "SELECT 1 repeatable read [T]"},
			{fmt.Sprintf(isolation, 4), "SELECT 1 repeatable read [T]"},
			{rows(11), "INSERT 0 8 [T]"},
			{`ROLLBACK AND CHAIN`, "ROLLBACK [T]"},
			{fmt.Sprintf(isolation, 5), "SELECT 1 repeatable read [T]"},
			{rows(21), "INSERT 0 8 [T]"},
			{`COMMIT`, "COMMIT [I]"},
			{`SELECT count(*), sum(k) FROM ct`, fmt.Sprintf("SELECT 1 16,%d [I]", 36+(36+8*20))},
		} {
			got := step(t, c, ck.sql, extended)
			if ck.want != "" && got != ck.want {
				t.Fatalf("extended=%v %s: %s, want %s", extended, ck.sql, got, ck.want)
			}
			if ck.sql == `COMMIT AND CHAIN` {
				// The new transaction is open on both nodes at once.
				for i := 0; i < 2; i++ {
					var n int
					if err := connect(t, testNodeDSN(t, i)).QueryRow(context.Background(),
						`SELECT count(*) FROM pg_stat_activity WHERE datname = 'lattice' AND state = 'idle in transaction'`).Scan(&n); err != nil || n != 1 {
						t.Fatalf("after COMMIT AND CHAIN node %d has %d backends in a transaction (%v), want 1", i, n, err)
					}
				}
			}
		}
	}
}

// TestMixedSetQuery: a query string that mixes SET or RESET with other
// statements runs as PostgreSQL runs it, implicit transaction included: a
// SET is kept only when the whole string succeeded, and one inside a
// transaction block is undone by its rollback. The settings then follow
// the session across pooled backends (two clients share two backends).
func TestMixedSetQuery(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "2")
	script := []string{
		`SET statement_timeout = '5s'; SELECT 1`,
		`SHOW statement_timeout`,
		`SELECT 1; SET statement_timeout = '6s'`,
		`SHOW statement_timeout`,
		`SET statement_timeout = '7s'; SELECT 1/0`,
		`SHOW statement_timeout`,
		`SELECT 1/0; SET statement_timeout = '7s'`,
		`SHOW statement_timeout`,
		`BEGIN; SET statement_timeout = '8s'; SELECT 1`,
		`SHOW statement_timeout`,
		`ROLLBACK`,
		`SHOW statement_timeout`,
		`SET statement_timeout = '9s'; BEGIN; SELECT 2`,
		`SHOW statement_timeout`,
		`COMMIT`,
		`SHOW statement_timeout`,
		`SET search_path TO pg_catalog, public; SELECT current_schemas(false)`,
		`SHOW search_path`,
		`SET application_name = 'mixed'; SET lock_timeout = '3s'; SHOW lock_timeout`,
		`SHOW application_name`,
		`RESET ALL; SELECT 2`,
		`SHOW statement_timeout`,
		`SHOW application_name`,
	}
	direct := connect(t, testNodeDSN(t, 0)).PgConn()
	a := connect(t, p.DSN("lattice")).PgConn()
	b := connect(t, p.DSN("lattice")).PgConn()
	for _, sql := range script {
		want := step(t, direct, sql, false)
		got := step(t, a, sql, false)
		if got != want {
			t.Fatalf("%s:\nproxy:      %s\nPostgreSQL: %s", sql, got, want)
		}
		// The other client, on whichever backend is free, keeps its own.
		if got := step(t, b, `SHOW statement_timeout`, false); got != "SHOW 0 [I]" {
			t.Fatalf("after %s the other client sees statement_timeout %s", sql, got)
		}
	}
	for _, sql := range []string{
		`SET statement_timeout = '4s'; SELECT 1`,
		`SELECT 1; SET statement_timeout = '5s'`,
	} {
		step(t, a, sql, false)
		step(t, direct, sql, false)
	}
	for i := 0; i < 6; i++ {
		for _, c := range []*pgconn.PgConn{a, b} {
			step(t, c, `SELECT pg_sleep(0)`, i%2 == 0)
		}
		if got := step(t, a, `SHOW statement_timeout`, i%2 == 1); got != "SHOW 5s [I]" {
			t.Fatalf("round %d: the session's SET did not follow it: %s", i, got)
		}
	}

	// Which SETs survive a string with COMMIT or ROLLBACK depends on where
	// an error stops it: refused rather than followed wrongly.
	if got := step(t, a, `SET statement_timeout = '1s'; COMMIT`, false); got != "ERROR 0A000 [I]" {
		t.Fatalf("SET with COMMIT in one string: %s, want 0A000", got)
	}
	if got := step(t, a, `SHOW statement_timeout`, false); got != "SHOW 5s [I]" {
		t.Fatalf("after the refused string: %s", got)
	}
}
