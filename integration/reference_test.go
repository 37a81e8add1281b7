package integration

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// refDump is a node's copy of the item reference table, in key order.
func refDump(t *testing.T, ctx context.Context, c *pgx.Conn) string {
	t.Helper()
	return itemDump(t, ctx, c, "item")
}

// itemDump is the rows of public.table, an item-shaped table, in key order.
func itemDump(t *testing.T, ctx context.Context, c *pgx.Conn, table string) string {
	t.Helper()
	var s string
	if err := c.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s', i_id, i_im_id, i_name, i_price, i_data), ',' ORDER BY i_id), '')
		FROM public.`+table).Scan(&s); err != nil {
		t.Fatalf("read a copy of %s: %v", table, err)
	}
	return s
}

// sameCopies fails unless every node's copy of item is want (the first
// node's when want is "").
func sameCopies(t *testing.T, ctx context.Context, nodes []*pgx.Conn, want string) string {
	t.Helper()
	for i, n := range nodes {
		got := refDump(t, ctx, n)
		if want == "" {
			want = got
		}
		if got != want {
			t.Fatalf("node n%d's copy of item differs:\n got %.300s\nwant %.300s", i+1, got, want)
		}
	}
	return want
}

// TestReferenceTables makes a TPC-C-like item table a reference table on
// two nodes, adds a third node, which gets its copy before its first shard
// of a stock tree, joins the tree with it and compares with plain
// PostgreSQL, writes it from four clients at once (with and without the
// tree in the transaction) and compares the copies, changes it with DDL,
// shows the fence and the refusals, fails a write while a node is out of
// reach, and turns it back into an ordinary table.
func TestReferenceTables(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1))}

	const itemFill = `SELECT i, i % 7, 'item-' || i, (i * 13 % 10000) / 100.0, repeat('x', i % 5) FROM generate_series(1, 100) i`
	for _, tbl := range []string{"item", "item_plain"} {
		mustExec(t, c, `CREATE TABLE `+tbl+` `+itemColumns)
		mustExec(t, c, `INSERT INTO `+tbl+` `+itemFill)
	}
	var msg string
	if err := c.QueryRow(ctx, `SELECT lattice_create_reference_table('item')`).Scan(&msg); err != nil {
		t.Fatalf("lattice_create_reference_table: %v", err)
	}
	t.Log(msg)
	initial := sameCopies(t, ctx, nodes, "")
	if strings.Count(initial, ",") != 99 {
		t.Fatalf("the copies hold %d rows, want 100", strings.Count(initial, ",")+1)
	}

	// A node added later gets its copy before its first shard.
	mustExec(t, c, `SELECT lattice_add_node('n3', $1)`, testNodeDSN(t, 2))
	nodes = append(nodes, connect(t, testNodeDSN(t, 2)))
	const stockCols = `(s_w_id int, s_i_id int, s_quantity int NOT NULL, PRIMARY KEY (s_w_id, s_i_id))`
	const stockFill = `SELECT w, i, 10 + (w * i) % 90 FROM generate_series(1, 12) w, generate_series(1, 100, 3) i`
	for _, tbl := range []string{"stock", "stock_plain"} {
		mustExec(t, c, `CREATE TABLE `+tbl+` `+stockCols)
		mustExec(t, c, `INSERT INTO `+tbl+` `+stockFill)
	}
	mustExec(t, c, `SELECT lattice_create_tree('stock', 's_w_id', shard_count => 6)`)
	sameCopies(t, ctx, nodes, initial)
	var holders string
	if err := c.QueryRow(ctx, `SELECT nodes FROM lattice_reference_tables() WHERE "table" = 'item'`).Scan(&holders); err != nil || holders != "n1,n2,n3" {
		t.Fatalf("lattice_reference_tables: %q, %v; want n1,n2,n3", holders, err)
	}

	// Joins of the tree with the reference table equal plain PostgreSQL's.
	cases := []struct {
		sql     string
		ordered bool
	}{
		{`SELECT s.s_i_id, i.i_name, s.s_quantity FROM stock s JOIN item i ON i.i_id = s.s_i_id WHERE s.s_w_id = 5 ORDER BY 1`, true},
		{`SELECT s.s_w_id, s.s_i_id, i.i_price FROM stock s JOIN item i ON i.i_id = s.s_i_id WHERE i.i_price > 6 AND s.s_quantity < 40`, false},
		{`SELECT s.s_w_id, count(*), sum(i.i_price * s.s_quantity) FROM stock s JOIN item i ON i.i_id = s.s_i_id WHERE s.s_w_id = 7 GROUP BY 1 ORDER BY 1`, true},
		{`SELECT i.i_name, s.s_quantity FROM item i JOIN stock s ON s.s_i_id = i.i_id AND s.s_w_id = 3 WHERE i.i_im_id = 2 ORDER BY 1`, true},
		{`SELECT s_w_id, s_i_id FROM stock WHERE s_i_id IN (SELECT i_id FROM item WHERE i_data = 'xx') ORDER BY 1, 2 LIMIT 12`, true},
		{`SELECT count(*), sum(i_price), max(i_name) FROM item`, false},
		// Aggregates over every shard, joined with the reference table.
		{`SELECT i.i_im_id, count(*), sum(s.s_quantity), avg(i.i_price), min(i.i_name), max(s.s_quantity) FROM stock s JOIN item i ON i.i_id = s.s_i_id GROUP BY 1 ORDER BY 1`, true},
		{`SELECT count(*), sum(i.i_price * s.s_quantity) FROM stock s JOIN item i ON i.i_id = s.s_i_id WHERE i.i_data = 'xx'`, false},
		{`SELECT i.i_name, count(DISTINCT s.s_w_id) FROM stock s LEFT JOIN item i ON i.i_id = s.s_i_id GROUP BY i.i_name HAVING count(*) > 10 ORDER BY 2 DESC, 1 LIMIT 5`, true},
	}
	plain := regexp.MustCompile(`\b(item|stock)\b`)
	for name, mode := range map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol} {
		for _, tc := range cases {
			gotHead, got, err := queryTyped(t, c, tc.sql, mode)
			if err != nil {
				t.Fatalf("%s %s: %v", name, tc.sql, err)
			}
			wantHead, want, err := queryTyped(t, c, plain.ReplaceAllString(tc.sql, "${1}_plain"), mode)
			if err != nil {
				t.Fatalf("%s on plain tables: %v", tc.sql, err)
			}
			if !tc.ordered {
				slices.Sort(got)
				slices.Sort(want)
			}
			if gotHead != wantHead || len(want) == 0 || !slices.Equal(got, want) {
				t.Fatalf("%s %s: %s %d rows, plain %s %d rows; first difference:\n%s", name, tc.sql, gotHead, len(got), wantHead, len(want), firstDiff(got, want))
			}
		}
	}

	// A write answers once, with the catalog copy's rows and tag, in both
	// protocols.
	for name, mode := range map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol} {
		rows, err := c.Query(ctx, `UPDATE item SET i_data = 'r' WHERE i_id IN (1, 2) RETURNING i_id, i_data`, mode)
		if err != nil {
			t.Fatal(err)
		}
		got, err := collectStrings(rows)
		if tag := rows.CommandTag().String(); err != nil || len(got) != 2 || tag != "UPDATE 2" {
			t.Fatalf("%s: UPDATE ... RETURNING of a reference table: %v, tag %q, %v; want 2 rows, UPDATE 2", name, got, tag, err)
		}
	}
	sameCopies(t, ctx, nodes, "")

	// Four clients write at once: price updates on ten shared rows, inserts
	// and deletes, and transactions that write the tree and the reference
	// table together. Every write runs on every copy, by two-phase commit.
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var before float64
	if err := c.QueryRow(ctx, `SELECT sum(i_price)::float8 FROM item`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 4, 12
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				id := 1 + (w*7+i)%10
				var err error
				switch i % 3 {
				case 0:
					_, err = pool.Exec(ctx, `UPDATE item SET i_price = i_price + 1 WHERE i_id = $1`, id)
				case 1:
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `UPDATE stock SET s_quantity = s_quantity - 1 WHERE s_w_id = $1 AND s_i_id = $2`, 1+w, 1+3*i); err != nil {
							return err
						}
						if _, err := tx.Exec(ctx, `UPDATE item SET i_price = i_price + 1, i_data = $2 WHERE i_id = $1`, id, fmt.Sprintf("w%d-%d", w, i)); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `INSERT INTO item VALUES ($1, 0, 'new', 1.00, 'n'), ($2, 0, 'new', 1.00, 'n')`, 1000+w*100+i, 2000+w*100+i)
						return err
					})
				case 2:
					_, err = pool.Exec(ctx, `DELETE FROM item WHERE i_id = $1`, 2000+w*100+i-1)
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", w, i, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sameCopies(t, ctx, nodes, "")
	var sum float64
	var rows int
	if err := c.QueryRow(ctx, `SELECT sum(i_price)::float8, count(*) FROM item`).Scan(&sum, &rows); err != nil {
		t.Fatal(err)
	}
	// 8 price rounds of +1 per worker, and 8 new rows of 1.00 (the other 4
	// deleted again); a float sum, compared to the cent.
	if want := before + workers*8 + workers*4; fmt.Sprintf("%.2f", sum) != fmt.Sprintf("%.2f", want) || rows != 100+workers*4 {
		t.Fatalf("after the writers: sum %.2f over %d rows, want %.2f over %d", sum, rows, want, 100+workers*4)
	}

	// The fence: a write that does not come through a proxy with the list
	// of copies is refused on any copy.
	if _, err := nodes[1].Exec(ctx, `UPDATE item SET i_price = 0 WHERE i_id = 1`); pgCode(err) != "LT001" {
		t.Fatalf("a direct write of n2's copy: %v, want LT001", err)
	}

	// COPY FROM STDIN goes to every copy: text in the simple protocol,
	// binary by pgx's CopyFrom, in a transaction with the tree; a COPY
	// that fails, or that its transaction rolls back, leaves every copy
	// as it was.
	copyText := func(c *pgx.Conn, data string) (pgconn.CommandTag, error) {
		return c.PgConn().CopyFrom(ctx, strings.NewReader(data), `COPY item (i_id, i_im_id, i_name, i_price, i_data) FROM STDIN`)
	}
	if tag, err := copyText(c, "5001\t1\tc1\t0.00\tt\n5002\t1\tc2\t0.00\t\\N\n5003\t1\tc3\t0.00\tt\n"); err != nil || tag.String() != "COPY 3" {
		t.Fatalf("COPY into the reference table: %q, %v; want COPY 3", tag, err)
	}
	held := sameCopies(t, ctx, nodes, "")
	if _, err := copyText(c, "5004\t1\tc4\t0.00\tt\n5001\t1\tdup\t0.00\tt\n"); pgCode(err) != "23505" {
		t.Fatalf("COPY of a duplicate key: %v, want 23505", err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := copyText(tx.Conn(), "5005\t1\tc5\t0.00\tt\n"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sameCopies(t, ctx, nodes, ""); got != held {
		t.Fatal("a failed or rolled-back COPY changed the copies")
	}
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE stock SET s_quantity = s_quantity + 1 WHERE s_w_id = 2`); err != nil {
			return err
		}
		n, err := tx.CopyFrom(ctx, pgx.Identifier{"item"}, []string{"i_id", "i_im_id", "i_name", "i_price", "i_data"},
			pgx.CopyFromRows([][]any{{5006, 1, "b6", 0.0, "b"}, {5007, 1, "b7", 0.0, nil}}))
		if err == nil && n != 2 {
			err = fmt.Errorf("CopyFrom loaded %d rows, want 2", n)
		}
		return err
	})
	if err != nil {
		t.Fatalf("binary COPY into the reference table in a transaction with the tree: %v", err)
	}
	if got := sameCopies(t, ctx, nodes, ""); !strings.Contains(got, "5007|1|b7|0.00|") || strings.Count(got, ",") != strings.Count(held, ",")+2 {
		t.Fatalf("after the binary COPY: %.200s", got)
	}
	// A COPY waits for a writer of the table still in its transaction
	// before it sends a row to any copy: two writers could otherwise
	// each hold a key on one copy and wait for the other's on another.
	writer, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, `UPDATE item SET i_data = 'held' WHERE i_id = 5001`); err != nil {
		t.Fatal(err)
	}
	copied := make(chan error, 1)
	c2 := connect(t, p.DSN("lattice"))
	go func() {
		_, err := copyText(c2, "5008\t1\tc8\t0.00\tt\n")
		copied <- err
	}()
	for waiting := false; !waiting; {
		select {
		case err := <-copied:
			t.Fatalf("a COPY ran while another writer of the table was in its transaction (%v): it must wait for the catalog copy's lock", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := nodes[0].QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE '%IN SHARE ROW EXCLUSIVE MODE%' AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-copied; err != nil {
		t.Fatalf("the COPY after the writer committed: %v", err)
	}
	if got := sameCopies(t, ctx, nodes, ""); !strings.Contains(got, "5001|1|c1|0.00|held") || !strings.Contains(got, "5008|") {
		t.Fatalf("after the held writer and the COPY: %.300s", got)
	}
	mustExec(t, c, `DELETE FROM item WHERE i_id > 5000`)

	// DDL runs on every copy.
	mustExec(t, c, `ALTER TABLE item ADD COLUMN i_note text NOT NULL DEFAULT 'n'`)
	mustExec(t, c, `CREATE INDEX item_name ON item (i_name)`)
	indexes := func(want string) {
		t.Helper()
		for i, n := range nodes {
			var cols int
			var idx string
			if err := n.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.item'::regclass AND attname = 'i_note'),
				(SELECT coalesce(string_agg(indexname, ',' ORDER BY indexname), '') FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'item')`).Scan(&cols, &idx); err != nil || cols != 1 || idx != want {
				t.Fatalf("n%d after the DDL: column %d, indexes %q, %v; want %q", i+1, cols, idx, err, want)
			}
		}
	}
	indexes("item_name,item_pkey")
	// The statements that name an index, not its table, too: the catalog
	// node says whose index it is.
	mustExec(t, c, `ALTER INDEX item_name RENAME TO item_by_name`)
	indexes("item_by_name,item_pkey")
	mustExec(t, c, `CREATE INDEX item_plain_name ON item_plain (i_name)`)
	for _, r := range []struct{ name, sql string }{
		{"concurrently", `DROP INDEX CONCURRENTLY item_by_name`},
		{"with an ordinary table's index", `DROP INDEX item_by_name, item_plain_name`},
	} {
		if _, err := c.Exec(ctx, r.sql); pgCode(err) != "0A000" {
			t.Errorf("DROP INDEX %s: %v, want 0A000", r.name, err)
		}
	}
	mustExec(t, c, `DROP INDEX item_by_name`)
	indexes("item_pkey")

	refusals := []struct{ name, sql, code string }{
		{"a value per node", `UPDATE item SET i_data = random()::text WHERE i_id = 1`, "0A000"},
		{"a fan-out that keeps the reference table's unmatched rows", `SELECT i.i_id, s.s_w_id FROM item i LEFT JOIN stock s ON s.s_i_id = i.i_id`, "0A000"},
		{"a write reading an ordinary table", `UPDATE item SET i_price = p.i_price FROM item_plain p WHERE p.i_id = item.i_id`, "0A000"},
		{"drop", `DROP TABLE item`, "0A000"},
		{"copy from a per-node value", `COPY item FROM STDIN WHERE i_price < random()`, "0A000"},
		{"create again", `SELECT lattice_create_reference_table('item')`, "42710"},
		{"a tree", `SELECT lattice_create_reference_table('stock')`, "42P07"},
		{"a sequence default", `SELECT lattice_create_reference_table('seqd')`, "0A000"},
	}
	mustExec(t, c, `CREATE TABLE seqd (id serial PRIMARY KEY)`)
	for _, r := range refusals {
		if _, err := c.Exec(ctx, r.sql); pgCode(err) != r.code {
			t.Errorf("%s: %v, want %s", r.name, err, r.code)
		}
	}

	// A write while a node is out of reach fails whole.
	held = sameCopies(t, ctx, nodes, "")
	admin3 := connect(t, testNode(t, 2).DSN("postgres"))
	mustExec(t, admin3, `ALTER DATABASE lattice ALLOW_CONNECTIONS false`)
	defer func() { _, _ = admin3.Exec(context.Background(), `ALTER DATABASE lattice ALLOW_CONNECTIONS true`) }()
	mustExec(t, admin3, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'lattice' AND pid <> pg_backend_pid()`)
	// The pool's backends on n3 were terminated (57P01, relayed as the node
	// sent it); once they are gone, a new one cannot be made (08006).
	// A relayed FATAL ends a driver's connection: a new one per attempt.
	for attempt := 0; ; attempt++ {
		_, err := connect(t, p.DSN("lattice")).Exec(ctx, `UPDATE item SET i_price = 1 WHERE i_id = 1`)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57P01" && !strings.HasPrefix(pe.Code, "08") {
			t.Fatalf("a write with n3 out of reach: %v, want 57P01 or a connection failure (08xxx)", err)
		}
		if pe.Code == "08006" && strings.Contains(pe.Hint, "every copy or to none") {
			t.Logf("with n3 out of reach: %s %s (hint %q)", pe.Code, pe.Message, pe.Hint)
			break
		}
		if attempt == 20 {
			t.Fatalf("a write with n3 out of reach keeps failing with %s %s, never the refusal", pe.Code, pe.Message)
		}
	}
	mustExec(t, admin3, `ALTER DATABASE lattice ALLOW_CONNECTIONS true`)
	nodes[2] = connect(t, testNodeDSN(t, 2))
	c = connect(t, p.DSN("lattice"))
	if got := sameCopies(t, ctx, nodes, ""); got != held {
		t.Fatal("a failed write changed the copies")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.Exec(ctx, `UPDATE item SET i_price = 2 WHERE i_id = 1`)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes after n3 came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	sameCopies(t, ctx, nodes, "")

	// Back to an ordinary table: the catalog node keeps its rows, the other
	// copies go, and writes go to the catalog node alone.
	mustExec(t, c, `SELECT lattice_undistribute_table('item')`)
	kept := refDump(t, ctx, nodes[0])
	for i, n := range nodes[1:] {
		var exists bool
		if err := n.QueryRow(ctx, `SELECT to_regclass('public.item') IS NOT NULL`).Scan(&exists); err != nil || exists {
			t.Fatalf("n%d still has a copy of item: %v", i+2, err)
		}
	}
	mustExec(t, c, `UPDATE item SET i_price = 3 WHERE i_id = 1`)
	mustExec(t, nodes[0], `UPDATE item SET i_price = 3 WHERE i_id = 2`)
	if got := refDump(t, ctx, nodes[0]); strings.Count(got, ",") != strings.Count(kept, ",") {
		t.Fatalf("the ordinary table lost rows")
	}
	if _, err := c.Exec(ctx, `SELECT * FROM stock s JOIN item i ON i.i_id = s.s_i_id WHERE s.s_w_id = 1`); pgCode(err) != "0A000" {
		t.Fatalf("a join of the tree with the ordinary table again: %v, want 0A000", err)
	}
}

// TestReferenceRemoveNode removes a node that holds copies of a reference
// table: a node with a shard keeps its copy and is refused (55000); one
// with none leaves the table's copies, its copy is dropped, and writes
// and reads go on over the copies left.
func TestReferenceRemoveNode(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1)), connect(t, testNodeDSN(t, 2))}
	mustExec(t, c, itemTable)
	mustExec(t, c, `INSERT INTO item SELECT i, i % 3, 'item-' || i, i, 'd' FROM generate_series(1, 20) i`)
	mustExec(t, c, `SELECT lattice_create_reference_table('item')`)
	sameCopies(t, ctx, nodes, "")
	holders := func(want string) {
		t.Helper()
		var got string
		if err := c.QueryRow(ctx, `SELECT nodes FROM lattice_reference_tables() WHERE "table" = 'item'`).Scan(&got); err != nil || got != want {
			t.Fatalf("copies of item: %q, %v; want %q", got, err, want)
		}
	}

	// Only n2 gets a shard of the tree.
	mustExec(t, c, `SELECT lattice_drain_node('n3')`)
	mustExec(t, c, `CREATE TABLE stock (s_w_id int, s_i_id int, s_quantity int NOT NULL, PRIMARY KEY (s_w_id, s_i_id))`)
	mustExec(t, c, `INSERT INTO stock SELECT w, i, w + i FROM generate_series(1, 8) w, generate_series(1, 20) i`)
	mustExec(t, c, `SELECT lattice_create_tree('stock', 's_w_id', shard_count => 2)`)
	if _, err := c.Exec(ctx, `SELECT lattice_remove_node('n2')`); pgCode(err) != "55000" {
		t.Fatalf("removing n2, which holds a shard: %v, want 55000", err)
	}
	holders("n1,n2,n3")

	mustExec(t, c, `SELECT lattice_remove_node('n3')`)
	holders("n1,n2")
	var exists bool
	if err := nodes[2].QueryRow(ctx, `SELECT to_regclass('public.item') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("n3 still has its copy of item (%v)", err)
	}
	mustExec(t, c, `UPDATE item SET i_price = i_price + 1 WHERE i_id <= 5`)
	if tag, err := c.PgConn().CopyFrom(ctx, strings.NewReader("100\t1\tc\t1.00\tc\n"), `COPY item FROM STDIN`); err != nil || tag.String() != "COPY 1" {
		t.Fatalf("COPY after the removal: %q, %v", tag, err)
	}
	sameCopies(t, ctx, nodes[:2], "")
	var n int
	var sum float64
	if err := c.QueryRow(ctx, `SELECT count(*), sum(s.s_quantity * i.i_price)::float8 FROM stock s JOIN item i ON i.i_id = s.s_i_id WHERE s.s_w_id = 3`).Scan(&n, &sum); err != nil || n != 20 {
		t.Fatalf("a join of the tree with the reference table after the removal: %d rows, %v", n, err)
	}
}
