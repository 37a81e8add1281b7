package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// connect opens a pgx connection and closes it with the test.
func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func mustExec(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), mustExecTimeout)
	defer cancel()
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// mustExecTimeout bounds one statement of mustExec: a statement stuck on a
// lock the test itself holds fails the test in minutes, not at the
// binary's timeout with every test after it.
const mustExecTimeout = 5 * time.Minute

// placementValue is a row's payload: varied bytes (quotes, backslashes,
// multibyte, long) so a byte-for-byte read-back means something.
func placementValue(i int) string {
	switch i % 5 {
	case 0:
		return fmt.Sprintf("plain %d", i)
	case 1:
		return fmt.Sprintf("quote ' and \\ backslash %d", i)
	case 2:
		return fmt.Sprintf("żółw 🐢 %d", i)
	case 3:
		return strings.Repeat("x", 500+i%700)
	}
	return fmt.Sprintf("tab\tnewline\n%d", i)
}

func placementKey(i int) string {
	if i%7 == 0 {
		return fmt.Sprintf("ключ-%d", i)
	}
	return fmt.Sprintf("k%06d", i)
}

// TestPlacement inserts 100,000 rows through the proxy, half with pgx
// (extended protocol, pipelined) and half with psql (simple protocol), then
// checks on the nodes directly that each row is in exactly the shard that
// PostgreSQL's own hash puts it in, and reads every row back through the proxy.
func TestPlacement(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE placed (k text PRIMARY KEY, v text NOT NULL, n integer)`)
	mustExec(t, c, `SELECT lattice_create_tree('placed', 'k', shard_count => 64)`)

	const total = 100000
	const half = total / 2
	// pgx: batches of pipelined single-row INSERTs with parameters.
	for start := 0; start < half; start += 1000 {
		b := &pgx.Batch{}
		for i := start; i < start+1000; i++ {
			b.Queue(`INSERT INTO placed (k, v, n) VALUES ($1, $2, $3)`, placementKey(i), placementValue(i), i)
		}
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("batch at %d: %v", start, err)
		}
	}
	// psql: the simple protocol, literal values, one statement per round
	// trip. Four clients at once: alone, 50,000 round trips took up to
	// 6 min of a loaded make test (25 s on a quiet machine).
	const psqls = 4
	scripts := make([]bytes.Buffer, psqls)
	for i := half; i < total; i++ {
		fmt.Fprintf(&scripts[i%psqls], "INSERT INTO placed VALUES (%s, %s, %d);\n", sqlLiteral(placementKey(i)), sqlLiteral(placementValue(i)), i)
	}
	var wg sync.WaitGroup
	for i := range scripts {
		wg.Add(1)
		go func() { defer wg.Done(); runPsqlScript(t, p.DSN("lattice"), scripts[i].Bytes()) }()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// On the nodes: every row's slot lies in its shard's ranges; counts add up.
	var placed int64
	for node := 0; node < 2; node++ {
		nc := connect(t, testNodeDSN(t, node))
		rows, err := nc.Query(ctx, `SELECT o.schema_name FROM information_schema.schemata o WHERE o.schema_name LIKE 'lattice_s%' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(schemas) != 32 {
			t.Errorf("node %d holds %d shard schemas, want 32", node, len(schemas))
		}
		for _, schema := range schemas {
			var idx int
			fmt.Sscanf(schema, "lattice_s%d", &idx)
			lo, hi := idx*4096/64, (idx+1)*4096/64-1
			var n, wrong int64
			q := fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE (hashtextextended(k, 0) & 4095) NOT BETWEEN %d AND %d) FROM %s.placed`, lo, hi, schema)
			if err := nc.QueryRow(ctx, q).Scan(&n, &wrong); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if wrong != 0 {
				t.Errorf("%s on node %d holds %d rows of other slots", schema, node, wrong)
			}
			placed += n
		}
	}
	if placed != total {
		t.Fatalf("nodes hold %d rows, want %d", placed, total)
	}

	// Every row reads back byte for byte through the proxy.
	for start := 0; start < total; start += 1000 {
		b := &pgx.Batch{}
		for i := start; i < start+1000; i++ {
			b.Queue(`SELECT v, n FROM placed WHERE k = $1`, placementKey(i))
		}
		br := c.SendBatch(ctx, b)
		for i := start; i < start+1000; i++ {
			var v string
			var n int
			if err := br.QueryRow().Scan(&v, &n); err != nil {
				t.Fatalf("read back %s: %v", placementKey(i), err)
			}
			if v != placementValue(i) || n != i {
				t.Fatalf("row %s reads back as (%q, %d)", placementKey(i), v, n)
			}
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A simple-protocol read of a literal key.
	var v string
	if err := c.QueryRow(ctx, `SELECT v FROM placed WHERE k = 'k000003'`, pgx.QueryExecModeSimpleProtocol).Scan(&v); err != nil || v != placementValue(3) {
		t.Fatalf("simple read: %q, %v", v, err)
	}
}

func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// runPsqlScript runs psql -f on script, failing on the first error. It may
// run in a goroutine of its own: it fails the test with Errorf.
func runPsqlScript(t testing.TB, dsn string, script []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "script.sql")
	if err := os.WriteFile(f, script, 0o644); err != nil {
		t.Error(err)
		return ""
	}
	cmd := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", f)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("psql: %v\n%s", err, tail(out, 2000))
	}
	return string(out)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

// TestKeyTypes checks routing of int and uuid keys, with literals of several
// forms and with parameters, against PostgreSQL's own placement.
func TestKeyTypes(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE ints (id bigint PRIMARY KEY, v text)`)
	mustExec(t, c, `SELECT lattice_create_tree('ints', 'id', shard_count => 8)`)
	mustExec(t, c, `CREATE TABLE uuids (id uuid PRIMARY KEY, v text)`)
	mustExec(t, c, `SELECT lattice_create_tree('uuids', 'id', shard_count => 8)`)
	ids := []int64{0, 1, -1, 42, 2147483647, -2147483648, 9223372036854775807, -9223372036854775808, 123456789012}
	for i, id := range ids {
		if i%2 == 0 {
			mustExec(t, c, `INSERT INTO ints VALUES ($1, $2)`, id, fmt.Sprint(id))
		} else {
			mustExec(t, c, fmt.Sprintf(`INSERT INTO ints VALUES (%d, '%d')`, id, id))
		}
	}
	for _, id := range ids {
		var v string
		if err := c.QueryRow(ctx, `SELECT v FROM ints WHERE id = $1`, id).Scan(&v); err != nil || v != fmt.Sprint(id) {
			t.Errorf("ints %d: %q %v", id, v, err)
		}
		if err := c.QueryRow(ctx, fmt.Sprintf(`SELECT v FROM ints WHERE id = '%d'`, id), pgx.QueryExecModeSimpleProtocol).Scan(&v); err != nil || v != fmt.Sprint(id) {
			t.Errorf("ints literal %d: %q %v", id, v, err)
		}
	}
	uuids := []string{"00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}
	for _, u := range uuids {
		mustExec(t, c, `INSERT INTO uuids VALUES ($1, $2)`, u, u)
	}
	for _, u := range uuids {
		var v string
		if err := c.QueryRow(ctx, `SELECT v FROM uuids WHERE id = $1::uuid`, u).Scan(&v); err != nil || v != u {
			t.Errorf("uuid %s: %q %v", u, v, err)
		}
		upper := "{" + strings.ToUpper(u) + "}"
		if err := c.QueryRow(ctx, fmt.Sprintf(`SELECT v FROM uuids WHERE id = '%s'`, upper), pgx.QueryExecModeSimpleProtocol).Scan(&v); err != nil || v != u {
			t.Errorf("uuid literal %s: %q %v", upper, v, err)
		}
	}
	// PostgreSQL agrees on placement.
	for node := 0; node < 2; node++ {
		nc := connect(t, testNodeDSN(t, node))
		for idx := node; idx < 8; idx += 2 {
			lo, hi := idx*512, (idx+1)*512-1
			for _, q := range []string{
				fmt.Sprintf(`SELECT count(*) FROM lattice_s%04d.ints WHERE (hashint8extended(id, 0) & 4095) NOT BETWEEN %d AND %d`, idx, lo, hi),
				fmt.Sprintf(`SELECT count(*) FROM lattice_s%04d.uuids WHERE (uuid_hash_extended(id, 0) & 4095) NOT BETWEEN %d AND %d`, idx, lo, hi),
			} {
				var wrong int
				if err := nc.QueryRow(ctx, q).Scan(&wrong); err != nil || wrong != 0 {
					t.Errorf("%s: %d misplaced (%v)", q, wrong, err)
				}
			}
		}
	}
}
