package integration

import (
	"context"
	"fmt"
	"testing"
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

	count := func(where string) (n int64) {
		t.Helper()
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pulled WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
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
		{`INSERT INTO pulled (k, v) SELECT g, 'x' FROM generate_series(1, 3) g ON CONFLICT (k) DO UPDATE SET k = excluded.k`, "0A000"},
		// 40,000 rows of 100 bytes pass --max-message-memory 1MB.
		{`INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(10000, 50000) g`, "53200"},
		// 5,600 such rows (600 kB) fit once, but ON CONFLICT holds them
		// twice (each shard's own statement): the plain load below passes.
		{`INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(20000, 25599) g ON CONFLICT DO NOTHING`, "53200"},
	} {
		if _, err := c.Exec(ctx, tc.sql); pgCode(err) != tc.code {
			t.Errorf("%s: got %v, want SQLSTATE %s", tc.sql, err, tc.code)
		}
	}
	if n := count("true"); n != total {
		t.Fatalf("%d rows in the tree after the failed inserts, want %d", n, total)
	}
	func() {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if tag, err := tx.Exec(ctx, `INSERT INTO pulled (k, v) SELECT g, repeat('x', 100) FROM generate_series(20000, 25599) g`); err != nil || tag.String() != "INSERT 0 5600" {
			t.Fatalf("the rows held once: %v, %v; want INSERT 0 5600", tag, err)
		}
	}()

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
