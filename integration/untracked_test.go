package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// stateBody makes, inside a function, every kind of session state the
// router cannot see there: a setting, a temp table, a session advisory
// lock and a SQL-level prepared statement.
const stateBody = `PERFORM set_config('search_path', 'evil', false);
	CREATE TEMP TABLE hidden_tt (v int);
	PERFORM pg_advisory_lock(4242);
	EXECUTE 'PREPARE hidden_ps AS SELECT 1';`

// hiddenLeftovers is what a session finds of another's hidden state on
// its backend, "" when nothing. Every name is qualified: the search_path
// may be the one the function set.
const hiddenLeftovers = `SELECT pg_catalog.concat_ws(',',
	nullif(pg_catalog.current_setting('search_path'), '"$user", public'),
	pg_catalog.to_regclass('pg_temp.hidden_tt')::text,
	(SELECT 'lock' FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND objid = 4242 LIMIT 1),
	(SELECT 'prepared ' || name FROM pg_catalog.pg_prepared_statements WHERE from_sql LIMIT 1))`

// untrackedCount is lattice_proxy_untracked_state_total{action}, which
// has no series before the first finding.
func untrackedCount(t *testing.T, p *proxyProc, action string) float64 {
	t.Helper()
	fam := scrape(t, p)["lattice_proxy_untracked_state_total"]
	if fam == nil {
		return 0
	}
	sum, _ := familySum(fam, map[string]string{"action": action})
	return sum
}

// TestPinFunctionState: session state made inside a function, a DO block
// or a procedure pins the session to its catalog-node backend, as the
// same statements at top level do: the client still sees its temp table.
// With a pool of one backend the next client gets that very backend once
// the first leaves, with the default search_path, no temp table, no
// prepared statement, and the advisory lock free.
func TestPinFunctionState(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "1")
	ctx := context.Background()
	setup := connect(t, p.DSN("lattice"))
	mustExec(t, setup, `CREATE OR REPLACE FUNCTION make_state() RETURNS void LANGUAGE plpgsql AS $$ BEGIN `+stateBody+` END $$`)
	mustExec(t, setup, `CREATE OR REPLACE PROCEDURE make_state_proc() LANGUAGE plpgsql AS $$ BEGIN `+stateBody+` END $$`)
	setup.Close(ctx)

	for _, c := range []struct {
		name string
		sql  string
		mode pgx.QueryExecMode
	}{
		{"function, simple protocol", `SELECT make_state()`, pgx.QueryExecModeSimpleProtocol},
		{"function, extended protocol", `SELECT public.make_state()`, pgx.QueryExecModeCacheStatement},
		{"function in a transaction", `BEGIN; SELECT make_state(); COMMIT`, pgx.QueryExecModeSimpleProtocol},
		{"DO block", `DO $$ BEGIN ` + stateBody + ` END $$`, pgx.QueryExecModeSimpleProtocol},
		{"procedure", `CALL make_state_proc()`, pgx.QueryExecModeExec},
	} {
		t.Run(c.name, func(t *testing.T) {
			pinsBefore := untrackedCount(t, p, "pinned")
			a := connect(t, p.DSN("lattice"))
			pid := oneString(t, a, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol)
			if _, err := a.Exec(ctx, c.sql, c.mode); err != nil {
				t.Fatalf("%s: %v", c.sql, err)
			}
			// Errorf: the next client's view below is the point.
			if got := metricSum(t, p, "lattice_proxy_pinned_sessions", nil); got != 1 {
				t.Errorf("lattice_proxy_pinned_sessions = %v, want 1", got)
			}
			if got := untrackedCount(t, p, "pinned") - pinsBefore; got != 4 {
				t.Errorf("lattice_proxy_untracked_state_total{action=pinned} grew by %v, want 4 (temp_table, advisory_lock, prepare, set_config)", got)
			}
			if got := oneString(t, a, `SELECT pg_catalog.to_regclass('pg_temp.hidden_tt')::text`); got == "<null>" {
				t.Error("the pinned session does not see the temp table its function made")
			}
			if _, err := a.Exec(ctx, `INSERT INTO pg_temp.hidden_tt VALUES (1)`); err != nil {
				t.Errorf("the pinned session cannot use its temp table: %v", err)
			}
			a.Close(ctx)

			b := connect(t, p.DSN("lattice"))
			if got := oneString(t, b, `SELECT pg_backend_pid()::text`, pgx.QueryExecModeSimpleProtocol); got != pid {
				t.Fatalf("the next client got backend %s, not the first one's %s", got, pid)
			}
			if got := oneString(t, b, hiddenLeftovers); got != "" {
				t.Fatalf("the next client finds the last one's state: %s", got)
			}
			var locked bool
			if err := b.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(4242)`).Scan(&locked); err != nil || !locked {
				t.Fatalf("the next client cannot take the advisory lock: %v %v", locked, err)
			}
			wantPinned(t, p, 0)
			b.Close(ctx)
		})
	}
}

// TestPinFunctionStateTree: a function called in a statement on a tree
// leaves its state on a shard backend of another node, which is reset
// before it goes back to the pool: the next client, on that very backend
// (a pool of one), finds none of it, and its unqualified tree name still
// resolves. Nothing is pinned.
func TestPinFunctionStateTree(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--pool-size", "1")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	mustExec(t, a, `CREATE TABLE ft (k int PRIMARY KEY, v int)`)
	mustExec(t, a, `SELECT lattice_create_tree('ft', 'k', shard_count => 4)`)
	for k := 1; k <= 16; k++ {
		mustExec(t, a, `INSERT INTO ft VALUES ($1, $1)`, k)
	}
	// The function on every node, as an application that calls it in
	// statements on a tree defines it: the catalog node (through the
	// proxy), which also types the statement's parameters, and the second
	// node, where the statement runs.
	makeState := `CREATE OR REPLACE FUNCTION public.make_state_row() RETURNS int LANGUAGE plpgsql AS $$ BEGIN ` + stateBody + ` RETURN 1; END $$`
	mustExec(t, a, makeState)
	direct := connect(t, testNodeDSN(t, 1))
	mustExec(t, direct, makeState)
	port := oneString(t, direct, `SELECT inet_server_port()::text`)
	key := 0
	for k := 1; k <= 16 && key == 0; k++ {
		if oneString(t, a, `SELECT inet_server_port()::text FROM ft WHERE k = $1`, k) == port {
			key = k
		}
	}
	if key == 0 {
		t.Fatal("no key of ft on the second node")
	}
	pid := oneString(t, a, `SELECT pg_backend_pid()::text FROM ft WHERE k = $1`, key)

	resetsBefore := untrackedCount(t, p, "reset")
	var one int
	if err := a.QueryRow(ctx, `SELECT public.make_state_row() FROM ft WHERE k = $1`, key).Scan(&one); err != nil || one != 1 {
		t.Fatalf("function on the tree: %v %v", one, err)
	}
	wantPinned(t, p, 0)
	if got := untrackedCount(t, p, "reset") - resetsBefore; got != 4 {
		t.Errorf("lattice_proxy_untracked_state_total{action=reset} grew by %v, want 4", got)
	}

	b := connect(t, p.DSN("lattice"))
	if got := oneString(t, b, `SELECT pg_backend_pid()::text FROM ft WHERE k = $1`, key); got != pid {
		t.Fatalf("the next client got backend %s, not the first one's %s", got, pid)
	}
	if got := oneString(t, b, `SELECT current_setting('search_path') FROM ft WHERE k = $1`, key); got != `"$user", public` {
		t.Fatalf("the next client's search_path on the shard is %s", got)
	}
	if got := oneString(t, b, `SELECT to_regclass('pg_temp.hidden_tt')::text FROM ft WHERE k = $1`, key); got != "<null>" {
		t.Fatalf("the next client sees the last one's temp table %s", got)
	}
	var locked bool
	if err := direct.QueryRow(ctx, `SELECT pg_try_advisory_lock(4242)`).Scan(&locked); err != nil || !locked {
		t.Fatalf("the advisory lock the function took is still held on the node: %v %v", locked, err)
	}
}

// TestPinFunctionStateLimit: past --max-pinned, state a function made on
// the catalog-node backend cannot pin the session: the backend is reset
// before it is pooled again, and the client is told with a WARNING
// (53300), not left to find its temp table gone unannounced.
func TestPinFunctionStateLimit(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "2", "--max-pinned", "1")
	ctx := context.Background()
	pinned := connect(t, p.DSN("lattice"))
	mustExec(t, pinned, `CREATE OR REPLACE FUNCTION make_state() RETURNS void LANGUAGE plpgsql AS $$ BEGIN `+stateBody+` END $$`)
	mustExec(t, pinned, `CREATE TEMP TABLE takes_the_pin (v int)`)
	wantPinned(t, p, 1)

	cfg, err := pgx.ParseConfig(p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	var notices []*pgconn.Notice
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n) }
	a, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	resetsBefore := untrackedCount(t, p, "reset")
	if _, err := a.Exec(ctx, `SELECT make_state()`); err != nil {
		t.Fatal(err)
	}
	if len(notices) != 1 || notices[0].Code != "53300" || notices[0].Severity != "WARNING" || !strings.Contains(notices[0].Hint, "--max-pinned") {
		t.Fatalf("notices %+v, want one WARNING 53300 naming --max-pinned", notices)
	}
	wantPinned(t, p, 1)
	if got := untrackedCount(t, p, "reset") - resetsBefore; got != 4 {
		t.Errorf("lattice_proxy_untracked_state_total{action=reset} grew by %v, want 4", got)
	}
	if got := oneString(t, a, hiddenLeftovers); got != "" {
		t.Fatalf("the reset backend still holds: %s", got)
	}
}
