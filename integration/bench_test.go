package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
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

// startPgbouncer runs pgbouncer in transaction mode in front of dsnHost:port,
// if it is installed, and returns its DSN and process id; it returns ""
// otherwise.
func startPgbouncer(b *testing.B, port int) (string, int) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
			if _, e := os.Stat(p); e == nil {
				bin = p
			}
		}
	}
	if bin == "" {
		return "", 0
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
			return dsn, cmd.Process.Pid
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.Fatalf("pgbouncer did not start")
	return "", 0
}

// clockTicks is the kernel's USER_HZ: the unit of utime and stime in
// /proc/PID/stat.
var clockTicks = sync.OnceValue(func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if hz, e := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && e == nil && hz > 0 {
		return hz
	}
	return 100
})

// cpuSeconds is the CPU time (user and system, every thread) process pid
// has used so far, from /proc/PID/stat.
func cpuSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) may hold spaces: count from its ")".
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	utime, _ := strconv.ParseFloat(f[11], 64) // field 14
	stime, _ := strconv.ParseFloat(f[12], 64) // field 15
	return (utime + stime) / clockTicks()
}

var processedRe = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)

// pgbenchCount runs a script for a fixed number of transactions per
// client and returns tps and the transactions processed.
func pgbenchCount(b *testing.B, dsn, mode, script string, clients, perClient int) (float64, int) {
	b.Helper()
	cmd := exec.Command(filepath.Join(localnode.PGBinDir(), "pgbench"), "-n", "-M", mode,
		"-c", strconv.Itoa(clients), "-j", "2", "-t", strconv.Itoa(perClient), "-f", script, dsn)
	out, err := cmd.CombinedOutput()
	m, n := tpsRe.FindSubmatch(out), processedRe.FindSubmatch(out)
	if err != nil || m == nil || n == nil {
		b.Fatalf("pgbench %s -M %s: %v\n%s", dsn, mode, err, out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	done, _ := strconv.Atoi(string(n[1]))
	return tps, done
}

// cpuRun is one pgbench run with a fixed transaction count: tps and, for a
// proxy, its own CPU per query.
type cpuRun struct {
	tps, cpuUS float64
}

// runCounted runs pgbenchCount and charges the CPU time process pid (0:
// none) used meanwhile to each query.
func runCounted(b *testing.B, pid int, dsn, mode, script string, clients, perClient int) cpuRun {
	b.Helper()
	var before float64
	if pid > 0 {
		before = cpuSeconds(b, pid)
	}
	tps, done := pgbenchCount(b, dsn, mode, script, clients, perClient)
	r := cpuRun{tps: tps}
	if pid > 0 && done > 0 {
		r.cpuUS = (cpuSeconds(b, pid) - before) * 1e6 / float64(done)
	}
	return r
}

// BenchmarkPointSelect measures point selects (`SELECT v FROM kv WHERE k =
// :k`, 8 pgbench clients) directly on one node, through pgbouncer in
// transaction mode in front of it and through Lattice over a 16-shard tree
// on it, side by side in one run, in each protocol mode: tps, the ratios
// to direct, and each proxy's own CPU per query (utime+stime of its process
// over a run of a fixed transaction count, divided by that count).
// LATTICE_BENCH_CPU_TX sets the transactions per client (default 10000).
// It prints a markdown table (with the BENCHMD prefix of bench/suite.sh).
func BenchmarkPointSelect(b *testing.B) {
	const clients, rows = 8, 100000
	perClient := envInt("LATTICE_BENCH_CPU_TX", 10000)
	resetNodes(b)
	p := startProxy(b, 1)
	c := connect(b, p.DSN("lattice"))
	mustExec(b, c, `CREATE TABLE kv (k integer PRIMARY KEY, v integer NOT NULL)`)
	mustExec(b, c, fmt.Sprintf(`INSERT INTO kv SELECT i, i FROM generate_series(1, %d) i`, rows))
	mustExec(b, c, `SELECT lattice_create_tree('kv', 'k', shard_count => 16)`)
	c.Close(context.Background())
	direct := connect(b, testNodeDSN(b, 0))
	// The same rows in a plain table of the same node, for direct and pgbouncer.
	mustExec(b, direct, `CREATE TABLE kv_plain (k integer PRIMARY KEY, v integer NOT NULL)`)
	mustExec(b, direct, fmt.Sprintf(`INSERT INTO kv_plain SELECT i, i FROM generate_series(1, %d) i`, rows))
	mustExec(b, direct, `VACUUM ANALYZE`)
	direct.Close(context.Background())

	dir := b.TempDir()
	treeScript := filepath.Join(dir, "tree.sql")
	plainScript := filepath.Join(dir, "plain.sql")
	os.WriteFile(treeScript, []byte(fmt.Sprintf("\\set k random(1, %d)\nSELECT v FROM kv WHERE k = :k;\n", rows)), 0o644)
	os.WriteFile(plainScript, []byte(fmt.Sprintf("\\set k random(1, %d)\nSELECT v FROM kv_plain WHERE k = :k;\n", rows)), 0o644)
	bouncer, bouncerPID := startPgbouncer(b, testNode(b, 0).Port)
	lattice, latticePID := p.DSN("lattice"), p.cmd.Process.Pid

	md("#### Point select: proxy CPU per query\n")
	md("`SELECT v FROM kv WHERE k = :k` (random k of %d rows), %d pgbench clients, 2 pgbench threads, %d transactions per run, one PostgreSQL node. "+
		"Direct and pgbouncer (transaction pooling in front of that node) read a plain table of the same rows; Lattice a tree of 16 shards on that node. "+
		"CPU µs/query is the proxy process's own CPU time (utime+stime from /proc/PID/stat) over the run divided by its transactions; "+
		"ratio is tps / direct tps. pgbouncer 1.18 cannot run `-M prepared` in transaction mode, so the prepared row compares Lattice with pgbouncer's extended run.\n",
		rows, clients, clients*perClient)
	md("| mode | direct tps | pgbouncer tps | pgbouncer/direct | pgbouncer CPU µs/query | lattice tps | lattice/direct | lattice CPU µs/query | lattice/pgbouncer CPU |")
	md("|---|---|---|---|---|---|---|---|---|")
	var bounced cpuRun
	for _, mode := range []string{"simple", "extended", "prepared"} {
		// Warm each target's pools and caches.
		for _, t := range [][2]string{{testNodeDSN(b, 0), plainScript}, {bouncer, plainScript}, {lattice, treeScript}} {
			if t[0] != "" && !(t[0] == bouncer && mode == "prepared") {
				pgbenchCount(b, t[0], mode, t[1], clients, 200)
			}
		}
		d := runCounted(b, 0, testNodeDSN(b, 0), mode, plainScript, clients, perClient)
		bcells := "n/a | n/a | n/a"
		switch {
		case bouncer == "":
		case mode == "prepared":
			bcells = fmt.Sprintf("%.0f (extended) | %.2f | %.1f (extended)", bounced.tps, bounced.tps/d.tps, bounced.cpuUS)
		default:
			bounced = runCounted(b, bouncerPID, bouncer, mode, plainScript, clients, perClient)
			bcells = fmt.Sprintf("%.0f | %.2f | %.1f", bounced.tps, bounced.tps/d.tps, bounced.cpuUS)
		}
		l := runCounted(b, latticePID, lattice, mode, treeScript, clients, perClient)
		vs := "n/a"
		if bounced.cpuUS > 0 {
			vs = fmt.Sprintf("%.2f×", l.cpuUS/bounced.cpuUS)
		}
		md("| %s | %.0f | %s | %.0f | %.2f | %.1f | %s |", mode, d.tps, bcells, l.tps, l.tps/d.tps, l.cpuUS, vs)
		b.ReportMetric(l.tps/d.tps, mode+"-lattice/direct")
		b.ReportMetric(l.cpuUS, mode+"-lattice-cpu-us/query")
	}
	md("")
}

func numCPU() int { return runtime.NumCPU() }
