package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
)

// dumpTables are the tables TestPgDump dumps, each with its key order.
var dumpTables = []struct{ name, order string }{
	{"dump_t", "k"}, {"dump_c", "k, i"}, {"dump_r", "r"}, {"dump_p", "p"},
}

// TestPgDump runs PostgreSQL's own pg_dump through the proxy, in the plain
// and the custom format, over a tree on three nodes, a tree colocated with
// it, a reference table and a plain table (-n public: the shard schemas
// and the reference tables' event triggers stay out), and restores each
// dump into a plain database: every table must hold the rows the proxy
// serves. pg_dump sets a setting by a name it reads from pg_settings and
// locks each table IN ACCESS SHARE MODE, which the proxy runs on the
// trees' templates. pg_dump --jobs, whose workers import the leader's
// snapshot, is refused with a hint once a worker reads another node.
func TestPgDump(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	for _, q := range []string{
		"CREATE TABLE dump_t (k int PRIMARY KEY, v text, n numeric)",
		"INSERT INTO dump_t SELECT g, 'v' || g, g / 7.0 FROM generate_series(1, 600) g",
		"SELECT lattice_create_tree('dump_t', 'k', shard_count => 8)",
		"CREATE TABLE dump_c (k int, i int, w text, PRIMARY KEY (k, i))",
		"INSERT INTO dump_c SELECT g, h, E'tab\\there' FROM generate_series(1, 600) g, generate_series(1, 2) h",
		"SELECT lattice_create_tree('dump_c', 'k', colocate_with => 'dump_t')",
		"CREATE TABLE dump_r (r int PRIMARY KEY, label text)",
		"INSERT INTO dump_r SELECT g, 'r' || g FROM generate_series(1, 20) g",
		"SELECT lattice_create_reference_table('dump_r')",
		"CREATE TABLE dump_p (p int PRIMARY KEY, note text)",
		"INSERT INTO dump_p SELECT g, NULL FROM generate_series(1, 30) g",
	} {
		mustExec(t, c, q)
	}
	want := dumpDigests(t, ctx, c)

	node := connect(t, testNodeDSN(t, 0))
	bin := localnode.PGBinDir()
	pgDump := func(file string, format ...string) ([]byte, error) {
		args := append([]string{"-n", "public", "--no-owner", "-f", file, "-d", p.DSN("lattice")}, format...)
		return exec.CommandContext(ctx, filepath.Join(bin, "pg_dump"), args...).CombinedOutput()
	}
	for _, format := range []struct {
		flag string
		load func(file, dsn string) *exec.Cmd
	}{
		{"-Fp", func(file, dsn string) *exec.Cmd {
			return exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", file)
		}},
		{"-Fc", func(file, dsn string) *exec.Cmd {
			return exec.CommandContext(ctx, filepath.Join(bin, "pg_restore"), "--exit-on-error", "-d", dsn, file)
		}},
	} {
		t.Run(format.flag, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "dump")
			if out, err := pgDump(file, format.flag); err != nil {
				t.Fatalf("pg_dump through the proxy: %v\n%s", err, out)
			}
			mustExec(t, node, "DROP DATABASE IF EXISTS dump_restore")
			mustExec(t, node, "CREATE DATABASE dump_restore")
			t.Cleanup(func() { mustExec(t, node, "DROP DATABASE IF EXISTS dump_restore") })
			// An empty database: the dump of schema public creates it.
			empty := connect(t, testNode(t, 0).DSN("dump_restore"))
			mustExec(t, empty, "DROP SCHEMA public")
			empty.Close(ctx)
			if out, err := format.load(file, testNode(t, 0).DSN("dump_restore")).CombinedOutput(); err != nil {
				t.Fatalf("restore: %v\n%s", err, out)
			}
			restored := connect(t, testNode(t, 0).DSN("dump_restore"))
			defer restored.Close(ctx)
			got := dumpDigests(t, ctx, restored)
			for name, w := range want {
				if got[name] != w {
					t.Errorf("%s: restored %q, through the proxy %q", name, got[name], w)
				}
			}
		})
	}
	out, err := pgDump(t.TempDir()+"/dir", "-Fd", "--jobs", "2")
	if err == nil || !strings.Contains(string(out), "SET TRANSACTION SNAPSHOT") || !strings.Contains(string(out), "without --jobs") {
		t.Fatalf("pg_dump --jobs 2 over three nodes: %v, want the snapshot refused with a hint\n%s", err, out)
	}
}

// dumpDigests is each dump table's row count and the md5 of its rows'
// text in key order.
func dumpDigests(t *testing.T, ctx context.Context, c *pgx.Conn) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, tb := range dumpTables {
		var d string
		if err := c.QueryRow(ctx, "SELECT count(*) || ' ' || md5(string_agg(x::text, '|' ORDER BY "+tb.order+")) FROM "+tb.name+" x").Scan(&d); err != nil {
			t.Fatalf("%s: %v", tb.name, err)
		}
		out[tb.name] = d
	}
	return out
}

// TestLockTreeAccessShare: LOCK TABLE on a tree IN ACCESS SHARE MODE, in a
// transaction, holds off a TRUNCATE of the tree through another session
// until the transaction ends, as PostgreSQL's lock does; stronger modes,
// which would have to hold off row writes on the shards, are refused.
func TestLockTreeAccessShare(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 2)
	a := connect(t, p.DSN("lattice"))
	for _, q := range []string{
		"CREATE TABLE lk (k int PRIMARY KEY, v int)",
		"INSERT INTO lk SELECT g, g FROM generate_series(1, 100) g",
		"SELECT lattice_create_tree('lk', 'k', shard_count => 4)",
	} {
		mustExec(t, a, q)
	}
	if _, err := a.Exec(ctx, "LOCK TABLE lk IN SHARE MODE"); pgCode(err) != "0A000" {
		t.Fatalf("LOCK TABLE lk IN SHARE MODE: %v, want 0A000", err)
	}
	mustExec(t, a, "BEGIN")
	// No read in the transaction: its locks on the shards would hold the
	// TRUNCATE off too.
	mustExec(t, a, "LOCK TABLE lk IN ACCESS SHARE MODE")

	b := connect(t, p.DSN("lattice"))
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "TRUNCATE lk")
		done <- err
	}()
	// The TRUNCATE's transaction on the catalog node waits for the lock.
	catalog := connect(t, testNodeDSN(t, 0))
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("TRUNCATE ended while the tree was locked: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if err := catalog.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE NOT l.granted AND n.nspname = 'public' AND c.relname = 'lk' AND l.mode = 'AccessExclusiveLock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, a, "COMMIT")
	if err := <-done; err != nil {
		t.Fatalf("TRUNCATE after the lock ended: %v", err)
	}
	var n int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM lk").Scan(&n); err != nil || n != 0 {
		t.Fatalf("count after TRUNCATE: %d, %v", n, err)
	}
}
