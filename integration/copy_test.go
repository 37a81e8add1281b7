package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// copyShards is the shard count of the trees in the COPY tests.
const copyShards = 16

// copyFrom runs COPY ... FROM STDIN with data through conn.
func copyFrom(c *pgx.Conn, sql string, data []byte) (int64, error) {
	tag, err := c.PgConn().CopyFrom(context.Background(), bytes.NewReader(data), sql)
	return tag.RowsAffected(), err
}

// copyTo runs COPY ... TO STDOUT through conn and returns the output.
func copyTo(c *pgx.Conn, sql string) ([]byte, int64, error) {
	var b bytes.Buffer
	tag, err := c.PgConn().CopyTo(context.Background(), &b, sql)
	return b.Bytes(), tag.RowsAffected(), err
}

// checkCopyPlacement checks on the nodes that every row of tree sits in the
// shard that PostgreSQL's own hash of its key puts it in, and returns the
// rows of the tree on the nodes.
func checkCopyPlacement(t *testing.T, tree, hash string) int64 {
	t.Helper()
	ctx := context.Background()
	var total int64
	for node := 0; node < 3; node++ {
		nc := connect(t, testNodeDSN(t, node))
		rows, err := nc.Query(ctx, `SELECT table_schema FROM information_schema.tables WHERE table_name = $1 AND table_schema LIKE 'lattice_s%' ORDER BY 1`, tree)
		if err != nil {
			t.Fatal(err)
		}
		schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, schema := range schemas {
			var idx int
			fmt.Sscanf(schema, "lattice_s%d", &idx)
			lo, hi := idx*4096/copyShards, (idx+1)*4096/copyShards-1
			var n, wrong int64
			q := fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE (%s & 4095) NOT BETWEEN %d AND %d) FROM %s.%s`, hash, lo, hi, schema, tree)
			if err := nc.QueryRow(ctx, q).Scan(&n, &wrong); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if wrong != 0 {
				t.Errorf("%s.%s on node %d holds %d rows of other slots", schema, tree, node, wrong)
			}
			total += n
		}
	}
	return total
}

// treeRows counts a tree's rows through the proxy (count(*) does not run
// over several shards).
func treeRows(c *pgx.Conn, tree string) (int, error) {
	rows, err := c.Query(context.Background(), `SELECT k FROM `+tree)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}

// sortedLines splits text output into lines and sorts them.
func sortedLines(b []byte) []string {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(b) == 0 {
		lines = nil
	}
	slices.Sort(lines)
	return lines
}

// binaryTuples checks a binary COPY stream's header and trailer and
// returns its tuples, sorted.
func binaryTuples(t *testing.T, b []byte) []string {
	t.Helper()
	sig := "PGCOPY\n\377\r\n\x00"
	if len(b) < 21 || string(b[:11]) != sig {
		t.Fatalf("binary COPY output does not start with the signature: %q", b[:min(len(b), 21)])
	}
	ext := int(binary.BigEndian.Uint32(b[15:]))
	b = b[19+ext:]
	var out []string
	for {
		if len(b) < 2 {
			t.Fatalf("binary COPY output ends without a trailer")
		}
		n := int(int16(binary.BigEndian.Uint16(b)))
		if n == -1 {
			if len(b) != 2 {
				t.Fatalf("%d bytes after the binary trailer", len(b)-2)
			}
			break
		}
		at := 2
		for f := 0; f < n; f++ {
			l := int(int32(binary.BigEndian.Uint32(b[at:])))
			at += 4
			if l > 0 {
				at += l
			}
		}
		out = append(out, string(b[:at]))
		b = b[at:]
	}
	slices.Sort(out)
	return out
}

// TestCopyFrom loads rows with COPY FROM STDIN in text, CSV and binary into
// trees with text and bigint keys, and the same rows into plain tables;
// then checks the placement on the nodes and compares the contents. A bad
// row anywhere leaves nothing committed on any node.
func TestCopyFrom(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	for _, tbl := range []string{"ct", "ci"} {
		key := "k text"
		if tbl == "ci" {
			key = "k bigint"
		}
		mustExec(t, c, `CREATE TABLE `+tbl+` (`+key+` PRIMARY KEY, v text, n integer)`)
		mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('%s', 'k', shard_count => %d)`, tbl, copyShards))
		mustExec(t, c, `CREATE TABLE `+tbl+`_plain (`+key+` PRIMARY KEY, v text, n integer)`)
	}

	var text bytes.Buffer
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&text, "t%d\tval\\t%d with \\\\ and \\n newline\t%d\n", i, i, i)
	}
	var csv bytes.Buffer
	csv.WriteString("k,v,n\n")
	for i := 0; i < 2000; i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&csv, "c%d,\"a, \"\"quoted\"\" value\",%d\n", i, i)
		case 1:
			fmt.Fprintf(&csv, "\"c%d\",\"multi\nline\r\nvalue\",\n", i)
		case 2:
			fmt.Fprintf(&csv, "c%d,,%d\n", i, i)
		default:
			fmt.Fprintf(&csv, "\"c,%d\",\"\",%d\n", i, i)
		}
	}
	var ints bytes.Buffer
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&ints, "%d\t\\N\t%d\n", i*7919-5000000, i)
	}
	fmt.Fprintf(&ints, "  9223372036854775807 \tmax\t1\n-9223372036854775808\tmin\t2\n+42\tplus\t3\n")
	var semi bytes.Buffer
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&semi, "'s%d';'it''s; here';NULLX\n", i)
	}
	semi.WriteString("'s-null';NULLX;5\n")

	good := []struct {
		name, sql string
		data      []byte
		rows      int64
	}{
		{"text", `COPY %s FROM STDIN`, text.Bytes(), 2000},
		{"csv header", `COPY %s (k, v, n) FROM STDIN WITH (FORMAT csv, HEADER true)`, csv.Bytes(), 2000},
		{"csv options", `COPY %s FROM STDIN (FORMAT csv, DELIMITER ';', QUOTE '''', ESCAPE '''', NULL 'NULLX')`, semi.Bytes(), 501},
		{"csv crlf", `COPY %s FROM STDIN (FORMAT csv)`, []byte("crlf1,\"a\r\nb\",1\r\ncrlf2,,2\r\n"), 2},
		{"text end marker", `COPY %s FROM STDIN`, []byte("e1\ta\t1\ne2\tb\t2\n\\.\nignored\n"), 2},
		{"text no final newline", `COPY %s (n, k) FROM STDIN`, []byte("1\tlast1\n2\tlast2"), 2},
		{"csv force not null", `COPY %s FROM STDIN (FORMAT csv, FORCE_NOT_NULL (k))`, []byte(",empty key,1\n"), 1},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			n, err := copyFrom(c, fmt.Sprintf(tc.sql, "ct"), tc.data)
			if err != nil || n != tc.rows {
				t.Fatalf("tree: COPY %d rows, %v; want %d", n, err, tc.rows)
			}
			n, err = copyFrom(c, fmt.Sprintf(tc.sql, "ct_plain"), tc.data)
			if err != nil || n != tc.rows {
				t.Fatalf("plain: COPY %d rows, %v; want %d", n, err, tc.rows)
			}
		})
	}
	t.Run("int keys", func(t *testing.T) {
		for _, tbl := range []string{"ci", "ci_plain"} {
			if n, err := copyFrom(c, `COPY `+tbl+` FROM STDIN`, ints.Bytes()); err != nil || n != 3003 {
				t.Fatalf("%s: COPY %d rows, %v", tbl, n, err)
			}
		}
	})
	t.Run("binary via pgx CopyFrom", func(t *testing.T) {
		for _, tbl := range []string{"ci", "ci_plain"} {
			var src [][]any
			for i := 0; i < 1500; i++ {
				src = append(src, []any{int64(i*104729 + 7), fmt.Sprintf("bin %d ' \\ \x01", i), int32(i)})
			}
			src = append(src, []any{int64(-1), nil, nil})
			n, err := c.CopyFrom(context.Background(), pgx.Identifier{tbl}, []string{"k", "v", "n"}, pgx.CopyFromRows(src))
			if err != nil || n != 1501 {
				t.Fatalf("%s: CopyFrom %d rows, %v", tbl, n, err)
			}
		}
		for _, tbl := range []string{"ct", "ct_plain"} {
			var src [][]any
			for i := 0; i < 1500; i++ {
				src = append(src, []any{fmt.Sprintf("b-ключ-%d", i), "x", int32(i)})
			}
			n, err := c.CopyFrom(context.Background(), pgx.Identifier{tbl}, []string{"v", "k", "n"}, pgx.CopyFromFunc(func() func() ([]any, error) {
				i := 0
				return func() ([]any, error) {
					if i == len(src) {
						return nil, nil
					}
					i++
					return []any{src[i-1][1], src[i-1][0], src[i-1][2]}, nil
				}
			}()))
			if err != nil || n != 1500 {
				t.Fatalf("%s: CopyFrom %d rows, %v", tbl, n, err)
			}
		}
	})

	// Bad rows in the middle: nothing of the COPY stays anywhere.
	before := map[string]int64{"ct": checkCopyPlacement(t, "ct", "hashtextextended(k, 0)"), "ci": checkCopyPlacement(t, "ci", "hashint8extended(k, 0)")}
	var manyThenBad bytes.Buffer
	for i := 0; i < 20000; i++ {
		fmt.Fprintf(&manyThenBad, "bad%d\tv\t%d\n", i, i)
	}
	manyThenBad.WriteString("\\N\tnull key\t1\n")
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&manyThenBad, "after%d\tv\t%d\n", i, i)
	}
	bad := []struct {
		name, tree, sql string
		data            []byte
		code            string
	}{
		{"null key after many rows", "ct", `COPY ct FROM STDIN`, manyThenBad.Bytes(), "23502"},
		{"csv null key", "ct", `COPY ct FROM STDIN (FORMAT csv)`, []byte("x1,a,1\n,b,2\nx3,c,3\n"), "23502"},
		{"bad bigint", "ci", `COPY ci FROM STDIN`, []byte("1000001\ta\t1\n12abc\tb\t2\n1000003\tc\t3\n"), "22P02"},
		{"bigint out of range", "ci", `COPY ci FROM STDIN`, []byte("1000001\ta\t1\n9223372036854775808\tb\t2\n"), "22003"},
		{"duplicate key on a shard", "ci", `COPY ci FROM STDIN`, []byte("2000001\ta\t1\n2000002\tb\t2\n2000001\tc\t3\n"), "23505"},
		{"bad value in another column", "ci", `COPY ci FROM STDIN`, []byte("3000001\ta\t1\n3000002\tb\tnot a number\n"), "22P02"},
		{"unterminated quote", "ct", `COPY ct FROM STDIN (FORMAT csv)`, []byte("u1,a,1\nu2,\"open,2\n"), "22P04"},
		{"missing key column data", "ci", `COPY ci (n, k) FROM STDIN`, []byte("1\t4000001\n2\n"), "22P04"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := copyFrom(c, tc.sql, tc.data)
			if got := pgCode(err); got != tc.code {
				t.Fatalf("COPY error %v (SQLSTATE %q), want SQLSTATE %s", err, got, tc.code)
			}
			// The connection is usable after the failed COPY.
			var one int
			if err := c.QueryRow(context.Background(), `SELECT 1`).Scan(&one); err != nil {
				t.Fatalf("after the failed COPY: %v", err)
			}
		})
	}
	// An error a shard's COPY reports names the client's line, as one
	// table's COPY does: each shard numbers the rows it was sent from 1.
	var wide bytes.Buffer
	wide.WriteString("k,v,n\n")
	for i := 0; i < 60000; i++ {
		fmt.Fprintf(&wide, "w%d,%s,%d\n", i, strings.Repeat("p", 50), i)
	}
	wide.WriteString("wbad,v,not a number\n")
	for _, tc := range []struct {
		name, sql string
		data      []byte
	}{
		{"a column, text", `COPY %s FROM STDIN`, []byte("3000001\ta\t1\n3000002\tb\t2\n3000003\tc\tx\n")},
		{"a duplicate key", `COPY %s FROM STDIN`, []byte("2000001\ta\t1\n2000002\tb\t2\n2000001\tc\t3\n")},
		{"csv with a header, past several COPYs of each shard", `COPY %s FROM STDIN (FORMAT csv, HEADER true)`, wide.Bytes()},
	} {
		t.Run("line of "+tc.name, func(t *testing.T) {
			tree, plain := "ci", "ci_plain"
			if strings.HasPrefix(tc.name, "csv") {
				tree, plain = "ct", "ct_plain"
			}
			var got, want *pgconn.PgError
			_, terr := copyFrom(c, fmt.Sprintf(tc.sql, tree), tc.data)
			_, perr := copyFrom(c, fmt.Sprintf(tc.sql, plain), tc.data)
			if !errors.As(terr, &got) || !errors.As(perr, &want) {
				t.Fatalf("tree: %v; plain: %v; want an error of each", terr, perr)
			}
			if wantWhere := strings.Replace(want.Where, plain, tree, 1); got.Code != want.Code || got.Where != wantWhere {
				t.Fatalf("tree: %s %q\nplain: %s %q", got.Code, got.Where, want.Code, wantWhere)
			}
		})
	}
	t.Run("client CopyFail", func(t *testing.T) {
		r := io.MultiReader(bytes.NewReader(manyThenBad.Bytes()[:100000]), iotest.ErrReader(errors.New("client gave up")))
		_, err := c.PgConn().CopyFrom(context.Background(), r, `COPY ct FROM STDIN`)
		if code := pgCode(err); code != "57014" {
			t.Fatalf("COPY error %v (SQLSTATE %q), want 57014", err, code)
		}
	})
	after := map[string]int64{"ct": checkCopyPlacement(t, "ct", "hashtextextended(k, 0)"), "ci": checkCopyPlacement(t, "ci", "hashint8extended(k, 0)")}
	for tree, n := range before {
		if after[tree] != n {
			t.Errorf("failed COPYs left rows in %s: %d rows before, %d after", tree, n, after[tree])
		}
	}

	// Unsupported options are refused with 0A000; a server file, which
	// reaches outside the tenant, with 42501.
	for sql, code := range map[string]string{`COPY ct FROM STDIN (FREEZE)`: "0A000", `COPY ct FROM STDIN (ENCODING 'LATIN1')`: "0A000", `COPY ct FROM STDIN (FORMAT csv, HEADER MATCH)`: "0A000", `COPY ct FROM '/tmp/x'`: "42501"} {
		if _, err := copyFrom(c, sql, nil); pgCode(err) != code {
			t.Errorf("%s: %v, want SQLSTATE %s", sql, err, code)
		}
	}

	// The trees hold exactly the rows of the plain tables.
	for _, tbl := range []string{"ct", "ci"} {
		want, err := queryStrings(t, c, `SELECT k, v, n FROM `+tbl+`_plain`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := queryStrings(t, c, `SELECT k, v, n FROM `+tbl)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %d rows through the tree, %d in the plain table, or different values", tbl, len(got), len(want))
		}
		hash := "hashtextextended(k, 0)"
		if tbl == "ci" {
			hash = "hashint8extended(k, 0)"
		}
		if n := checkCopyPlacement(t, tbl, hash); n != int64(len(want)) {
			t.Errorf("%s: %d rows on the nodes, want %d", tbl, n, len(want))
		}
	}

	// COPY TO in every format gives exactly the plain table's rows.
	to := []struct {
		name, sql string
		binary    bool
	}{
		{"text", `COPY %s TO STDOUT`, false},
		{"text columns", `COPY %s (n, k) TO STDOUT`, false},
		{"csv", `COPY %s TO STDOUT (FORMAT csv, FORCE_QUOTE *)`, false},
		{"binary", `COPY %s TO STDOUT (FORMAT binary)`, true},
		{"query", `COPY (SELECT k, n FROM %s WHERE n > 100) TO STDOUT (FORMAT csv)`, false},
		{"query binary", `COPY (SELECT v FROM %s WHERE n < 50) TO STDOUT (FORMAT binary)`, true},
	}
	for _, tbl := range []string{"ct", "ci"} {
		for _, tc := range to {
			t.Run("to "+tbl+" "+tc.name, func(t *testing.T) {
				got, gn, err := copyTo(c, fmt.Sprintf(tc.sql, tbl))
				if err != nil {
					t.Fatalf("tree: %v", err)
				}
				want, wn, err := copyTo(c, fmt.Sprintf(tc.sql, tbl+"_plain"))
				if err != nil {
					t.Fatalf("plain: %v", err)
				}
				if gn != wn {
					t.Errorf("COPY %d from the tree, %d from the plain table", gn, wn)
				}
				if tc.binary {
					if g, w := binaryTuples(t, got), binaryTuples(t, want); !slices.Equal(g, w) {
						t.Errorf("%d tuples from the tree, %d from the plain table, or different", len(g), len(w))
					}
					return
				}
				if g, w := sortedLines(got), sortedLines(want); !slices.Equal(g, w) {
					t.Errorf("%d lines from the tree, %d from the plain table, or different", len(g), len(w))
				}
			})
		}
	}
	t.Run("to csv header once", func(t *testing.T) {
		got, _, err := copyTo(c, `COPY ct (k, n) TO STDOUT (FORMAT csv, HEADER)`)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(got), "\n")
		if lines[0] != "k,n" || strings.Count(string(got), "\nk,n\n") != 0 {
			t.Errorf("want one header line k,n first; got first line %q and %d more", lines[0], strings.Count(string(got), "\nk,n\n"))
		}
	})
	t.Run("to query on one shard", func(t *testing.T) {
		got, n, err := copyTo(c, `COPY (SELECT k, n FROM ci WHERE k = 42) TO STDOUT`)
		if err != nil || n != 1 || string(got) != "42\t3\n" {
			t.Errorf("got %q, COPY %d, %v", got, n, err)
		}
	})
	// A query whose rows several shards combine: PostgreSQL runs its final
	// step as the COPY, so the output is byte for byte the plain table's
	// (sorted first where the query leaves the order open).
	combined := []struct {
		name, sql string
		ordered   bool
	}{
		{"order by", `COPY (SELECT k, v FROM {t} ORDER BY k) TO STDOUT`, true},
		{"limit offset", `COPY (SELECT k, n FROM {t} ORDER BY n DESC NULLS LAST, k LIMIT 7 OFFSET 3) TO STDOUT (FORMAT csv, HEADER)`, true},
		{"limit by a column not copied", `COPY (SELECT k FROM {t} ORDER BY v, k LIMIT 4) TO STDOUT`, true},
		{"aggregates", `COPY (SELECT count(*), count(n), sum(n), min(k), max(v) FROM {t}) TO STDOUT (FORMAT csv, HEADER)`, true},
		{"group by", `COPY (SELECT n % 7 AS g, count(*), string_agg(k::text, ',' ORDER BY k) FROM {t} GROUP BY 1 ORDER BY 1 NULLS FIRST) TO STDOUT (FORMAT csv, HEADER, FORCE_QUOTE *)`, true},
		{"distinct", `COPY (SELECT DISTINCT v FROM {t}) TO STDOUT`, false},
		{"window", `COPY (SELECT k, rank() OVER (ORDER BY n DESC NULLS LAST, k) FROM {t} WHERE n < 300) TO STDOUT`, false},
		{"set operation", `COPY (SELECT n FROM {t} WHERE n < 10 UNION SELECT n FROM {t} WHERE n > 1990 ORDER BY 1) TO STDOUT`, true},
		{"binary", `COPY (SELECT n, count(*) FROM {t} GROUP BY n ORDER BY n NULLS FIRST) TO STDOUT (FORMAT binary)`, true},
		{"no rows", `COPY (SELECT k FROM {t} WHERE n < 0 ORDER BY k) TO STDOUT (FORMAT csv, HEADER)`, true},
		{"no rows aggregated", `COPY (SELECT count(*), max(k) FROM {t} WHERE n < 0) TO STDOUT`, true},
	}
	checkCombinedOn := func(t *testing.T, c *pgx.Conn, sql string, ordered bool) {
		t.Helper()
		for _, tbl := range []string{"ct", "ci"} {
			got, gn, err := copyTo(c, strings.ReplaceAll(sql, "{t}", tbl))
			if err != nil {
				t.Fatalf("%s: tree: %v", tbl, err)
			}
			want, wn, err := copyTo(c, strings.ReplaceAll(sql, "{t}", tbl+"_plain"))
			if err != nil {
				t.Fatalf("%s: plain: %v", tbl, err)
			}
			if gn != wn {
				t.Errorf("%s: COPY %d from the tree, %d from the plain table", tbl, gn, wn)
			}
			if !ordered {
				got, want = []byte(strings.Join(sortedLines(got), "\n")), []byte(strings.Join(sortedLines(want), "\n"))
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: the tree gives\n%.300q\nthe plain table\n%.300q", tbl, got, want)
			}
		}
	}
	checkCombined := func(t *testing.T, sql string, ordered bool) { t.Helper(); checkCombinedOn(t, c, sql, ordered) }
	for _, tc := range combined {
		t.Run("to combined "+tc.name, func(t *testing.T) { checkCombined(t, tc.sql, tc.ordered) })
	}
	t.Run("to combined with a setting no backend has", func(t *testing.T) {
		// The final step's backend first takes the session's settings,
		// whose set_config calls answer with rows of their own.
		cfg, err := pgx.ParseConfig(p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = "copy combined"
		app, err := pgx.ConnectConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer app.Close(context.Background())
		checkCombinedOn(t, app, `COPY (SELECT n, k FROM {t} ORDER BY n, k LIMIT 3) TO STDOUT`, true)
	})
	t.Run("to combined in a transaction", func(t *testing.T) {
		mustExec(t, c, `BEGIN`)
		defer mustExec(t, c, `ROLLBACK`)
		for _, tbl := range []string{"ct", "ci", "ct_plain", "ci_plain"} {
			key := "'a-first'"
			if strings.HasPrefix(tbl, "ci") {
				key = "-99999999"
			}
			mustExec(t, c, `INSERT INTO `+tbl+` VALUES (`+key+`, 'new', -1)`)
		}
		checkCombined(t, `COPY (SELECT k, n FROM {t} ORDER BY n NULLS LAST, k LIMIT 3) TO STDOUT`, true)
		checkCombined(t, `COPY (SELECT count(*), min(n) FROM {t}) TO STDOUT`, true)
	})
}

// TestCopyTransaction runs COPY inside a client transaction: rows that all
// go to the transaction's node load and commit with it; rows for another
// node are refused with 0A000 and abort the transaction.
func TestCopyTransaction(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE tx (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('tx', 'k', shard_count => %d)`, copyShards))
	// Keys of shard 0 (slots 0-255) and of shard 1 (on another node), by PostgreSQL's own hash.
	nc := connect(t, testNodeDSN(t, 0))
	keysOf := func(lo, hi int) []int64 {
		rows, err := nc.Query(ctx, `SELECT i FROM generate_series(1, 20000) i WHERE (hashint8extended(i, 0) & 4095) BETWEEN $1 AND $2 LIMIT 50`, lo, hi)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	shard0, shard1 := keysOf(0, 255), keysOf(256, 511)
	lines := func(keys []int64) []byte {
		var b bytes.Buffer
		for _, k := range keys {
			fmt.Fprintf(&b, "%d\tv%d\n", k, k)
		}
		return b.Bytes()
	}

	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `INSERT INTO tx VALUES ($1, 'first')`, shard0[0])
	if n, err := copyFrom(c, `COPY tx FROM STDIN`, lines(shard0[1:])); err != nil || n != int64(len(shard0)-1) {
		t.Fatalf("COPY in the transaction: %d, %v", n, err)
	}
	mustExec(t, c, `COMMIT`)
	if n, err := treeRows(c, "tx"); err != nil || n != len(shard0) {
		t.Fatalf("after commit: %d rows, %v; want %d", n, err, len(shard0))
	}

	// Shard 0 is on the first node, shard 1 on the second: a COPY joins
	// the second node to the transaction, which rolls back or commits (with
	// two-phase commit) as a whole.
	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `DELETE FROM tx WHERE k = $1`, shard0[0])
	if n, err := copyFrom(c, `COPY tx FROM STDIN`, lines(shard1)); err != nil || n != int64(len(shard1)) {
		t.Fatalf("COPY for another node inside a transaction: %d, %v", n, err)
	}
	mustExec(t, c, `ROLLBACK`)
	if n, err := treeRows(c, "tx"); err != nil || n != len(shard0) {
		t.Fatalf("after rollback: %d rows, %v; want %d", n, err, len(shard0))
	}

	// A bad row aborts the whole transaction, on every node.
	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `DELETE FROM tx WHERE k = $1`, shard0[0])
	if _, err := copyFrom(c, `COPY tx FROM STDIN`, append(lines(shard1), []byte("\\N\tnull key\n")...)); pgCode(err) != "23502" {
		t.Fatalf("COPY with a NULL key in a transaction: %v, want 23502", err)
	}
	var one int
	if err := c.QueryRow(ctx, `SELECT 1`).Scan(&one); pgCode(err) != "25P02" {
		t.Fatalf("after the failed COPY the transaction must be aborted; SELECT 1 gave %v", err)
	}
	mustExec(t, c, `ROLLBACK`)

	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `DELETE FROM tx WHERE k = $1`, shard0[0])
	if n, err := copyFrom(c, `COPY tx FROM STDIN`, lines(shard1)); err != nil || n != int64(len(shard1)) {
		t.Fatalf("COPY for another node inside a transaction: %d, %v", n, err)
	}
	mustExec(t, c, `COMMIT`)
	if n, err := treeRows(c, "tx"); err != nil || n != len(shard0)-1+len(shard1) {
		t.Fatalf("after commit: %d rows, %v; want %d", n, err, len(shard0)-1+len(shard1))
	}
	for i := range 3 {
		var prepared int
		if err := connect(t, testNodeDSN(t, i)).QueryRow(ctx, `SELECT count(*) FROM pg_prepared_xacts`).Scan(&prepared); err != nil || prepared != 0 {
			t.Fatalf("node %d: %d prepared transactions left (%v)", i, prepared, err)
		}
	}
}

// TestCopyPsql round-trips files through psql's \copy, text and CSV: the file
// read back holds the same lines as the one loaded.
func TestCopyPsql(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE ps (k text PRIMARY KEY, v text, n integer)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('ps', 'k', shard_count => %d)`, copyShards))
	dir := t.TempDir()
	var textIn, csvIn bytes.Buffer
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&textIn, "p%d\t%s\t%d\n", i, strings.NewReplacer("\\", "\\\\", "\t", "\\t", "\n", "\\n").Replace(placementValue(i)), i)
		fmt.Fprintf(&csvIn, "q%d,\"%s\",%d\n", i, strings.ReplaceAll(placementValue(i), `"`, `""`), i)
	}
	for _, tc := range []struct {
		name, opts, where string
		data              []byte
	}{
		{"text", "", "k LIKE 'p%'", textIn.Bytes()},
		{"csv", "(FORMAT csv, FORCE_QUOTE (v))", "k LIKE 'q%'", csvIn.Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := filepath.Join(dir, tc.name+".in")
			out := filepath.Join(dir, tc.name+".out")
			if err := os.WriteFile(in, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			fromOpts := strings.ReplaceAll(tc.opts, ", FORCE_QUOTE (v)", "")
			psql(t, p.DSN("lattice"), fmt.Sprintf(`\copy ps FROM '%s' %s`, in, fromOpts))
			psql(t, p.DSN("lattice"), fmt.Sprintf(`\copy (SELECT * FROM ps WHERE %s) TO '%s' %s`, tc.where, out, tc.opts))
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			// CSV lines may hold quoted newlines: compare whole files' sorted records by line.
			if g, w := sortedLines(got), sortedLines(tc.data); !slices.Equal(g, w) {
				t.Errorf("read back %d lines, loaded %d, or different", len(g), len(w))
			}
		})
	}
	t.Run("whole table", func(t *testing.T) {
		out := filepath.Join(dir, "all.out")
		psql(t, p.DSN("lattice"), fmt.Sprintf(`\copy ps TO '%s' (FORMAT csv)`, out))
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := treeRows(c, "ps"); err != nil || n != 6000 {
			t.Fatalf("count %d, %v", n, err)
		}
		if !bytes.HasPrefix(got, []byte("p")) && !bytes.HasPrefix(got, []byte("q")) {
			t.Errorf("unexpected output start %q", got[:min(20, len(got))])
		}
	})
}

func psql(t *testing.T, dsn, command string) string {
	t.Helper()
	out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", command).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -c %q: %v\n%s", command, err, out)
	}
	return string(out)
}

// TestCopyLarge streams 500,000 rows through pgx's CopyFrom (binary) and
// reads them back with COPY TO.
func TestCopyLarge(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE big (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('big', 'k', shard_count => %d)`, copyShards))
	const total = 500000
	i := 0
	n, err := c.CopyFrom(context.Background(), pgx.Identifier{"big"}, []string{"k", "v"}, pgx.CopyFromFunc(func() ([]any, error) {
		if i == total {
			return nil, nil
		}
		i++
		return []any{int64(i), "row payload"}, nil
	}))
	if err != nil || n != total {
		t.Fatalf("CopyFrom: %d, %v", n, err)
	}
	if got := checkCopyPlacement(t, "big", "hashint8extended(k, 0)"); got != total {
		t.Fatalf("%d rows on the nodes, want %d", got, total)
	}
	out, rows, err := copyTo(c, `COPY big (k) TO STDOUT`)
	if err != nil || rows != total {
		t.Fatalf("COPY TO: %d rows, %v", rows, err)
	}
	lines := strings.Count(string(out), "\n")
	if lines != total {
		t.Fatalf("COPY TO gave %d lines, want %d", lines, total)
	}
}

// TestCopyExtended runs COPY of a tree through the extended protocol as
// drivers such as rust-postgres do: Parse, Bind, Execute and Sync, then the
// data, CopyDone and another Sync (PostgreSQL ignores a Sync during COPY).
func TestCopyExtended(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE ext (k text PRIMARY KEY, v text)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('ext', 'k', shard_count => %d)`, copyShards))

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
	// expect reads messages up to one of type want and returns them all.
	expect := func(want pgproto3.BackendMessage) []pgproto3.BackendMessage {
		t.Helper()
		var got []pgproto3.BackendMessage
		for {
			hj.Conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			m, err := fe.Receive()
			if err != nil {
				t.Fatalf("waiting for %T: %v (got %d messages)", want, err, len(got))
			}
			// Messages point into the read buffer: keep copies.
			switch m := m.(type) {
			case *pgproto3.ErrorResponse:
				cp := *m
				got = append(got, &cp)
			case *pgproto3.CommandComplete:
				got = append(got, &pgproto3.CommandComplete{CommandTag: bytes.Clone(m.CommandTag)})
			case *pgproto3.CopyData:
				got = append(got, &pgproto3.CopyData{Data: bytes.Clone(m.Data)})
			default:
				got = append(got, m)
			}
			if fmt.Sprintf("%T", m) == fmt.Sprintf("%T", want) {
				return got
			}
		}
	}
	errCode := func(msgs []pgproto3.BackendMessage) string {
		for _, m := range msgs {
			if e, ok := m.(*pgproto3.ErrorResponse); ok {
				return e.Code
			}
		}
		return ""
	}
	rows := func(prefix string, n int, bad bool) []byte {
		var b bytes.Buffer
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "%s%d\tv%d\n", prefix, i, i)
			if bad && i == n/2 {
				b.WriteString("\\N\tnull key\n")
			}
		}
		return b.Bytes()
	}
	copyIn := func(data []byte, flush pgproto3.FrontendMessage) []pgproto3.BackendMessage {
		t.Helper()
		fe.Send(&pgproto3.Parse{Query: "COPY ext FROM STDIN"})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{})
		fe.Send(flush)
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		if msgs := expect(&pgproto3.CopyInResponse{}); errCode(msgs) != "" {
			t.Fatalf("before CopyInResponse: %v", msgs)
		}
		for len(data) > 0 {
			n := min(len(data), 1000)
			fe.Send(&pgproto3.CopyData{Data: data[:n]})
			data = data[n:]
		}
		fe.Send(&pgproto3.CopyDone{})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		return expect(&pgproto3.ReadyForQuery{})
	}
	for _, tc := range []struct {
		name  string
		flush pgproto3.FrontendMessage
	}{{"sync", &pgproto3.Sync{}}, {"flush", &pgproto3.Flush{}}} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := copyIn(rows(tc.name, 1000, false), tc.flush)
			var tag string
			for _, m := range msgs {
				if cc, ok := m.(*pgproto3.CommandComplete); ok {
					tag = string(cc.CommandTag)
				}
			}
			if tag != "COPY 1000" || errCode(msgs) != "" {
				t.Fatalf("got %s, want COPY 1000", describeMsgs(msgs))
			}
			msgs = copyIn(rows(tc.name+"-bad", 1000, true), tc.flush)
			if code := errCode(msgs); code != "23502" {
				t.Fatalf("bad row: got %v, want SQLSTATE 23502", msgs)
			}
		})
	}
	if n, err := treeRows(c, "ext"); err != nil || n != 2000 {
		t.Fatalf("%d rows in the tree, %v; want 2000", n, err)
	}
	if got := checkCopyPlacement(t, "ext", "hashtextextended(k, 0)"); got != 2000 {
		t.Fatalf("%d rows on the nodes, want 2000", got)
	}

	// COPY TO through the extended protocol.
	fe.Send(&pgproto3.Parse{Query: "COPY ext TO STDOUT (FORMAT csv)"})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Describe{ObjectType: 'P'})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	msgs := expect(&pgproto3.ReadyForQuery{})
	lines, tag := 0, ""
	for _, m := range msgs {
		switch m := m.(type) {
		case *pgproto3.CopyData:
			lines += bytes.Count(m.Data, []byte("\n"))
		case *pgproto3.CommandComplete:
			tag = string(m.CommandTag)
		}
	}
	if lines != 2000 || tag != "COPY 2000" || errCode(msgs) != "" {
		t.Fatalf("COPY TO: %d lines, tag %q, error %q", lines, tag, errCode(msgs))
	}
}

func describeMsgs(msgs []pgproto3.BackendMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "%T %+v; ", m, m)
	}
	return b.String()
}

// TestCopyTagCountsRows: the tag of a COPY FROM, and of an INSERT ... SELECT
// whose rows the proxy loads, counts the rows loaded and nothing else. A
// client whose startup settings differ from the nodes' defaults has them
// replayed on each backend it takes, each with set_config, whose "SELECT 1"
// was added to the count: 101 rows for 100 (pgx's CopyFrom returns it).
func TestCopyTagCountsRows(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE tagged (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('tagged', 'k', shard_count => %d)`, copyShards))
	var rows bytes.Buffer
	for i := range 100 {
		fmt.Fprintf(&rows, "%d\tv%d\n", i, i)
	}
	for i := range 3 {
		cfg, err := pgx.ParseConfig(p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		// A name no backend has yet: every backend the load takes gets it.
		cfg.RuntimeParams["application_name"] = fmt.Sprintf("tagged %d", i)
		app, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, app, `TRUNCATE tagged`)
		if n, err := copyFrom(app, `COPY tagged FROM STDIN`, rows.Bytes()); err != nil || n != 100 {
			t.Fatalf("COPY of 100 rows: tag counts %d, %v", n, err)
		}
		tag, err := app.Exec(ctx, `INSERT INTO tagged (k, v) SELECT g, 'pulled' FROM generate_series(1000, 1049) g`)
		if err != nil || tag.String() != "INSERT 0 50" {
			t.Fatalf("INSERT ... SELECT of 50 rows: %v, %v", tag, err)
		}
		if n := countWhere(t, app, "tagged", "true"); n != 150 {
			t.Fatalf("%d rows in the tree, want 150", n)
		}
		app.Close(ctx)
	}
}

// TestCopyCombinedBound: the rows a COPY gathers for its order are bounded
// by --max-merge-memory, with an error that says so; a LIMIT cut on the
// nodes stays under it, and the session goes on.
func TestCopyCombinedBound(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--max-merge-memory", "100000")
	c := connect(t, p.DSN("lattice"))
	for _, tbl := range []string{"cb", "cb_plain"} {
		mustExec(t, c, `CREATE TABLE `+tbl+` (k bigint PRIMARY KEY, v text)`)
		mustExec(t, c, `INSERT INTO `+tbl+` SELECT g, repeat('x', 100) || g FROM generate_series(1, 5000) g`)
	}
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('cb', 'k', shard_count => %d)`, copyShards))
	_, _, err := copyTo(c, `COPY (SELECT k, v FROM cb ORDER BY v) TO STDOUT`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "54000" || !strings.Contains(pe.Message, "COPY (SELECT ... ORDER BY ...)") {
		t.Fatalf("COPY of 500 kB of rows in order past --max-merge-memory 100000: %v, want 54000 naming the COPY's order", err)
	}
	const limited = `COPY (SELECT k, v FROM %s ORDER BY v DESC LIMIT 20) TO STDOUT (FORMAT csv)`
	got, _, err := copyTo(c, fmt.Sprintf(limited, "cb"))
	if err != nil {
		t.Fatalf("COPY cut to 20 rows on the nodes: %v", err)
	}
	want, _, err := copyTo(c, fmt.Sprintf(limited, "cb_plain"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the tree gives\n%.300q\nthe plain table\n%.300q", got, want)
	}
}
