package integration

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// cursorStep runs sql as a simple query and describes what came back: the
// columns, rows and tag of its last result, or its error's SQLSTATE.
func cursorStep(t *testing.T, c *pgx.Conn, sql string) string {
	t.Helper()
	res, err := c.PgConn().Exec(context.Background(), sql).ReadAll()
	if err != nil {
		return "ERROR " + pgCode(err)
	}
	return describeResult(res[len(res)-1])
}

// extendedStep is cursorStep in the extended protocol, with text
// parameters and the given result formats.
func extendedStep(t *testing.T, c *pgx.Conn, sql string, params []string, formats []int16) string {
	t.Helper()
	var vals [][]byte
	for _, p := range params {
		vals = append(vals, []byte(p))
	}
	return describeResult(c.PgConn().ExecParams(context.Background(), sql, vals, nil, nil, formats).Read())
}

// describeResult is a result's columns, rows and tag, or its SQLSTATE.
func describeResult(r *pgconn.Result) string {
	if r.Err != nil {
		return "ERROR " + pgCode(r.Err)
	}
	var b strings.Builder
	for _, f := range r.FieldDescriptions {
		b.WriteString(f.Name + " ")
	}
	fmt.Fprintf(&b, "%v %s", textRows(r.Rows), r.CommandTag)
	return b.String()
}

// TestTreeCursors: a cursor over a tree (DECLARE ... CURSOR FOR a SELECT
// over several shards, or one) answers FETCH and MOVE in every direction,
// ends with its transaction or savepoint, and fails, as a PostgreSQL
// cursor over one table with the same rows does, statement by statement:
// each script runs through the tree on one session and over the plain
// twin, a cursor of the catalog node's PostgreSQL, on another. Then what
// only the proxy's cursors have: its memory bound (53200); the extended
// protocol, as psycopg 3 sends a server-side cursor's statements; and
// FETCH with binary results, as pgx sends it.
func TestTreeCursors(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--max-merge-memory", "100000")
	tree, plain := connect(t, p.DSN("lattice")), connect(t, p.DSN("lattice"))
	treeWithTwin(t, tree, "curs", `(id int PRIMARY KEY, grp int NOT NULL, name text NOT NULL)`,
		` SELECT g, g % 4, 'name-' || g FROM generate_series(1, 40) g`)
	byID := `SELECT id, name FROM curs ORDER BY id`
	// A cursor of the catalog node's, of the same shape.
	catalogRows := `SELECT 1 AS id, relname::text AS name FROM pg_class WHERE relname = 'pg_class'`
	scripts := []struct {
		name   string
		script []string
	}{
		{"every direction of a SCROLL cursor", []string{"BEGIN", "DECLARE c SCROLL CURSOR FOR " + byID,
			"FETCH 3 FROM c", "FETCH NEXT FROM c", "FETCH 0 FROM c", "FETCH PRIOR FROM c", "FETCH BACKWARD 2 FROM c",
			"FETCH ABSOLUTE 10 FROM c", "FETCH ABSOLUTE -2 FROM c", "FETCH RELATIVE -3 FROM c", "FETCH RELATIVE 0 FROM c",
			"MOVE FORWARD 5 IN c", "FETCH FIRST FROM c", "FETCH LAST FROM c", "FETCH NEXT FROM c", "FETCH RELATIVE 0 FROM c",
			"FETCH BACKWARD 3 FROM c", "FETCH BACKWARD ALL FROM c", "FETCH PRIOR FROM c", "MOVE LAST IN c", "FETCH ALL FROM c",
			"FETCH FORWARD ALL FROM c", "MOVE ABSOLUTE 0 IN c", "FETCH 5 FROM c", "FETCH -2 FROM c", "MOVE BACKWARD ALL IN c",
			"FETCH ABSOLUTE 100 FROM c", "FETCH ABSOLUTE -100 FROM c", "FETCH RELATIVE 41 FROM c", "MOVE RELATIVE -1 IN c",
			"FETCH FORWARD 1000 FROM c", "CLOSE c", "FETCH 1 FROM c", "ROLLBACK"}},
		{"one shard, a grouped query, an empty one", []string{"BEGIN",
			"DECLARE one CURSOR FOR SELECT * FROM curs WHERE id = 7", "FETCH ALL FROM one", "FETCH ALL FROM one",
			"DECLARE agg CURSOR FOR SELECT grp, count(*), max(name) FROM curs GROUP BY grp ORDER BY grp", "FETCH 2 FROM agg", "FETCH 5 FROM agg",
			"DECLARE none CURSOR FOR SELECT id FROM curs WHERE id < 0", "FETCH 3 FROM none", "MOVE 3 IN none", "COMMIT"}},
		{"NO SCROLL goes forward only", []string{"BEGIN", "DECLARE n NO SCROLL CURSOR FOR " + byID,
			"FETCH 2 FROM n", "FETCH ABSOLUTE 5 FROM n", "FETCH RELATIVE 2 FROM n", "MOVE 3 IN n", "FETCH 1 FROM n", "FETCH PRIOR FROM n", "ROLLBACK",
			"BEGIN", "DECLARE n NO SCROLL CURSOR FOR " + byID, "FETCH 4 FROM n", "FETCH ABSOLUTE 2 FROM n", "ROLLBACK",
			"BEGIN", "DECLARE n NO SCROLL CURSOR FOR " + byID, "FETCH 4 FROM n", "FETCH RELATIVE 0 FROM n", "ROLLBACK"}},
		{"cursors end with their transaction", []string{"DECLARE w CURSOR FOR " + byID,
			"DECLARE h CURSOR WITH HOLD FOR " + byID, "FETCH 2 FROM h",
			"BEGIN", "FETCH 2 FROM h", "ROLLBACK", "FETCH 1 FROM h",
			"BEGIN", "DECLARE h2 CURSOR WITH HOLD FOR " + byID, "FETCH 1 FROM h2", "ROLLBACK", "FETCH 1 FROM h2",
			"BEGIN", "DECLARE h3 CURSOR WITH HOLD FOR " + byID, "COMMIT", "FETCH 1 FROM h3",
			"BEGIN", "DECLARE t CURSOR FOR " + byID, "COMMIT", "FETCH 1 FROM t",
			"BEGIN", "DECLARE h4 CURSOR WITH HOLD FOR " + byID, "SELECT 1/0", "COMMIT", "FETCH 1 FROM h4",
			"BEGIN", "DECLARE t CURSOR FOR " + byID, "COMMIT AND CHAIN", "FETCH 1 FROM t", "ROLLBACK",
			"CLOSE ALL", "FETCH 1 FROM h", "FETCH 1 FROM h3"}},
		{"savepoints", []string{"BEGIN", "SAVEPOINT a", "DECLARE s CURSOR FOR " + byID, "FETCH 1 FROM s", "ROLLBACK TO a", "FETCH 1 FROM s", "ROLLBACK",
			"BEGIN", "DECLARE before CURSOR FOR " + byID, "SAVEPOINT a", "FETCH 3 FROM before", "SAVEPOINT b", "DECLARE s2 CURSOR FOR " + byID,
			"RELEASE b", "ROLLBACK TO a", "FETCH 1 FROM before", "FETCH 1 FROM s2", "ROLLBACK",
			"BEGIN", "SAVEPOINT a", "DECLARE s3 CURSOR FOR " + byID, "RELEASE a", "FETCH 2 FROM s3", "COMMIT"}},
		{"one namespace with the catalog node's cursors", []string{"BEGIN", "DECLARE n CURSOR FOR " + catalogRows, "DECLARE n CURSOR FOR " + byID, "ROLLBACK",
			"BEGIN", "DECLARE n CURSOR FOR " + catalogRows, "FETCH 1 FROM n", "CLOSE n", "DECLARE n CURSOR FOR " + byID, "FETCH 1 FROM n", "COMMIT",
			"BEGIN", "DO $$DECLARE r refcursor := 'fn'; BEGIN OPEN r FOR SELECT 1; END$$", "DECLARE fn CURSOR FOR " + byID, "ROLLBACK",
			"DECLARE wh CURSOR WITH HOLD FOR " + catalogRows, "DECLARE wh CURSOR WITH HOLD FOR " + byID, "FETCH 1 FROM wh",
			"CLOSE wh", "DECLARE wh CURSOR WITH HOLD FOR " + byID, "FETCH 1 FROM wh", "CLOSE wh"}},
		{"errors", []string{"BEGIN", "DECLARE d CURSOR FOR " + byID, "DECLARE d CURSOR FOR " + byID, "ROLLBACK",
			"BEGIN", "DECLARE d CURSOR FOR " + byID, "SELECT 1/0", "FETCH 1 FROM d", "ROLLBACK",
			"BEGIN", "DECLARE d CURSOR FOR SELECT nosuch FROM curs", "ROLLBACK",
			"BEGIN", "DECLARE d CURSOR FOR " + byID, "DISCARD ALL", "ROLLBACK"}},
	}
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) {
			// Each script from a clean session, whatever the one before
			// left when it failed.
			for _, c := range []*pgx.Conn{tree, plain} {
				cursorStep(t, c, "ROLLBACK")
				cursorStep(t, c, "CLOSE ALL")
			}
			for _, sql := range sc.script {
				got := cursorStep(t, tree, sql)
				want := cursorStep(t, plain, strings.ReplaceAll(sql, "FROM curs", "FROM curs_plain"))
				if got != want {
					t.Fatalf("%s\nthrough the tree: %s\non one table:     %s", sql, got, want)
				}
			}
		})
	}

	cursorStep(t, tree, "ROLLBACK")
	// The rows of this cursor need more than the 100,000 bytes allowed:
	// 53200 at DECLARE, and the session goes on.
	mustExec(t, tree, `INSERT INTO curs SELECT g, 0, repeat('x', 200) FROM generate_series(41, 1040) g`)
	mustExec(t, tree, "BEGIN")
	_, err := tree.PgConn().Exec(context.Background(), "DECLARE big CURSOR FOR "+byID).ReadAll()
	if pgCode(err) != "53200" || !strings.Contains(err.Error(), "cursor over trees") {
		t.Fatalf("a cursor past --max-merge-memory: %v, want 53200", err)
	}
	mustExec(t, tree, "ROLLBACK")
	if got := cursorStep(t, tree, "SELECT count(*) FROM curs"); !strings.Contains(got, "[[1040]]") {
		t.Fatalf("after the refused cursor: %s", got)
	}

	// The extended protocol, as psycopg 3 sends a server-side cursor's
	// statements: DECLARE with a parameter, a Describe of the cursor as a
	// portal, FETCH with text results.
	extended := []struct {
		sql    string
		params []string
	}{
		{"BEGIN", nil},
		{"DECLARE e CURSOR FOR SELECT id, name FROM curs WHERE grp = $1 AND id < $2 ORDER BY id DESC", []string{"2", "30"}},
		{"FETCH FORWARD 3 FROM e", nil},
		{"MOVE 2 IN e", nil},
		{"FETCH FORWARD 100 FROM e", nil},
		{"FETCH BACKWARD 2 FROM e", nil},
		{"CLOSE e", nil},
		{"COMMIT", nil},
		// With a cursor of the catalog node's in the transaction: the
		// names are checked there, before the query's parts are bound.
		{"BEGIN", nil},
		{"DECLARE k CURSOR FOR " + catalogRows, nil},
		{"DECLARE e CURSOR FOR SELECT id, name FROM curs WHERE grp = $1 ORDER BY id", []string{"3"}},
		{"FETCH 2 FROM e", nil},
		{"FETCH 1 FROM k", nil},
		{"DECLARE k CURSOR FOR SELECT id, name FROM curs WHERE grp = $1 ORDER BY id", []string{"1"}},
		{"ROLLBACK", nil},
	}
	for _, st := range extended {
		got := extendedStep(t, tree, st.sql, st.params, nil)
		want := extendedStep(t, plain, strings.ReplaceAll(st.sql, "FROM curs", "FROM curs_plain"), st.params, nil)
		if got != want {
			t.Fatalf("extended %s\nthrough the tree: %s\non one table:     %s", st.sql, got, want)
		}
	}
	mustExec(t, tree, "BEGIN")
	if got := extendedStep(t, tree, "DECLARE x CURSOR FOR SELECT id FROM curs WHERE id < 5", nil, nil); !strings.HasSuffix(got, "DECLARE CURSOR") {
		t.Fatalf("DECLARE: %s", got)
	}
	// The cursor described as a portal, as psycopg 3 does after DECLARE.
	pc := tree.PgConn()
	pc.Frontend().Send(&pgproto3.Describe{ObjectType: 'P', Name: "x"})
	pc.Frontend().Send(&pgproto3.Sync{})
	if err := pc.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	var described string
	for {
		msg, err := pc.ReceiveMessage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rd, ok := msg.(*pgproto3.RowDescription); ok {
			described = string(rd.Fields[0].Name)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if described != "id" {
		t.Fatalf("Describe of the cursor as a portal: columns %q, want id", described)
	}
	mustExec(t, tree, "ROLLBACK")
	// FETCH handed out in batches (an Execute with a row limit), as
	// PostgreSQL does: the cursor moves by the whole FETCH at once.
	for _, c := range []*pgx.Conn{tree, plain} {
		mustExec(t, c, "BEGIN")
	}
	// The first 40 rows: the cursor of all would pass the memory bound.
	first := `SELECT id, name FROM curs WHERE id <= 40 ORDER BY id`
	mustExec(t, tree, "DECLARE b SCROLL CURSOR FOR "+first)
	mustExec(t, plain, "DECLARE b SCROLL CURSOR FOR "+strings.ReplaceAll(first, "FROM curs", "FROM curs_plain"))
	for _, batch := range []struct {
		sql     string
		maxRows []uint32
	}{
		{"FETCH 5 FROM b", []uint32{2, 2, 2, 2}},
		{"FETCH 1 FROM b", []uint32{0, 0}},
		{"FETCH BACKWARD 4 FROM b", []uint32{4, 1}},
		{"FETCH 3 FROM b", []uint32{10}},
		{"MOVE 2 IN b", []uint32{1}},
		{"FETCH ALL FROM b", []uint32{7, 7, 7, 7, 7, 7}},
	} {
		got, want := cursorBatches(t, tree, batch.sql, batch.maxRows), cursorBatches(t, plain, batch.sql, batch.maxRows)
		if got != want {
			t.Fatalf("%s in batches of %v\nthrough the tree: %s\non one table:     %s", batch.sql, batch.maxRows, got, want)
		}
	}
	for _, c := range []*pgx.Conn{tree, plain} {
		mustExec(t, c, "ROLLBACK")
	}
	binaryFetches(t, tree)
	if got := cursorStep(t, tree, "SELECT 1"); got != "?column? [[1]] SELECT 1" {
		t.Fatalf("the session after the refusals: %s", got)
	}
}

// TestTreeCursorWideFetch: a FETCH in binary of 40,000 rows of a tree
// cursor, 11 MB of values, more than the sockets' buffers hold, comes
// whole. Its conversion's Binds go to PostgreSQL in rounds, each read
// before the next (helperQuery); sent in one pipeline they stalled both
// ends until the backend's write timed out.
func TestTreeCursorWideFetch(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--max-merge-memory", "64MB")
	c := connect(t, p.DSN("lattice"))
	const rows = 40_000
	mustExec(t, c, `CREATE TABLE wide (id int PRIMARY KEY, pad text NOT NULL)`)
	mustExec(t, c, fmt.Sprintf(`INSERT INTO wide SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, %d) g`, rows))
	mustExec(t, c, `SELECT lattice_create_tree('wide', 'id', shard_count => 4)`)
	mustExec(t, c, "BEGIN")
	mustExec(t, c, "DECLARE w CURSOR FOR SELECT id, pad FROM wide ORDER BY id")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := c.PgConn().ExecParams(ctx, "FETCH ALL FROM w", nil, nil, nil, []int16{1}).Read()
	if r.Err != nil || len(r.Rows) != rows || r.CommandTag.String() != fmt.Sprintf("FETCH %d", rows) {
		t.Fatalf("FETCH ALL in binary: %v, %d rows, tag %q", r.Err, len(r.Rows), r.CommandTag)
	}
	sum := md5.Sum([]byte(fmt.Sprint(rows)))
	if last := r.Rows[rows-1]; string(last[1]) != strings.Repeat(hex.EncodeToString(sum[:]), 8) || len(last[0]) != 4 {
		t.Fatalf("the last row: %x", last)
	}
	mustExec(t, c, "ROLLBACK")
}

// binaryFetches: FETCH in binary, as pgx's Query sends it, gives the very
// bytes PostgreSQL's own cursor gives, for values of many types printed
// in other DateStyle and IntervalStyle settings than pgx's; a column
// without a binary input (an anonymous record) fails clearly.
func binaryFetches(t *testing.T, c *pgx.Conn) {
	t.Helper()
	treeWithTwin(t, c, "typed", `(id int PRIMARY KEY, n numeric, f float8, r real, b bool, d date, ts timestamp, tz timestamptz,
 iv interval, u uuid, j jsonb, by bytea, ia int[], ta text[], t text, ch char(4), bi bigint, tm time)`,
		` SELECT g, g * 1.25 - 3, g / 7.0, g / 3.0, g % 2 = 0, date '2024-02-27' + g, timestamp '2024-02-27 13:14:15.5' + g * interval '1 hour 1 second',
 timestamptz '2024-02-27 13:14:15+02' - g * interval '1 day 1 minute', g * interval '1 month 2 days 3 hours', md5(g::text)::uuid,
 jsonb_build_object('g', g, 'a', jsonb_build_array(g, 'x')), decode(md5(g::text), 'hex'), ARRAY[g, NULL, -g], ARRAY['a' || g, NULL, 'q"uote'],
 CASE WHEN g % 5 = 0 THEN NULL ELSE 'row ' || g END, 'c' || g % 10, g::bigint << 40, time '01:02:03.25' + g * interval '1 minute'
 FROM generate_series(1, 30) g`)
	ctx := context.Background()
	mustExec(t, c, "SET DateStyle = 'SQL, DMY'")
	mustExec(t, c, "SET IntervalStyle = 'sql_standard'")
	mustExec(t, c, "BEGIN")
	for _, name := range []string{"typed", "typed_plain"} {
		mustExec(t, c, "DECLARE "+name+" SCROLL CURSOR FOR SELECT * FROM "+name+" ORDER BY id")
	}
	for _, fetch := range []string{"FETCH 4 FROM typed", "FETCH BACKWARD 2 FROM typed", "FETCH ALL FROM typed", "FETCH ABSOLUTE 7 FROM typed"} {
		got, want := rawFetch(t, c, fetch), rawFetch(t, c, strings.Replace(fetch, "FROM typed", "FROM typed_plain", 1))
		if !strings.Contains(got, "format 1") || got != want {
			t.Fatalf("%s in binary\nthrough the tree: %s\non one table:     %s", fetch, got, want)
		}
	}
	// 75 kB of values: the conversion's Binds go in two rounds.
	wide := `SELECT id, rpad(name, 250, '.') FROM curs WHERE id <= 300 ORDER BY id`
	mustExec(t, c, "DECLARE wide CURSOR FOR "+wide)
	binary := []int16{1}
	got, fetched := strings.CutSuffix(describeResult(c.PgConn().ExecParams(ctx, "FETCH ALL FROM wide", nil, nil, nil, binary).Read()), "FETCH 300")
	want, selected := strings.CutSuffix(describeResult(c.PgConn().ExecParams(ctx, wide, nil, nil, nil, binary).Read()), "SELECT 300")
	if got != want || !fetched || !selected {
		t.Fatalf("FETCH ALL of 300 wide rows in binary\nfrom the cursor: %.300s\nfrom the SELECT: %.300s", got, want)
	}
	mustExec(t, c, "DECLARE rec CURSOR FOR SELECT id, ROW(id, t) FROM typed WHERE id < 3")
	rows, err := c.Query(ctx, "FETCH 1 FROM rec")
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
	}
	if pgCode(err) != "0A000" {
		t.Fatalf("a record column fetched in binary: %v, want 0A000", err)
	}
	mustExec(t, c, "ROLLBACK")
	mustExec(t, c, "RESET DateStyle")
	mustExec(t, c, "RESET IntervalStyle")
}

// cursorBatches binds sql in the extended protocol and executes it once
// per row limit in maxRows, in one pipeline, and describes each answer
// (fetchBatches binds all its statements before their Executes, and a
// FETCH's Bind must follow its cursor's DECLARE).
func cursorBatches(t *testing.T, c *pgx.Conn, sql string, maxRows []uint32) string {
	t.Helper()
	f := c.PgConn().Frontend()
	f.Send(&pgproto3.Parse{Query: sql})
	f.Send(&pgproto3.Bind{})
	for _, n := range maxRows {
		f.Send(&pgproto3.Execute{MaxRows: n})
	}
	f.Send(&pgproto3.Sync{})
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for {
		msg, err := c.PgConn().ReceiveMessage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			fmt.Fprintf(&b, "%q ", m.Values)
		case *pgproto3.CommandComplete:
			fmt.Fprintf(&b, "[%s] ", m.CommandTag)
		case *pgproto3.PortalSuspended:
			b.WriteString("[suspended] ")
		case *pgproto3.ErrorResponse:
			fmt.Fprintf(&b, "ERROR %s ", m.Code)
		case *pgproto3.ReadyForQuery:
			return b.String()
		}
	}
}

// rawFetch runs sql as pgx's Query does (binary results for the types it
// knows) and gives the columns' types and formats and the raw bytes of
// every value.
func rawFetch(t *testing.T, c *pgx.Conn, sql string) string {
	t.Helper()
	rows, err := c.Query(context.Background(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	var b strings.Builder
	for _, f := range rows.FieldDescriptions() {
		fmt.Fprintf(&b, "%s:%d format %d, ", f.Name, f.DataTypeOID, f.Format)
	}
	for rows.Next() {
		fmt.Fprintf(&b, "\n%x", rows.RawValues())
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return b.String()
}
