package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
)

// copyShape is a node's copy of public.table: its columns, its indexes and
// its rows, as text.
func copyShape(t *testing.T, ctx context.Context, c *pgx.Conn, table string) string {
	t.Helper()
	var cols, idx, rows string
	if err := c.QueryRow(ctx, `SELECT
		(SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute
			WHERE attrelid = to_regclass('public.' || $1) AND attnum > 0 AND NOT attisdropped),
		(SELECT coalesce(string_agg(indexname, ',' ORDER BY indexname), '') FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1)`,
		table).Scan(&cols, &idx); err != nil {
		t.Fatalf("read the shape of %s: %v", table, err)
	}
	if err := c.QueryRow(ctx, `SELECT coalesce(string_agg(r::text, ',' ORDER BY r::text), '') FROM public.`+table+` r`).Scan(&rows); err != nil {
		t.Fatalf("read the rows of %s: %v", table, err)
	}
	return cols + " | " + idx + " | " + rows
}

// sameShapes fails unless every node's copy of table has the same shape,
// and returns it.
func sameShapes(t *testing.T, ctx context.Context, nodes []*pgx.Conn, table string) string {
	t.Helper()
	want := copyShape(t, ctx, nodes[0], table)
	for i, n := range nodes[1:] {
		if got := copyShape(t, ctx, n, table); got != want {
			t.Fatalf("node n%d's copy of %s differs from the catalog node's:\n got %.400s\nwant %.400s", i+2, table, got, want)
		}
	}
	return want
}

// waitLockWait waits until a session on c's node waits for a lock in a
// statement whose text is like pattern.
func waitLockWait(t *testing.T, ctx context.Context, c *pgx.Conn, pattern string) {
	t.Helper()
	pollUntil(t, time.Minute, "a session waiting for a lock in "+pattern, func() (waiting bool, err error) {
		err = c.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&waiting)
		return waiting, err
	})
}

// TestReferenceDDLUnawareProxy sends DDL, TRUNCATE and writes of a
// reference table through a proxy that does not know it is one (proxy B
// has a Redis of its own, so it never reads the registry: a proxy that has
// not read it again yet, held there): each runs on the catalog copy alone
// and must be refused there (LT001) by the fence or the DDL guard, leaving
// every copy alike. It races DDL through B with
// lattice_create_reference_table through A both ways, and turns the table
// back into an ordinary table, which both proxies may then change.
func TestReferenceDDLUnawareProxy(t *testing.T) {
	resetNodes(t)
	a := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := localnode.StartRedis(ctx, filepath.Join(t.TempDir(), "redis"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Stop() })
	b := startProxyOn(t, rs.URL(), []string{testNodeDSN(t, 0), testNodeDSN(t, 1), testNodeDSN(t, 2)}, nil)
	ca, cb := connect(t, a.DSN("lattice")), connect(t, b.DSN("lattice"))
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1)), connect(t, testNodeDSN(t, 2))}
	for _, tbl := range []string{"plans", "plans2", "plans3"} {
		mustExec(t, ca, `CREATE TABLE `+tbl+` (plan_id int PRIMARY KEY, name text NOT NULL, price numeric(7,2) NOT NULL)`)
		mustExec(t, ca, `INSERT INTO `+tbl+` SELECT i, 'plan-' || i, i * 10 FROM generate_series(1, 5) i`)
	}
	mustExec(t, ca, `SELECT lattice_create_reference_table('plans')`)
	mustExec(t, ca, `CREATE INDEX plans_price ON plans (price)`)
	held := sameShapes(t, ctx, nodes, "plans")
	if !strings.Contains(held, "plans_price") {
		t.Fatalf("the index made through A is missing: %s", held)
	}

	// Through B every change reaches the catalog copy only, and is refused.
	for _, sql := range []string{
		`ALTER TABLE plans ADD COLUMN tier int`,
		`ALTER TABLE plans RENAME COLUMN name TO title`,
		`CREATE INDEX plans_name ON plans (name)`,
		`ALTER INDEX plans_price RENAME TO plans_by_price`,
		`DROP INDEX plans_price`,
		`TRUNCATE plans`,
		`INSERT INTO plans VALUES (100, 'b', 1)`,
		`UPDATE plans SET price = 0`,
		`DROP TABLE plans`,
	} {
		for name, mode := range map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol} {
			if _, err := cb.Exec(ctx, sql, mode); pgCode(err) != "LT001" {
				t.Errorf("%s through a proxy that does not know plans is a reference table (%s): %v, want LT001", sql, name, err)
			}
		}
	}
	// DDL the proxy cannot see (in a function body) is refused through A too.
	if _, err := ca.Exec(ctx, `DO $$ BEGIN EXECUTE 'ALTER TABLE plans ADD COLUMN hidden int'; END $$`); pgCode(err) != "LT001" {
		t.Errorf("DDL of the reference table in a DO block: %v, want LT001", err)
	}
	if got := sameShapes(t, ctx, nodes, "plans"); got != held {
		t.Fatalf("refused statements changed the copies:\n got %.400s\nwant %.400s", got, held)
	}
	// Through A, which names the copies, DDL and TRUNCATE go on everywhere.
	mustExec(t, ca, `ALTER TABLE plans ADD COLUMN tier int NOT NULL DEFAULT 1`)
	mustExec(t, ca, `CREATE INDEX plans_name ON plans (name)`)
	if got := sameShapes(t, ctx, nodes, "plans"); !strings.Contains(got, "tier integer") || !strings.Contains(got, "plans_name") {
		t.Fatalf("DDL through A: %s", got)
	}

	// DDL through B that locked the table before lattice_create_reference_table
	// did: the creation waits for it and copies what it left.
	tx, err := cb.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE plans2 ADD COLUMN extra int NOT NULL DEFAULT 7`); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() {
		_, err := ca.Exec(ctx, `SELECT lattice_create_reference_table('plans2')`)
		created <- err
	}()
	waitLockWait(t, ctx, nodes[0], `LOCK TABLE %plans2%`)
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("DDL through B before the table became a reference table: %v", err)
	}
	if err := <-created; err != nil {
		t.Fatalf("lattice_create_reference_table after DDL through B: %v", err)
	}
	if got := sameShapes(t, ctx, nodes, "plans2"); !strings.Contains(got, "extra integer") || !strings.Contains(got, ",7)") {
		t.Fatalf("the copies of plans2 lack the column added before: %s", got)
	}

	// DDL through B that waits for lattice_create_reference_table's lock
	// (queued behind it while a third session holds the table) runs after
	// the table became a reference table, and is refused.
	holder, err := connect(t, testNodeDSN(t, 0)).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `LOCK TABLE plans3 IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := ca.Exec(ctx, `SELECT lattice_create_reference_table('plans3')`)
		created <- err
	}()
	watch := connect(t, testNodeDSN(t, 0))
	waitLockWait(t, ctx, watch, `LOCK TABLE %plans3%`)
	altered := make(chan error, 1)
	go func() {
		_, err := cb.Exec(ctx, `ALTER TABLE plans3 ADD COLUMN extra int`)
		altered <- err
	}()
	waitLockWait(t, ctx, watch, `ALTER TABLE plans3%`)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatalf("lattice_create_reference_table of plans3: %v", err)
	}
	if err := <-altered; pgCode(err) != "LT001" {
		t.Fatalf("DDL through B queued behind lattice_create_reference_table: %v, want LT001", err)
	}
	if got := sameShapes(t, ctx, nodes, "plans3"); strings.Contains(got, "extra") {
		t.Fatalf("the refused column is on the copies: %s", got)
	}

	// Back to an ordinary table: the guard lets both proxies change it.
	mustExec(t, ca, `SELECT lattice_undistribute_table('plans')`)
	mustExec(t, cb, `ALTER TABLE plans ADD COLUMN after_b int`)
	mustExec(t, ca, `CREATE INDEX plans_after ON plans (after_b)`)
	mustExec(t, cb, `TRUNCATE plans`)
	if got := copyShape(t, ctx, nodes[0], "plans"); !strings.Contains(got, "after_b integer") || !strings.Contains(got, "plans_after") {
		t.Fatalf("the ordinary table after DDL through both proxies: %s", got)
	}
	for i, n := range nodes[1:] {
		var exists bool
		if err := n.QueryRow(ctx, `SELECT to_regclass('public.plans') IS NOT NULL`).Scan(&exists); err != nil || exists {
			t.Fatalf("n%d still has a copy of plans (%v)", i+2, err)
		}
	}
}
