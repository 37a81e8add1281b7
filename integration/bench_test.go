package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/localnode"
)

// benchSeconds is how long each pgbench run lasts; LATTICE_BENCH_SECONDS
// overrides it.
func benchSeconds() int {
	if v, err := strconv.Atoi(os.Getenv("LATTICE_BENCH_SECONDS")); err == nil && v > 0 {
		return v
	}
	return 10
}

var tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
var latRe = regexp.MustCompile(`latency average = ([0-9.]+) ms`)

// pgbench runs a point-select script and returns tps and mean latency.
func pgbench(b *testing.B, dsn, mode, script string, clients int) (float64, float64) {
	b.Helper()
	cmd := exec.Command(filepath.Join(localnode.PGBinDir(), "pgbench"), "-n", "-M", mode,
		"-c", strconv.Itoa(clients), "-j", "2", "-T", strconv.Itoa(benchSeconds()), "-f", script, dsn)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("pgbench %s: %v\n%s", dsn, err, out)
	}
	m := tpsRe.FindSubmatch(out)
	l := latRe.FindSubmatch(out)
	if m == nil || l == nil {
		b.Fatalf("pgbench output without tps:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	lat, _ := strconv.ParseFloat(string(l[1]), 64)
	return tps, lat
}

// startPgbouncer runs pgbouncer in transaction mode in front of dsnHost:port,
// if it is installed; it returns "" otherwise.
func startPgbouncer(b *testing.B, port int) string {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
			if _, e := os.Stat(p); e == nil {
				bin = p
			}
		}
	}
	if bin == "" {
		return ""
	}
	dir, err := os.MkdirTemp("", "pgbouncer")
	if err != nil {
		b.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	listen, err := localnode.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	ini := fmt.Sprintf(`[databases]
lattice = host=127.0.0.1 port=%d dbname=lattice user=lattice
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
auth_type = trust
auth_file = %s/users.txt
pool_mode = transaction
max_client_conn = 200
default_pool_size = 32
unix_socket_dir =
logfile = %s/pgbouncer.log
`, port, listen, dir, dir)
	os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"lattice" ""`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644)
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) })
	dsn := fmt.Sprintf("postgres://lattice@127.0.0.1:%d/lattice?sslmode=disable", listen)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if exec.Command("psql", "-X", "-tAc", "SELECT 1", dsn).Run() == nil {
			return dsn
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("pgbouncer did not start")
	return ""
}

// BenchmarkPointSelect measures point-select tps directly on one node,
// through pgbouncer and through Lattice, side by side in one run, in each
// protocol mode, and prints a markdown table of the ratios.
func BenchmarkPointSelect(b *testing.B) {
	resetNodes(b)
	p := startProxy(b, 1)
	c := connect(b, p.DSN("lattice"))
	mustExec(b, c, `CREATE TABLE accounts (aid integer PRIMARY KEY, abalance integer NOT NULL, filler char(84))`)
	mustExec(b, c, `INSERT INTO accounts SELECT i, i, '' FROM generate_series(1, 100000) i`)
	mustExec(b, c, `SELECT lattice_create_tree('accounts', 'aid', shard_count => 16)`)
	direct := connect(b, testNodeDSN(b, 0))
	mustExec(b, direct, `CREATE TABLE accounts_plain (aid integer PRIMARY KEY, abalance integer NOT NULL, filler char(84))`)
	mustExec(b, direct, `INSERT INTO accounts_plain SELECT i, i, '' FROM generate_series(1, 100000) i`)
	mustExec(b, direct, `VACUUM ANALYZE accounts_plain`)

	dir := b.TempDir()
	treeScript := filepath.Join(dir, "tree.sql")
	plainScript := filepath.Join(dir, "plain.sql")
	os.WriteFile(treeScript, []byte("\\set aid random(1, 100000)\nSELECT abalance FROM accounts WHERE aid = :aid;\n"), 0o644)
	os.WriteFile(plainScript, []byte("\\set aid random(1, 100000)\nSELECT abalance FROM accounts_plain WHERE aid = :aid;\n"), 0o644)
	bouncer := startPgbouncer(b, testNode(b, 0).Port)

	var table strings.Builder
	table.WriteString("| mode | direct tps | pgbouncer tps | lattice tps | pgbouncer/direct | lattice/direct | lattice mean latency ms |\n|---|---|---|---|---|---|---|\n")
	const clients = 8
	for _, mode := range []string{"simple", "extended", "prepared"} {
		d, _ := pgbench(b, testNodeDSN(b, 0), mode, plainScript, clients)
		bt := 0.0
		// pgbouncer 1.18 (Debian 12) has no prepared-statement support in
		// transaction mode; -M prepared fails through it.
		if bouncer != "" && mode != "prepared" {
			bt, _ = pgbench(b, bouncer, mode, plainScript, clients)
		}
		l, lat := pgbench(b, p.DSN("lattice"), mode, treeScript, clients)
		fmt.Fprintf(&table, "| %s | %.0f | %s | %.0f | %s | %.2f | %.3f |\n", mode, d, orDash(bt, "%.0f"), l, orDash(bt/d, "%.2f"), l/d, lat)
		b.ReportMetric(l/d, mode+"-lattice/direct")
	}
	fmt.Printf("\nPoint select, %d clients, %d s per run, one node, %d cores:\n\n%s\n", clients, benchSeconds(), numCPU(), table.String())
}

func numCPU() int { return runtime.NumCPU() }

func orDash(v float64, format string) string {
	if v == 0 {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}
