package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// runner runs one statement with literal values through the proxy, with
// the simple or the extended query protocol, and returns its command tag,
// its rows as text, and the error.
type runner func(t *testing.T, sql string) (string, [][]string, error)

func simpleRunner(c *pgx.Conn) runner {
	return func(t *testing.T, sql string) (string, [][]string, error) {
		t.Helper()
		res, err := c.PgConn().Exec(context.Background(), sql).ReadAll()
		if err != nil {
			return "", nil, err
		}
		last := res[len(res)-1]
		return last.CommandTag.String(), textRows(last.Rows), last.Err
	}
}

func extendedRunner(c *pgx.Conn) runner {
	return func(t *testing.T, sql string) (string, [][]string, error) {
		t.Helper()
		r := c.PgConn().ExecParams(context.Background(), sql, nil, nil, nil, nil).Read()
		return r.CommandTag.String(), textRows(r.Rows), r.Err
	}
}

func textRows(rows [][][]byte) [][]string {
	var out [][]string
	for _, r := range rows {
		var row []string
		for _, v := range r {
			row = append(row, string(v))
		}
		out = append(out, row)
	}
	return out
}

// nodeRows reads tree's rows (id -> bal) straight from the shard tables on
// harness node i, bypassing the proxy.
func nodeRows(t *testing.T, i int, tree string) map[int64]int64 {
	t.Helper()
	return tenantRows(t, i, "lattice", tree)
}

// tenantRows is nodeRows in the tenant database db.
func tenantRows(t *testing.T, i int, db, tree string) map[int64]int64 {
	t.Helper()
	ctx := context.Background()
	c := connect(t, testNode(t, i).DSN(db))
	defer c.Close(ctx)
	schemas, err := queryStrings(t, c, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND n.nspname LIKE 'lattice\_s%' ORDER BY 1`, tree)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int64{}
	for _, s := range schemas {
		rows, err := c.Query(ctx, fmt.Sprintf(`SELECT id, bal FROM %s.%s`, s, tree))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, bal int64
			if err := rows.Scan(&id, &bal); err != nil {
				t.Fatal(err)
			}
			out[id] = bal
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// allRows merges nodeRows over the first n harness nodes.
func allRows(t *testing.T, n int, tree string) map[int64]int64 {
	out := map[int64]int64{}
	for i := 0; i < n; i++ {
		maps.Copy(out, nodeRows(t, i, tree))
	}
	return out
}

// latticePrepared lists the prepared transactions with a Lattice gid on the
// first n harness nodes.
func latticePrepared(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := 0; i < n; i++ {
		c := connect(t, testNodeDSN(t, i))
		gids, err := queryStrings(t, c, `SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'lattice\_%'`)
		c.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, gids...)
	}
	return out
}

// placeKeys creates tree acct (6 shards over 3 nodes) through c and
// returns, per harness node, the ids 1..60 that live there.
func placeKeys(t *testing.T, c *pgx.Conn, tree string) [3][]int64 {
	t.Helper()
	return placeKeysIn(t, c, "lattice", tree)
}

// placeKeysIn is placeKeys for c connected to tenant database db.
func placeKeysIn(t *testing.T, c *pgx.Conn, db, tree string) [3][]int64 {
	t.Helper()
	mustExec(t, c, `CREATE TABLE `+tree+` (id bigint PRIMARY KEY, bal bigint NOT NULL CHECK (bal >= 0), note text)`)
	mustExec(t, c, `SELECT lattice_create_tree('`+tree+`', 'id', shard_count => 6)`)
	for id := 1; id <= 60; id++ {
		mustExec(t, c, fmt.Sprintf(`INSERT INTO %s (id, bal) VALUES (%d, 0)`, tree, id))
	}
	var by [3][]int64
	for i := range by {
		by[i] = slices.Sorted(maps.Keys(tenantRows(t, i, db, tree)))
		if len(by[i]) < 4 {
			t.Fatalf("node %d holds ids %v of %s: the test needs at least 4 on every node", i, by[i], tree)
		}
	}
	// One DELETE per key: a crash-hooked proxy must not run a two-phase
	// commit yet.
	for id := 1; id <= 60; id++ {
		mustExec(t, c, fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, tree, id))
	}
	return by
}

// TestTransaction runs transactions across nodes, UPDATE and DELETE without
// the shard key, and multi-row INSERTs over several nodes through the proxy
// with both protocols, and checks the rows directly on the nodes.
func TestTransaction(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	by := placeKeys(t, c, "acct")
	if n := len(allRows(t, 3, "acct")); n != 0 {
		t.Fatalf("%d rows left after the keyless DELETE", n)
	}
	a, a2, b, cc := by[0][0], by[0][1], by[1][0], by[2][0]

	for _, mode := range []struct {
		name string
		run  runner
	}{{"simple", simpleRunner(c)}, {"extended", extendedRunner(c)}} {
		run := func(t *testing.T, sql string) (string, [][]string) {
			t.Helper()
			tag, rows, err := mode.run(t, sql)
			if err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
			return tag, rows
		}
		fails := func(t *testing.T, sql, code string) {
			t.Helper()
			if _, _, err := mode.run(t, sql); pgCode(err) != code {
				t.Fatalf("%s: error %v, want SQLSTATE %s", sql, err, code)
			}
		}
		want := func(t *testing.T, rows map[int64]int64) {
			t.Helper()
			if got := allRows(t, 3, "acct"); !maps.Equal(got, rows) {
				t.Fatalf("rows on the nodes %v, want %v", got, rows)
			}
			if gids := latticePrepared(t, 3); len(gids) > 0 {
				t.Fatalf("prepared transactions left behind: %v", gids)
			}
		}
		clean := func(t *testing.T) {
			t.Helper()
			run(t, `DELETE FROM acct`)
			want(t, map[int64]int64{})
		}
		ins := func(id, bal int64) string {
			return fmt.Sprintf(`INSERT INTO acct (id, bal) VALUES (%d, %d)`, id, bal)
		}

		t.Run(mode.name+"/commit", func(t *testing.T) {
			clean(t)
			run(t, `BEGIN`)
			run(t, ins(a, 1))
			run(t, ins(b, 2))
			run(t, ins(cc, 3))
			if tag, _ := run(t, `COMMIT`); tag != "COMMIT" {
				t.Fatalf("COMMIT tag %q", tag)
			}
			want(t, map[int64]int64{a: 1, b: 2, cc: 3})
		})
		t.Run(mode.name+"/rollback", func(t *testing.T) {
			clean(t)
			run(t, `BEGIN`)
			run(t, ins(a, 1))
			run(t, ins(b, 2))
			run(t, `ROLLBACK`)
			want(t, map[int64]int64{})
		})
		t.Run(mode.name+"/error rolls back every node", func(t *testing.T) {
			clean(t)
			run(t, ins(b, 9))
			run(t, `BEGIN`)
			run(t, ins(a, 1))
			fails(t, ins(b, 2), "23505")
			fails(t, ins(cc, 3), "25P02")
			if tag, _ := run(t, `COMMIT`); tag != "ROLLBACK" {
				t.Fatalf("COMMIT of a failed transaction: tag %q, want ROLLBACK", tag)
			}
			want(t, map[int64]int64{b: 9})
		})
		t.Run(mode.name+"/isolation and read only", func(t *testing.T) {
			clean(t)
			run(t, ins(a, 1))
			run(t, ins(b, 2))
			run(t, `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
			for _, id := range []int64{a, b} {
				_, rows := run(t, fmt.Sprintf(`SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only') FROM acct WHERE id = %d`, id))
				if len(rows) != 1 || rows[0][0] != "repeatable read" || rows[0][1] != "on" {
					t.Fatalf("id %d: transaction settings %v, want repeatable read, read only", id, rows)
				}
			}
			fails(t, fmt.Sprintf(`UPDATE acct SET bal = 5 WHERE id = %d`, cc), "25006")
			run(t, `ROLLBACK`)
			run(t, `BEGIN ISOLATION LEVEL SERIALIZABLE`)
			_, rows := run(t, fmt.Sprintf(`SELECT current_setting('transaction_isolation') FROM acct WHERE id = %d`, b))
			if len(rows) != 1 || rows[0][0] != "serializable" {
				t.Fatalf("isolation %v, want serializable", rows)
			}
			run(t, `COMMIT`)
			want(t, map[int64]int64{a: 1, b: 2})
		})
		t.Run(mode.name+"/set transaction reaches every node", func(t *testing.T) {
			clean(t)
			run(t, ins(a, 1))
			run(t, ins(b, 2))
			run(t, `BEGIN`)
			run(t, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
			run(t, `SET LOCAL application_name = 'lattice-tx-test'`)
			for _, id := range []int64{a, b} {
				_, rows := run(t, fmt.Sprintf(`SELECT current_setting('transaction_isolation'), current_setting('application_name') FROM acct WHERE id = %d`, id))
				if len(rows) != 1 || rows[0][0] != "repeatable read" || rows[0][1] != "lattice-tx-test" {
					t.Fatalf("id %d: settings %v, want repeatable read and the SET LOCAL value", id, rows)
				}
			}
			run(t, `COMMIT`)
			want(t, map[int64]int64{a: 1, b: 2})
		})
		t.Run(mode.name+"/savepoints on one node", func(t *testing.T) {
			clean(t)
			run(t, `BEGIN`)
			run(t, `SAVEPOINT early`)
			run(t, ins(a, 1))
			run(t, `SAVEPOINT s1`)
			run(t, ins(a2, 2))
			fails(t, ins(a2, 3), "23505")
			run(t, `ROLLBACK TO SAVEPOINT s1`)
			run(t, `RELEASE SAVEPOINT s1`)
			run(t, `COMMIT`)
			want(t, map[int64]int64{a: 1})
		})
		t.Run(mode.name+"/savepoints over several nodes", func(t *testing.T) {
			clean(t)
			// Node 2 joins after s1 and node 3 after s2: each makes the
			// savepoints again, so ROLLBACK TO s1 undoes all they did.
			run(t, `BEGIN`)
			run(t, `SAVEPOINT s0`)
			run(t, ins(a, 1))
			run(t, `SAVEPOINT s1`)
			run(t, ins(b, 2))
			run(t, `SAVEPOINT s2`)
			run(t, ins(cc, 3))
			run(t, `RELEASE SAVEPOINT s2`)
			run(t, `ROLLBACK TO SAVEPOINT s1`)
			run(t, ins(b, 4))
			fails(t, `ROLLBACK TO SAVEPOINT s2`, "3B001")
			run(t, `ROLLBACK TO s1`)
			run(t, ins(b, 5))
			run(t, `RELEASE s1`)
			run(t, `COMMIT`)
			want(t, map[int64]int64{a: 1, b: 5})

			// An error on one node: the others went on, and ROLLBACK TO
			// brings the failed one back.
			clean(t)
			run(t, `BEGIN`)
			run(t, ins(a, 1))
			run(t, ins(b, 2))
			run(t, `SAVEPOINT s`)
			run(t, ins(a2, 3))
			fails(t, ins(b, 4), "23505")
			fails(t, `SAVEPOINT t`, "25P02")
			fails(t, `RELEASE s`, "25P02")
			run(t, `ROLLBACK TO SAVEPOINT s`)
			run(t, ins(cc, 5))
			run(t, `COMMIT`)
			want(t, map[int64]int64{a: 1, b: 2, cc: 5})

			// Before any node: the proxy keeps the savepoints, and knows
			// the names.
			clean(t)
			run(t, `BEGIN`)
			run(t, `SAVEPOINT "Early"`)
			fails(t, `ROLLBACK TO SAVEPOINT early`, "3B001")
			run(t, `ROLLBACK`)
			run(t, `BEGIN`)
			run(t, `SAVEPOINT "Early"`)
			run(t, ins(a, 1))
			run(t, ins(b, 2))
			run(t, `ROLLBACK TO "Early"`)
			run(t, ins(cc, 3))
			run(t, `COMMIT`)
			want(t, map[int64]int64{cc: 3})

			// A SET LOCAL made after a savepoint is undone by ROLLBACK TO
			// on the nodes that join later too.
			run(t, `BEGIN`)
			run(t, `SET LOCAL application_name = 'kept'`)
			run(t, `SAVEPOINT s`)
			run(t, `SET LOCAL application_name = 'undone'`)
			run(t, `ROLLBACK TO s`)
			if _, rows := run(t, fmt.Sprintf(`SELECT current_setting('application_name') FROM acct WHERE id = %d`, cc)); len(rows) != 1 || rows[0][0] != "kept" {
				t.Fatalf("application_name %v on the node that joined last, want the SET LOCAL made before the savepoint", rows)
			}
			run(t, `COMMIT`)
		})
		t.Run(mode.name+"/update and delete without the key", func(t *testing.T) {
			clean(t)
			rows := map[int64]int64{}
			for i, ids := range by {
				for _, id := range ids[:3] {
					run(t, ins(id, int64(10*i+1)))
					rows[id] = int64(10*i + 1)
				}
			}
			tag, ret := run(t, `UPDATE acct SET bal = bal + 1 WHERE bal > 0 RETURNING id, bal`)
			if tag != "UPDATE 9" {
				t.Fatalf("tag %q, want UPDATE 9", tag)
			}
			got := map[string]string{}
			for _, r := range ret {
				got[r[0]] = r[1]
			}
			for id := range rows {
				rows[id]++
				if got[fmt.Sprint(id)] != fmt.Sprint(rows[id]) {
					t.Fatalf("RETURNING %v lacks id %d = %d", ret, id, rows[id])
				}
			}
			if len(ret) != 9 {
				t.Fatalf("RETURNING gave %d rows, want 9", len(ret))
			}
			want(t, rows)
			if tag, _ := run(t, `UPDATE acct SET note = 'x' WHERE bal > 1000`); tag != "UPDATE 0" {
				t.Fatalf("tag %q, want UPDATE 0", tag)
			}
			// Inside a transaction, and rolled back with it.
			run(t, `BEGIN`)
			if tag, _ := run(t, `DELETE FROM acct WHERE bal < 20`); tag != "DELETE 6" {
				t.Fatalf("tag %q, want DELETE 6", tag)
			}
			run(t, `ROLLBACK`)
			want(t, rows)
			if tag, _ := run(t, `DELETE FROM acct WHERE bal < 20`); tag != "DELETE 6" {
				t.Fatalf("tag %q, want DELETE 6", tag)
			}
			for id, bal := range rows {
				if bal < 20 {
					delete(rows, id)
				}
			}
			want(t, rows)
			fails(t, `UPDATE acct SET id = 1 WHERE bal > 0`, "0A000")
		})
		t.Run(mode.name+"/keyless update failing on one shard changes nothing", func(t *testing.T) {
			clean(t)
			rows := map[int64]int64{a: 5, a2: 5, b: 5, cc: 0}
			for id, bal := range rows {
				run(t, ins(id, bal))
			}
			fails(t, `UPDATE acct SET bal = bal - 1`, "23514")
			want(t, rows)
			fails(t, `DELETE FROM acct WHERE 1 / bal > 0`, "22012")
			want(t, rows)
		})
		t.Run(mode.name+"/multi-row insert across nodes", func(t *testing.T) {
			clean(t)
			tag, _ := run(t, fmt.Sprintf(`INSERT INTO acct (id, bal) VALUES (%d, 1), (%d, 2), (%d, 3), (%d, 4)`, a, b, cc, a2))
			if tag != "INSERT 0 4" {
				t.Fatalf("tag %q, want INSERT 0 4", tag)
			}
			rows := map[int64]int64{a: 1, b: 2, cc: 3, a2: 4}
			want(t, rows)
			// A duplicate on one node: no row is inserted anywhere.
			fails(t, fmt.Sprintf(`INSERT INTO acct (id, bal) VALUES (%d, 1), (%d, 2), (%d, 3)`, by[0][2], by[1][2], cc), "23505")
			want(t, rows)
			_, ret := run(t, fmt.Sprintf(`INSERT INTO acct (id, bal) VALUES (%d, 7), (%d, 8) RETURNING id`, by[0][2], by[2][2]))
			if len(ret) != 2 {
				t.Fatalf("RETURNING gave %v", ret)
			}
			rows[by[0][2]], rows[by[2][2]] = 7, 8
			want(t, rows)
		})
	}

	t.Run("disconnect rolls back every node", func(t *testing.T) {
		mustExec(t, c, `DELETE FROM acct`)
		c2 := connect(t, p.DSN("lattice"))
		mustExec(t, c2, `BEGIN`)
		mustExec(t, c2, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, a)
		mustExec(t, c2, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, b)
		c2.Close(context.Background())
		// Had the transaction committed, these would be duplicates.
		mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 2), ($2, 3)`, a, b)
		if got := allRows(t, 3, "acct"); !maps.Equal(got, map[int64]int64{a: 2, b: 3}) {
			t.Fatalf("rows %v after the disconnect", got)
		}
	})
	t.Run("extended batch", func(t *testing.T) {
		// One pipeline: the keyless UPDATE starts an implicit transaction
		// over every node that the single-node INSERT before it joins, and
		// a failure later in the batch rolls both back.
		mustExec(t, c, `DELETE FROM acct`)
		mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 1), ($2, 0)`, a, b)
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO acct (id, bal) VALUES ($1, 4)`, cc)
		batch.Queue(`UPDATE acct SET bal = bal + $1 WHERE bal >= 0`, 1)
		batch.Queue(`UPDATE acct SET bal = bal - $1 WHERE id = $2`, 5, b)
		err := c.SendBatch(context.Background(), batch).Close()
		if pgCode(err) != "23514" {
			t.Fatalf("batch: error %v, want 23514", err)
		}
		if got := allRows(t, 3, "acct"); !maps.Equal(got, map[int64]int64{a: 1, b: 0}) {
			t.Fatalf("rows %v after the failed batch", got)
		}
	})
	t.Run("extended batch rolling back to a savepoint", func(t *testing.T) {
		// The failed node's part is back once ROLLBACK TO runs, in the same
		// pipeline as statements for other nodes: those go to their own
		// nodes, which join with the savepoint.
		mustExec(t, c, `DELETE FROM acct`)
		ctx := context.Background()
		// Unnamed statements, as PostgreSQL parses nothing but the end of a
		// failed transaction: a batch of prepared ones fails at its Parse.
		c := connect(t, p.DSN("lattice")+"&default_query_exec_mode=exec")
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, a)
		mustExec(t, c, `SAVEPOINT s`)
		if _, err := c.Exec(ctx, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, a); pgCode(err) != "23505" {
			t.Fatalf("duplicate: %v, want 23505", err)
		}
		batch := &pgx.Batch{}
		batch.Queue(`ROLLBACK TO SAVEPOINT s`)
		batch.Queue(`INSERT INTO acct (id, bal) VALUES ($1, 2)`, b)
		batch.Queue(`INSERT INTO acct (id, bal) VALUES ($1, 3)`, cc)
		if err := c.SendBatch(ctx, batch).Close(); err != nil {
			t.Fatalf("batch: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := allRows(t, 3, "acct"), map[int64]int64{a: 1, b: 2, cc: 3}; !maps.Equal(got, want) {
			t.Fatalf("rows %v after the batch, want %v", got, want)
		}
		// Without BEGIN the batch is no transaction block, though the
		// proxy holds its writes over several nodes in one.
		batch = &pgx.Batch{}
		batch.Queue(`UPDATE acct SET bal = bal + 1 WHERE bal >= 0`)
		batch.Queue(`SAVEPOINT s`)
		if err := c.SendBatch(ctx, batch).Close(); pgCode(err) != "25P01" {
			t.Fatalf("SAVEPOINT in a batch without BEGIN: %v, want 25P01", err)
		}
		if got, want := allRows(t, 3, "acct"), map[int64]int64{a: 1, b: 2, cc: 3}; !maps.Equal(got, want) {
			t.Fatalf("rows %v after the failed batch, want %v", got, want)
		}
	})
	t.Run("extended batch ending a transaction", func(t *testing.T) {
		// After COMMIT in a pipeline, the next statement runs on its own,
		// even on a node the transaction did not touch: once after a
		// transaction on one node, once after one on two.
		mustExec(t, c, `DELETE FROM acct`)
		for _, ids := range [][]int64{{a}, {a2, cc}} {
			batch := &pgx.Batch{}
			batch.Queue(`BEGIN`)
			for _, id := range ids {
				batch.Queue(`INSERT INTO acct (id, bal) VALUES ($1, 1)`, id)
			}
			batch.Queue(`COMMIT`)
			batch.Queue(`INSERT INTO acct (id, bal) VALUES ($1, 2)`, by[1][len(ids)])
			if err := c.SendBatch(context.Background(), batch).Close(); err != nil {
				t.Fatalf("batch: %v", err)
			}
			if st := c.PgConn().TxStatus(); st != 'I' {
				t.Fatalf("transaction status %q after the batch, want I", st)
			}
		}
		want := map[int64]int64{a: 1, a2: 1, cc: 1, by[1][1]: 2, by[1][2]: 2}
		if got := allRows(t, 3, "acct"); !maps.Equal(got, want) {
			t.Fatalf("rows %v after the batches, want %v", got, want)
		}
	})
}

// preparedOn lists the prepared transactions with a Lattice gid on harness
// node i.
func preparedOn(t *testing.T, i int) []string {
	t.Helper()
	c := connect(t, testNodeDSN(t, i))
	defer c.Close(context.Background())
	gids, err := queryStrings(t, c, `SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'lattice\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	return gids
}

// waitRecovered waits until no node holds a Lattice prepared transaction
// and the catalog node's decision log is empty.
func waitRecovered(t *testing.T, p *proxyProc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for len(latticePrepared(t, 3)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("prepared transactions still there after 60s: %v\n%s", latticePrepared(t, 3), p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The decision log forgets a finished transaction.
	log := connect(t, testNodeDSN(t, 0))
	defer log.Close(context.Background())
	for {
		n, err := queryStrings(t, log, `SELECT count(*) FROM lattice_meta.commit_decisions`)
		if err != nil {
			t.Fatal(err)
		}
		if n[0] == "0" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("decision log still holds %s rows", n[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTransactionCrashRecovery kills the proxy (SIGKILL, through the
// test-only LATTICE_TEST_CRASH_2PC hook) in the middle of a commit across
// nodes and checks that a new proxy finishes the transaction atomically:
// committed when the catalog node had committed the decision, rolled back
// when it had not. With the catalog node among the participants its part
// is never prepared (it commits the decision in one phase); without it, a
// transaction of the proxy's own there holds the decision.
func TestTransactionCrashRecovery(t *testing.T) {
	cases := []struct {
		name      string
		hook      string
		nodes     [2]int // harness nodes of the two rows
		committed bool
	}{
		{"catalog participant/after-decision", "after-decision", [2]int{0, 1}, true},
		{"catalog participant/after-prepare", "after-prepare", [2]int{0, 1}, false},
		{"catalog not a participant/after-decision", "after-decision", [2]int{1, 2}, true},
		{"catalog not a participant/after-prepare", "after-prepare", [2]int{1, 2}, false},
	}
	recovery := []string{"--tx-recover-interval", "200ms", "--tx-abort-after", "3s"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			p1 := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_2PC=" + tc.hook}, recovery...)
			c := connect(t, p1.DSN("lattice"))
			by := placeKeys(t, c, "acct")
			a, b := by[tc.nodes[0]][0], by[tc.nodes[1]][0]
			mustExec(t, c, `BEGIN`)
			mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, a)
			mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 2)`, b)
			if _, err := c.Exec(context.Background(), `COMMIT`); err == nil {
				t.Fatal("COMMIT succeeded through a proxy that should have crashed")
			}
			if !p1.WaitExit(30 * time.Second) {
				t.Fatal("the proxy did not crash at the hook")
			}
			if gids := latticePrepared(t, 3); len(gids) == 0 {
				t.Fatal("the crash left no prepared transaction: the hook fired at the wrong point")
			}
			if gids := preparedOn(t, 0); len(gids) > 0 {
				t.Fatalf("the catalog node holds prepared transactions %v: its part must commit in one phase", gids)
			}

			p2 := startProxy(t, 3, recovery...)
			waitRecovered(t, p2)
			want := map[int64]int64{}
			if tc.committed {
				want = map[int64]int64{a: 1, b: 2}
			}
			if got := allRows(t, 3, "acct"); !maps.Equal(got, want) {
				t.Fatalf("rows on the nodes %v, want %v", got, want)
			}
			if !strings.Contains(p2.Log(), "two-phase recovery finished a prepared transaction") {
				t.Fatalf("the new proxy did not report finishing the transaction:\n%s", p2.Log())
			}
		})
	}
}

// TestTransactionReadOnlyParticipant checks that a participant that wrote
// nothing is not prepared, and that one whose SELECT took row locks (as a
// function that writes would) is: the proxy crashes after the PREPAREs so
// that they can be counted.
func TestTransactionReadOnlyParticipant(t *testing.T) {
	cases := []struct {
		name     string
		read     string
		prepared bool
	}{
		{"plain select", `SELECT bal FROM acct WHERE id = $1`, false},
		{"select for update", `SELECT bal FROM acct WHERE id = $1 FOR UPDATE`, true},
	}
	recovery := []string{"--tx-recover-interval", "200ms", "--tx-abort-after", "3s"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			p1 := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_2PC=after-prepare"}, recovery...)
			c := connect(t, p1.DSN("lattice"))
			by := placeKeys(t, c, "acct")
			mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 7)`, by[1][1]) // one node: no two-phase commit
			mustExec(t, c, `BEGIN`)
			mustExec(t, c, tc.read, by[1][1])
			mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, by[0][0])
			mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 2)`, by[2][0])
			if _, err := c.Exec(context.Background(), `COMMIT`); err == nil {
				t.Fatal("COMMIT succeeded through a proxy that should have crashed")
			}
			if !p1.WaitExit(30 * time.Second) {
				t.Fatal("the proxy did not crash at the hook")
			}
			if gids := preparedOn(t, 2); len(gids) != 1 {
				t.Fatalf("the writing node holds prepared transactions %v, want one", gids)
			}
			if gids := preparedOn(t, 1); (len(gids) == 1) != tc.prepared {
				t.Fatalf("the reading node holds prepared transactions %v; want prepared = %v", gids, tc.prepared)
			}
			p2 := startProxy(t, 3, recovery...)
			waitRecovered(t, p2)
			if got := allRows(t, 3, "acct"); !maps.Equal(got, map[int64]int64{by[1][1]: 7}) {
				t.Fatalf("rows on the nodes %v after recovery", got)
			}
		})
	}
}

// TestTransactionDecisionClaimed stalls a coordinator after its PREPAREs
// until a second proxy's recoverer, past --tx-abort-after, has rolled the
// prepared part back: the coordinator's decision must then fail, so the
// client learns that nothing committed, on any node.
func TestTransactionDecisionClaimed(t *testing.T) {
	resetNodes(t)
	p1 := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_2PC=stall-after-prepare"})
	c := connect(t, p1.DSN("lattice"))
	by := placeKeys(t, c, "acct")
	startProxy(t, 3, "--tx-recover-interval", "200ms", "--tx-abort-after", "1s")
	a, b := by[0][0], by[1][0]
	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, a)
	mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 2)`, b)
	_, err := c.Exec(context.Background(), `COMMIT`)
	if pgCode(err) != "40000" {
		t.Fatalf("COMMIT after the recoverer rolled the transaction back: error %v, want 40000", err)
	}
	if got := allRows(t, 3, "acct"); len(got) != 0 {
		t.Fatalf("rows on the nodes %v, want none", got)
	}
	if gids := latticePrepared(t, 3); len(gids) > 0 {
		t.Fatalf("prepared transactions left: %v", gids)
	}
	// The session goes on.
	mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 3)`, a)
}

// TestTransactionTenantDecision commits across nodes in a tenant's own
// database and crashes after the decision: the decision must be in that
// database's log on the catalog node (written by the transaction itself),
// and a new proxy must find it there and commit the rest.
func TestTransactionTenantDecision(t *testing.T) {
	resetNodes(t)
	const db = "lattice_tx_tenant"
	for i := 0; i < 3; i++ {
		admin := connect(t, testNodeDSN(t, i))
		mustExec(t, admin, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		mustExec(t, admin, "CREATE DATABASE "+db)
	}
	t.Cleanup(func() {
		for i := 0; i < 3; i++ {
			if c, err := pgx.Connect(context.Background(), testNodeDSN(t, i)); err == nil {
				c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
				c.Close(context.Background())
			}
		}
	})
	recovery := []string{"--tx-recover-interval", "200ms", "--tx-abort-after", "3s"}
	p1 := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_2PC=after-decision"}, recovery...)
	c := connect(t, p1.DSN(db))
	by := placeKeysIn(t, c, db, "acct")
	a, b := by[0][0], by[1][0]
	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 1)`, a)
	mustExec(t, c, `INSERT INTO acct (id, bal) VALUES ($1, 2)`, b)
	if _, err := c.Exec(context.Background(), `COMMIT`); err == nil {
		t.Fatal("COMMIT succeeded through a proxy that should have crashed")
	}
	if !p1.WaitExit(30 * time.Second) {
		t.Fatal("the proxy did not crash at the hook")
	}
	// The catalog node's part committed with the decision, in the tenant's
	// database; the other node's part waits prepared.
	if got := tenantRows(t, 0, db, "acct"); !maps.Equal(got, map[int64]int64{a: 1}) {
		t.Fatalf("catalog node rows %v after the decision", got)
	}
	logc := connect(t, testNode(t, 0).DSN(db))
	n, err := queryStrings(t, logc, `SELECT count(*) FROM lattice_meta.commit_decisions WHERE state = 'committed'`)
	if err != nil || n[0] != "1" {
		t.Fatalf("decision rows in the tenant's log: %v %v", n, err)
	}

	p2 := startProxy(t, 3, recovery...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := queryStrings(t, logc, `SELECT count(*) FROM lattice_meta.commit_decisions`)
		if err != nil {
			t.Fatal(err)
		}
		if n[0] == "0" && len(latticePrepared(t, 3)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered after 60s: %s decision rows, prepared %v\n%s", n[0], latticePrepared(t, 3), p2.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := map[int64]int64{a: 1, b: 2}
	got := map[int64]int64{}
	for i := 0; i < 3; i++ {
		maps.Copy(got, tenantRows(t, i, db, "acct"))
	}
	if !maps.Equal(got, want) {
		t.Fatalf("rows on the nodes %v, want %v", got, want)
	}
}

// TestTransactionRecoversLegacyDecisions: prepared transactions that a
// proxy of the previous version left behind, with their decisions in its
// log (lattice_meta.transactions of the default database), are finished by
// the current recoverer: committed where that log says committed, rolled
// back otherwise.
func TestTransactionRecoversLegacyDecisions(t *testing.T) {
	resetNodes(t)
	cat := connect(t, testNodeDSN(t, 0))
	mustExec(t, cat, `CREATE SCHEMA IF NOT EXISTS lattice_meta`)
	mustExec(t, cat, `DROP TABLE IF EXISTS lattice_meta.transactions`)
	mustExec(t, cat, `CREATE TABLE lattice_meta.transactions (gid text PRIMARY KEY, database text NOT NULL,
		participants text[] NOT NULL, state text NOT NULL, created timestamptz NOT NULL DEFAULT now(), owner text NOT NULL)`)
	t.Cleanup(func() { cat.Exec(context.Background(), `DROP TABLE IF EXISTS lattice_meta.transactions`) })
	const committed, undecided = "lattice_0123456789ab_1", "lattice_0123456789ab_2"
	mustExec(t, cat, `INSERT INTO lattice_meta.transactions (gid, database, participants, state, owner) VALUES
		($1, 'lattice', '{n2,n3}', 'committed', '0123456789ab'), ($2, 'lattice', '{n2,n3}', 'preparing', '0123456789ab')`, committed, undecided)
	for i := 1; i <= 2; i++ {
		c := connect(t, testNodeDSN(t, i))
		mustExec(t, c, `CREATE TABLE legacy (gid text)`)
		for _, gid := range []string{committed, undecided} {
			mustExec(t, c, `BEGIN`)
			mustExec(t, c, `INSERT INTO legacy VALUES ($1)`, gid)
			mustExec(t, c, `PREPARE TRANSACTION '`+gid+`'`)
		}
	}
	p := startProxy(t, 3, "--tx-recover-interval", "200ms", "--tx-abort-after", "1s")
	deadline := time.Now().Add(60 * time.Second)
	for len(latticePrepared(t, 3)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("prepared transactions still there after 60s: %v\n%s", latticePrepared(t, 3), p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 1; i <= 2; i++ {
		c := connect(t, testNodeDSN(t, i))
		got, err := queryStrings(t, c, `SELECT gid FROM legacy`)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, []string{committed}) {
			t.Fatalf("node %d holds %v, want only the committed transaction's row", i, got)
		}
	}
}
