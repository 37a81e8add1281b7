package router

import (
	"strings"
	"testing"
)

func TestPins(t *testing.T) {
	cases := []struct {
		sql              string
		kind             Kind
		pin, unpin       Pin
		prepare, dealloc string
	}{
		{sql: `CREATE TEMP TABLE foo (a int)`, pin: PinTempTable},
		{sql: `CREATE TEMPORARY TABLE foo (a int) ON COMMIT DELETE ROWS`, pin: PinTempTable},
		{sql: `CREATE TEMP TABLE foo (a int) ON COMMIT PRESERVE ROWS`, pin: PinTempTable},
		{sql: `CREATE TEMP TABLE foo (a int) ON COMMIT DROP`},
		{sql: `CREATE TABLE pg_temp.foo (a int)`, pin: PinTempTable},
		{sql: `CREATE TABLE foo (a int)`},
		{sql: `CREATE TEMP TABLE foo AS SELECT 1 AS a`, pin: PinTempTable},
		{sql: `CREATE TEMP TABLE foo ON COMMIT DROP AS SELECT 1 AS a`},
		{sql: `SELECT 1 AS a INTO TEMP foo`, pin: PinTempTable},
		{sql: `SELECT 1 AS a INTO foo`},
		{sql: `CREATE TEMP VIEW v AS SELECT 1`, pin: PinTempTable},
		{sql: `CREATE TEMP SEQUENCE s`, pin: PinTempTable},
		{sql: `DISCARD TEMP`, unpin: PinTempTable},
		{sql: `DISCARD PLANS`},
		{sql: `DROP TABLE foo`},

		{sql: `SELECT pg_advisory_lock(1)`, pin: PinAdvisoryLock},
		{sql: `SELECT pg_try_advisory_lock(1, 2)`, pin: PinAdvisoryLock},
		{sql: `SELECT PG_ADVISORY_LOCK_SHARED(7)`, pin: PinAdvisoryLock},
		{sql: `SELECT pg_catalog.pg_try_advisory_lock_shared(7)`, pin: PinAdvisoryLock},
		{sql: `SELECT x FROM (SELECT pg_advisory_lock(1) AS x) s`, pin: PinAdvisoryLock},
		{sql: `SELECT pg_advisory_xact_lock(1)`},
		{sql: `SELECT pg_try_advisory_xact_lock(1)`},
		{sql: `SELECT pg_advisory_unlock(1)`},
		{sql: `SELECT pg_advisory_unlock_all()`, unpin: PinAdvisoryLock},
		{sql: `SELECT pg_advisory_unlock_all(), pg_advisory_lock(1)`, pin: PinAdvisoryLock},
		{sql: `EXPLAIN ANALYZE SELECT pg_advisory_lock(1)`, pin: PinAdvisoryLock},

		{sql: `PREPARE q AS SELECT 1`, pin: PinPrepare, prepare: "q"},
		{sql: `PREPARE "Q" (int) AS SELECT $1`, pin: PinPrepare, prepare: "Q"},
		{sql: `EXECUTE q`},
		{sql: `DEALLOCATE q`, dealloc: "q"},
		{sql: `DEALLOCATE PREPARE "Q"`, dealloc: "Q"},
		{sql: `DEALLOCATE ALL`, unpin: PinPrepare},
		{sql: `DEALLOCATE PREPARE ALL`, unpin: PinPrepare},

		{sql: `DECLARE c CURSOR WITH HOLD FOR SELECT 1`, pin: PinCursor},
		{sql: `DECLARE c CURSOR FOR SELECT 1`},
		{sql: `DECLARE c NO SCROLL CURSOR WITHOUT HOLD FOR SELECT 1`},
		{sql: `CLOSE c`},
		{sql: `CLOSE ALL`, unpin: PinCursor},

		{sql: `SELECT set_config('work_mem', 'x', false)`, pin: PinSetConfig},
		{sql: `SELECT set_config('work_mem', 'x', $1)`, pin: PinSetConfig},
		{sql: `SELECT set_config('work_mem', 'x', 'off')`, pin: PinSetConfig},
		{sql: `SELECT set_config('work_mem', 'x', true)`},
		{sql: `SELECT set_config('work_mem', 'x', 'on')`, pin: PinSetConfig},
		{sql: `SELECT set_config('search_path', 'x', false)`}, // replayed as a SET (setpath.go)
		{sql: `SELECT pg_catalog.set_config('search_path', '', false)`},
		{sql: `SELECT current_setting('search_path')`},

		// On a tree: refused, since the state would stay on a pooled shard backend.
		{sql: `SELECT pg_advisory_lock(id) FROM orders WHERE id = 1`, kind: Refused},
		{sql: `SELECT set_config('a.b', name, false) FROM orders WHERE id = 1`, kind: Refused},
		{sql: `SELECT * INTO TEMP t FROM orders WHERE id = 1`, kind: Refused},
		{sql: `SELECT pg_advisory_xact_lock(id) FROM orders WHERE id = 1`, kind: Single},
		{sql: `SELECT pg_advisory_unlock_all() FROM orders WHERE id = 1`, kind: Single},
		{sql: `PREPARE q AS SELECT * FROM orders WHERE id = 1`, kind: Refused},
		{sql: `DECLARE c CURSOR WITH HOLD FOR SELECT * FROM orders`, kind: Cursor}, // held by the proxy: no pin
	}
	for _, c := range cases {
		p := planOne(t, c.sql)
		if p.Kind != c.kind || p.Pin != c.pin || p.Unpin != c.unpin {
			t.Errorf("%s: %v pin=%v unpin=%v, want %v pin=%v unpin=%v", c.sql, p.Kind, p.Pin, p.Unpin, c.kind, c.pin, c.unpin)
		}
		if p.Prepare != c.prepare || p.Dealloc != c.dealloc || c.dealloc != "" && p.Anywhere {
			t.Errorf("%s: prepare %q dealloc %q anywhere %v, want %q and %q on the catalog node", c.sql, p.Prepare, p.Dealloc, p.Anywhere, c.prepare, c.dealloc)
		}
		if p.Pin|p.Unpin != 0 && p.Anywhere {
			t.Errorf("%s: a statement on session state must reach the catalog node, not follow a transaction elsewhere", c.sql)
		}
		if p.Kind == Refused && p.Err == nil {
			t.Errorf("%s: refused without an error", c.sql)
		}
	}
}

// TestPinsNotDerivedFromShape: a statement of a shape already planned must
// keep its pin; a shape template knows no pins, so none is made for them.
func TestPinsNotDerivedFromShape(t *testing.T) {
	pl := NewPlanner(100)
	for _, sql := range []string{`SELECT pg_advisory_lock(1)`, `SELECT pg_advisory_lock(2)`, `SELECT pg_advisory_lock(3)`} {
		plans, err := pl.Plan(sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if plans[0].Pin != PinAdvisoryLock {
			t.Fatalf("%s: pin=%v, want advisory_lock", sql, plans[0].Pin)
		}
	}
	for _, sql := range []string{`SELECT set_config('a.b', 'x', true)`, `SELECT set_config('a.b', 'y', 'on')`, `SELECT set_config('a.b', 'z', 'off')`} {
		plans, err := pl.Plan(sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := !strings.Contains(sql, "true"); (plans[0].Pin != 0) != want {
			t.Fatalf("%s: pin=%v", sql, plans[0].Pin)
		}
	}
}
