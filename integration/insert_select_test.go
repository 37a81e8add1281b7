package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestInsertSelectPulled: INSERT ... SELECT into a tree from a SELECT that
// reads no tree (a generate_series, an ordinary table, a reference table)
// runs its SELECT on the catalog node and loads the rows through the proxy,
// each on the shard of its key, all or none, in the client's transaction
// when there is one.
func TestInsertSelectPulled(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--max-message-memory", "1MB")
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE pulled (k bigint PRIMARY KEY, v text, n int DEFAULT 7)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('pulled', 'k', shard_count => %d)`, copyShards))
	mustExec(t, c, `CREATE TABLE staging (k bigint, v text)`)
	mustExec(t, c, `INSERT INTO staging SELECT g, 'staged ' || g FROM generate_series(1001, 1050) g`)
	mustExec(t, c, `CREATE TABLE kinds (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, `INSERT INTO kinds VALUES (2001, 'ref a'), (2002, 'ref b')`)
	mustExec(t, c, `SELECT lattice_create_reference_table('kinds')`)

	count := func(where string) int64 { t.Helper(); return countWhere(t, c, "pulled", where) }
	for _, tc := range []struct {
		sql  string
		args []any
		tag  string
	}{
		{sql: `INSERT INTO pulled (k, v) SELECT g, 'row ' || g FROM generate_series(1, 500) g`, tag: "INSERT 0 500"},
		{sql: `INSERT INTO pulled SELECT g, 'first two' FROM generate_series(501, 510) g`, tag: "INSERT 0 10"},
		{sql: `INSERT INTO pulled (k, v) SELECT k, v FROM staging`, tag: "INSERT 0 50"},
		{sql: `INSERT INTO pulled (k, v) SELECT k, v FROM kinds`, tag: "INSERT 0 2"},
		{sql: `WITH s AS (SELECT g FROM generate_series(601, 603) g) INSERT INTO pulled (k) SELECT g FROM s`, tag: "INSERT 0 3"},
		{sql: `INSERT INTO pulled (k, v) SELECT g, E'tab\tback\\slash\nline\r' FROM generate_series(701, 702) g`, tag: "INSERT 0 2"},
		{sql: `INSERT INTO pulled (k, v) SELECT g, NULL FROM generate_series(801, 802) g`, tag: "INSERT 0 2"},
		{sql: `INSERT INTO pulled (k, v) SELECT g, $1 FROM generate_series($2::int, $3) g`, args: []any{"bound", 901, 910}, tag: "INSERT 0 10"},
		{sql: `INSERT INTO pulled (k, v) SELECT g, 'none' FROM generate_series(1, 0) g`, tag: "INSERT 0 0"},
	} {
		tag, err := c.Exec(ctx, tc.sql, tc.args...)
		if err != nil || tag.String() != tc.tag {
			t.Fatalf("%s: %v, %v; want %s", tc.sql, tag, err, tc.tag)
		}
	}
	const total = 500 + 10 + 50 + 2 + 3 + 2 + 2 + 10
	if n := count("true"); n != total {
		t.Fatalf("%d rows in the tree, want %d", n, total)
	}
	if got := checkCopyPlacement(t, "pulled", "hashint8extended(k, 0)"); got != total {
		t.Fatalf("%d rows on the nodes, want %d", got, total)
	}
	for _, want := range []struct {
		k    int64
		v    *string
		n    int
		null bool
	}{
		{k: 7, v: ptr("row 7"), n: 7},
		{k: 505, v: ptr("first two"), n: 7},
		{k: 1033, v: ptr("staged 1033"), n: 7},
		{k: 2002, v: ptr("ref b"), n: 7},
		{k: 602, null: true, n: 7},
		{k: 701, v: ptr("tab\tback\\slash\nline\r"), n: 7},
		{k: 802, null: true, n: 7},
		{k: 905, v: ptr("bound"), n: 7},
	} {
		var v *string
		var n int
		if err := c.QueryRow(ctx, `SELECT v, n FROM pulled WHERE k = $1`, want.k).Scan(&v, &n); err != nil {
			t.Fatalf("k = %d: %v", want.k, err)
		}
		if want.null != (v == nil) || v != nil && *v != *want.v || n != want.n {
			t.Errorf("k = %d: got %q, %d; want %q, %d", want.k, deref(v), n, deref(want.v), want.n)
		}
	}

	// Errors leave the tree as it was, and the session usable.
	for _, tc := range []struct {
		sql, code string
	}{
		// 1 to 3 exist: the rows of every shard are rolled back.
		{`INSERT INTO pulled (k, v) SELECT g, 'again' FROM generate_series(3000, 3100) g UNION ALL SELECT 3, 'dup'`, "23505"},
		{`INSERT INTO pulled (k) SELECT NULL::bigint`, "23502"},
		{`INSERT INTO pulled (k, v) SELECT g FROM generate_series(3200, 3201) g`, "42601"},
		{`INSERT INTO pulled (k) SELECT g, 'x' FROM generate_series(3200, 3201) g`, "42601"},
		{`INSERT INTO pulled (k) SELECT g / 0 FROM generate_series(3200, 3201) g`, "22012"},
		{`INSERT INTO pulled (k) SELECT g FROM generate_series(3200, 3201) g RETURNING k`, "0A000"},
		// A key given twice, as PostgreSQL refuses it in one statement.
		{`INSERT INTO pulled (k, v) SELECT 1, 'twice' UNION ALL SELECT 1, 'twice' ON CONFLICT (k) DO UPDATE SET v = excluded.v`, "21000"},
		{`INSERT INTO pulled (k, v) SELECT g, 'x' FROM generate_series(1, 3) g ON CONFLICT (k) DO UPDATE SET k = excluded.k + 1`, "0A000"},
		// 40,000 rows of 100 bytes pass --max-message-memory 1MB: loaded
		// as they are read, they fit (below), but ON CONFLICT holds them.
		{`INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(10000, 50000) g ON CONFLICT DO NOTHING`, "53200"},
		// Errors after many batches were loaded roll every batch back.
		{`INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(10000, 50000) g UNION ALL SELECT 3, 'dup'`, "23505"},
		{`INSERT INTO pulled (k, v) SELECT CASE WHEN g < 49000 THEN g ELSE g / 0 END, repeat('x', 100) FROM generate_series(10000, 50000) g`, "22012"},
		// 5,600 such rows (600 kB) fit once, but ON CONFLICT holds them
		// twice (each shard's own statement): the plain load below passes.
		{`INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(20000, 25599) g ON CONFLICT DO NOTHING`, "53200"},
	} {
		_, err := c.Exec(ctx, tc.sql)
		if pgCode(err) != tc.code {
			t.Errorf("%s: got %v, want SQLSTATE %s", tc.sql, err, tc.code)
		}
		// The client sent no COPY: no context names the proxy's own.
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && strings.Contains(pe.Where, "COPY") {
			t.Errorf("%s: error context %q", tc.sql, pe.Where)
		}
	}
	if n := count("true"); n != total {
		t.Fatalf("%d rows in the tree after the failed inserts, want %d", n, total)
	}
	// Rows past --max-message-memory are loaded as they are read, in a
	// transaction of the proxy's own or in the client's.
	big := `INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(10000, 50000) g`
	if tag, err := c.Exec(ctx, big); err != nil || tag.String() != "INSERT 0 40001" {
		t.Fatalf("%s: %v, %v; want INSERT 0 40001", big, tag, err)
	}
	if n := count("k >= 10000 AND v = repeat('x', 100)"); n != 40001 {
		t.Fatalf("%d streamed rows in the tree, want 40001", n)
	}
	// Into itself, fetch after fetch on the backends that take the rows,
	// with rows wide enough (20 MB in all) that the shards' buffers are
	// sent to every node while the parts are read: the SELECT does not
	// see the rows the statement loads, on its own node or another.
	self := `INSERT INTO pulled (k, v) SELECT k + 1000000, repeat(v, 10) FROM pulled WHERE k >= 10000 AND k % 2 = 0`
	if tag, err := c.Exec(ctx, self); err != nil || tag.String() != "INSERT 0 20001" {
		t.Fatalf("%s: %v, %v; want INSERT 0 20001", self, tag, err)
	}
	if n := count("k >= 1000000"); n != 20001 {
		t.Fatalf("%d rows copied into the tree itself, want 20001", n)
	}
	mustExec(t, c, `DELETE FROM pulled WHERE k >= 10000`)
	func() {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if tag, err := tx.Exec(ctx, big); err != nil || tag.String() != "INSERT 0 40001" {
			t.Fatalf("%s in a transaction: %v, %v; want INSERT 0 40001", big, tag, err)
		}
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pulled WHERE k >= 10000`).Scan(&n); err != nil || n != 40001 {
			t.Fatalf("%d streamed rows seen in the transaction (%v), want 40001", n, err)
		}
	}()
	if n := count("true"); n != total {
		t.Fatalf("%d rows in the tree after a rolled back load, want %d", n, total)
	}

	// ON CONFLICT: each shard's rows are one INSERT with the clause, and
	// the tag counts what PostgreSQL counts (inserted or updated rows).
	for _, tc := range []struct{ sql, tag string }{
		// 1041 to 1050 exist: ten are skipped, ten are new.
		{`INSERT INTO pulled (k, v) SELECT g, 'new' FROM generate_series(1041, 1060) g ON CONFLICT DO NOTHING`, "INSERT 0 10"},
		{`INSERT INTO pulled AS p (k, v) SELECT k, 'it''s ' || k FROM staging ON CONFLICT (k) DO UPDATE SET v = excluded.v, n = p.n + 1`, "INSERT 0 50"},
	} {
		if tag, err := c.Exec(ctx, tc.sql); err != nil || tag.String() != tc.tag {
			t.Fatalf("%s: %v, %v; want %s", tc.sql, tag, err, tc.tag)
		}
	}
	var v string
	var n int
	if err := c.QueryRow(ctx, `SELECT v, n FROM pulled WHERE k = 1045`).Scan(&v, &n); err != nil || v != "it's 1045" || n != 8 {
		t.Fatalf("k = 1045 after the upserts: %q, %d, %v; want \"it's 1045\", 8", v, n, err)
	}
	if got := count("true"); got != total+10 {
		t.Fatalf("%d rows in the tree after the upserts, want %d", got, total+10)
	}

	// In a transaction the SELECT sees the transaction's own writes, and
	// the rows go when it rolls back.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExecTx := func(sql string) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	mustExecTx(`INSERT INTO staging VALUES (4001, 'uncommitted')`)
	v = ""
	mustExecTx(`INSERT INTO pulled (k, v) SELECT k, v FROM staging WHERE k = 4001`)
	if err := tx.QueryRow(ctx, `SELECT v FROM pulled WHERE k = 4001`).Scan(&v); err != nil || v != "uncommitted" {
		t.Fatalf("in the transaction: %q, %v", v, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count("k = 4001"); n != 0 {
		t.Fatalf("%d rows of the rolled-back INSERT ... SELECT", n)
	}
}

func ptr(s string) *string { return &s }

// countWhere counts the rows of table that match where, through c.
func countWhere(t *testing.T, c *pgx.Conn, table, where string) (n int64) {
	t.Helper()
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInsertSelectFromTree copies and re-keys rows between trees that are
// not colocated: the proxy reads the SELECT as it reads a client's (one
// shard, or every shard's rows) and loads the rows by the target's key.
// While the source splits and the target folds, every copy still takes
// each row once.
func TestInsertSelectFromTree(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--max-message-memory", "1MB")
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE src (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, `SELECT lattice_create_tree('src', 'k', shard_count => 4)`)
	mustExec(t, c, `INSERT INTO src SELECT g, 'v' || g FROM generate_series(1, 300) g`)
	mustExec(t, c, `CREATE TABLE dst (id text PRIMARY KEY, k bigint, v text, batch int)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('dst', 'id', shard_count => %d)`, copyShards))

	count := func(tree, where string) int64 { t.Helper(); return countWhere(t, c, tree, where) }
	for _, tc := range []struct {
		sql  string
		args []any
		tag  string
	}{
		// Every shard's rows, re-keyed by text.
		{sql: `INSERT INTO dst (id, k, v, batch) SELECT 'a-' || k, k, v, 1 FROM src`, tag: "INSERT 0 300"},
		// One shard's, by a bound key.
		{sql: `INSERT INTO dst (id, k, v, batch) SELECT 'b-' || k, k, v, 2 FROM src WHERE k = $1`, args: []any{7}, tag: "INSERT 0 1"},
		// A filter on every shard, and ORDER BY, which changes nothing.
		{sql: `INSERT INTO dst (id, k, v, batch) SELECT 'c-' || k, k, v, 3 FROM src WHERE k % 10 = 0 ORDER BY k`, tag: "INSERT 0 30"},
		// A WITH before INSERT, over the source tree.
		{sql: `WITH s AS (SELECT k, v FROM src WHERE k <= 5) INSERT INTO dst (id, k, v, batch) SELECT 'd-' || k, k, v, 4 FROM s`, tag: "INSERT 0 5"},
		// A tree into itself under new keys.
		{sql: `INSERT INTO src (k, v) SELECT k + 100000, 'moved ' || v FROM src WHERE k <= 50`, tag: "INSERT 0 50"},
		// ON CONFLICT: 300 'a-' ids exist.
		{sql: `INSERT INTO dst AS d (id, k, v, batch) SELECT 'a-' || k, k, 'again', 1 FROM src WHERE k <= 300 ON CONFLICT (id) DO UPDATE SET v = excluded.v`, tag: "INSERT 0 300"},
	} {
		tag, err := c.Exec(ctx, tc.sql, tc.args...)
		if err != nil || tag.String() != tc.tag {
			t.Fatalf("%s: %v, %v; want %s", tc.sql, tag, err, tc.tag)
		}
	}
	// The simple protocol, as psql sends it.
	res, err := c.PgConn().Exec(ctx, `INSERT INTO dst (id, k, v, batch) SELECT 'e-' || k, k, v, 5 FROM src WHERE k <= 10`).ReadAll()
	if err != nil || len(res) != 1 || res[0].CommandTag.String() != "INSERT 0 10" {
		t.Fatalf("in the simple protocol: %v, %v; want INSERT 0 10", res, err)
	}
	mustExec(t, c, `DELETE FROM dst WHERE batch = 5`)
	if n := count("dst", "true"); n != 336 {
		t.Fatalf("%d rows in dst, want 336", n)
	}
	if n := count("dst", "v = 'again'"); n != 300 {
		t.Fatalf("%d rows of dst upserted, want 300", n)
	}
	if n := count("src", "true"); n != 350 {
		t.Fatalf("%d rows in src, want 350", n)
	}
	if got := checkCopyPlacement(t, "dst", "hashtextextended(id, 0)"); got != 336 {
		t.Fatalf("%d rows of dst on the nodes, want 336", got)
	}
	var v string
	if err := c.QueryRow(ctx, `SELECT v FROM src WHERE k = 100042`).Scan(&v); err != nil || v != "moved v42" {
		t.Fatalf("k = 100042: %q, %v", v, err)
	}

	for node := 0; node < 3; node++ {
		mustExec(t, connect(t, testNodeDSN(t, node)), `CREATE OR REPLACE AGGREGATE my_sum(bigint) (sfunc = int8pl, stype = bigint, initcond = '0')`)
	}
	// Errors change nothing.
	for _, tc := range []struct{ sql, code string }{
		// 'b-7' exists: every shard's rows are rolled back.
		{`INSERT INTO dst (id, k) SELECT 'b-' || k, k FROM src`, "23505"},
		{`INSERT INTO dst (id, k) SELECT 'x-' || count(*), 0 FROM src`, "0A000"},
		{`INSERT INTO dst (id, k) SELECT 'x-' || k, k FROM src ORDER BY k LIMIT 3`, "0A000"},
		{`INSERT INTO dst (id, k) SELECT 'x-' || k, k FROM src RETURNING id`, "0A000"},
		{`INSERT INTO dst (id, k) SELECT 'x-' || string_agg(v, ','), 0 FROM src`, "0A000"},
		// A user-defined aggregate looks like any function to the router:
		// each node's part would give its own total (the aggregate is on
		// every node, above).
		{`INSERT INTO dst (id, k) SELECT 'x-' || my_sum(k), 0 FROM src`, "0A000"},
		{`INSERT INTO dst (id, k) SELECT 'x-' || k, k / 0 FROM src`, "22012"},
		// 20,000 rows of 100 bytes (loaded below in parts that fit) pass
		// --max-message-memory 1MB.
		{`INSERT INTO src (k, v) SELECT g, repeat('x', 100) FROM generate_series(200000, 204999) g`, ""},
		{`INSERT INTO src (k, v) SELECT g, repeat('x', 100) FROM generate_series(205000, 209999) g`, ""},
		{`INSERT INTO src (k, v) SELECT g, repeat('x', 100) FROM generate_series(210000, 214999) g`, ""},
		{`INSERT INTO src (k, v) SELECT g, repeat('x', 100) FROM generate_series(215000, 219999) g`, ""},
		{`INSERT INTO dst (id, v) SELECT 'big-' || k, v FROM src WHERE k >= 200000 ON CONFLICT DO NOTHING`, "53200"},
		// Loaded as they are read, they fit.
		{`INSERT INTO dst (id, v) SELECT 'big-' || k, v FROM src WHERE k >= 200000`, ""},
		{`DELETE FROM dst WHERE id LIKE 'big-%'`, ""},
	} {
		if _, err := c.Exec(ctx, tc.sql); pgCode(err) != tc.code {
			t.Errorf("%s: got %v, want SQLSTATE %q", tc.sql, err, tc.code)
		}
	}
	mustExec(t, c, `DELETE FROM src WHERE k >= 200000`)
	if n := count("dst", "true"); n != 336 {
		t.Fatalf("%d rows in dst after the failed inserts, want 336", n)
	}

	// In a transaction the SELECT sees the transaction's own writes, and
	// both go when it rolls back.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO src VALUES (5001, 'uncommitted')`); err != nil {
		t.Fatal(err)
	}
	if tag, err := tx.Exec(ctx, `INSERT INTO dst (id, k, v) SELECT 'tx-' || k, k, v FROM src WHERE k > 5000 AND k < 6000`); err != nil || tag.String() != "INSERT 0 1" {
		t.Fatalf("in the transaction: %v, %v", tag, err)
	}
	if err := tx.QueryRow(ctx, `SELECT v FROM dst WHERE id = 'tx-5001'`).Scan(&v); err != nil || v != "uncommitted" {
		t.Fatalf("in the transaction: %q, %v", v, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count("dst", "id = 'tx-5001'"); n != 0 {
		t.Fatalf("%d rows of the rolled-back INSERT ... SELECT", n)
	}

	// While src splits from 4 to 8 shards and dst folds from 16 to 8,
	// copy src whole into dst again and again: each copy must read each of
	// src's 350 rows once, whichever of a moving slot's shards holds it at
	// the time, and load it once, whichever of dst's shards owns it then.
	mustExec(t, c, `SELECT lattice_reshard('src', 8)`)
	mustExec(t, c, `SELECT lattice_reshard('dst', 8)`)
	poll := connect(t, p.DSN("lattice"))
	done := make(chan error, 1)
	go func() {
		defer close(done)
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			var complete bool
			if err := poll.QueryRow(ctx, "SELECT lattice_reshard_complete('src') AND lattice_reshard_complete('dst')").Scan(&complete); err != nil || complete {
				done <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- fmt.Errorf("the reshards of src and dst did not complete in 3 minutes")
	}()
	batches := 0
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished = true
		default:
		}
		batches++
		b := 100 + batches
		tag, err := c.Exec(ctx, `INSERT INTO dst (id, k, v, batch) SELECT $1::text || '-' || k, k, v, $2 FROM src`, strconv.Itoa(b), b)
		if err != nil || tag.String() != "INSERT 0 350" {
			t.Fatalf("copy %d during the reshards: %v, %v; want INSERT 0 350", batches, tag, err)
		}
		var n, distinct int64
		if err := c.QueryRow(ctx, `SELECT count(*), count(DISTINCT k) FROM dst WHERE batch = $1`, b).Scan(&n, &distinct); err != nil || n != 350 || distinct != 350 {
			t.Fatalf("copy %d during the reshards: %d rows, %d keys, %v; want 350 of each", batches, n, distinct, err)
		}
	}
	if n := count("dst", "batch > 100"); n != int64(350*batches) {
		t.Fatalf("%d copied rows in dst after the reshards, want %d", n, 350*batches)
	}
	t.Logf("%d whole copies of src during the reshards", batches)
}
