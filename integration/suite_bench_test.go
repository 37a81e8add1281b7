package integration

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/pgshard"
)

// The suite benchmarks below are run by bench/suite.sh, which collects the
// lines they print with the prefix mdPrefix into bench/results.md.
const mdPrefix = "BENCHMD "

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// md prints markdown lines for bench/suite.sh.
func md(format string, args ...any) {
	for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		fmt.Println(mdPrefix + line)
	}
}

// pgbenchResult is one pgbench run: tps, mean latency and transactions
// processed, or why it failed; for a proxy, its own CPU per transaction.
type pgbenchResult struct {
	tps, latMS float64
	done       int
	cpuUS      float64
	err        string
}

var pgbenchErrRe = regexp.MustCompile(`(?m)^(pgbench: error: .*|.*ERROR: .*)$`)

// runPgbench runs pgbench without vacuum (-n); a run that fails is a result,
// not a benchmark failure, so that the table shows which modes do not work.
func runPgbench(ctx context.Context, dsn, mode string, clients, secs int, extra ...string) pgbenchResult {
	args := append([]string{"-n", "-M", mode, "-c", strconv.Itoa(clients), "-j", "2", "-T", strconv.Itoa(secs)}, extra...)
	cmd := exec.CommandContext(ctx, filepath.Join(localnode.PGBinDir(), "pgbench"), append(args, dsn)...)
	out, err := cmd.CombinedOutput()
	m := tpsRe.FindSubmatch(out)
	l := latRe.FindSubmatch(out)
	if err != nil || m == nil || l == nil {
		msg := "no tps in output"
		if e := pgbenchErrRe.FindSubmatch(out); e != nil {
			msg = string(e[1])
		} else if err != nil {
			msg = err.Error()
		}
		return pgbenchResult{err: msg}
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	lat, _ := strconv.ParseFloat(string(l[1]), 64)
	r := pgbenchResult{tps: tps, latMS: lat}
	if n := processedRe.FindSubmatch(out); n != nil {
		r.done, _ = strconv.Atoi(string(n[1]))
	}
	return r
}

// runProxied is runPgbench through a proxy, process pid, charging the CPU
// it used meanwhile to each transaction.
func runProxied(b *testing.B, ctx context.Context, pid int, dsn, mode string, clients, secs int, extra ...string) pgbenchResult {
	before := cpuSeconds(b, pid)
	r := runPgbench(ctx, dsn, mode, clients, secs, extra...)
	if r.err == "" && r.done > 0 {
		r.cpuUS = (cpuSeconds(b, pid) - before) * 1e6 / float64(r.done)
	}
	return r
}

// cells renders a result's tps, latency, ratio to direct and, for a proxy,
// its CPU per transaction.
func (r pgbenchResult) cells(direct pgbenchResult) string {
	if r.err != "" {
		return fmt.Sprintf("fails: %s | – | – | –", mdEscape(r.err))
	}
	ratio, cpu := "–", "–"
	if direct.err == "" && direct.tps > 0 {
		ratio = fmt.Sprintf("%.2f", r.tps/direct.tps)
	}
	if r.cpuUS > 0 {
		cpu = fmt.Sprintf("%.0f", r.cpuUS)
	}
	return fmt.Sprintf("%.0f | %.2f | %s | %s", r.tps, r.latMS, ratio, cpu)
}

func mdEscape(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// pgbenchInit runs pgbench -i directly on a node: PostgreSQL's own loader.
func pgbenchInit(b *testing.B, ctx context.Context, dsn string, scale int) {
	b.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(localnode.PGBinDir(), "pgbench"), "-i", "-q", "-s", strconv.Itoa(scale), dsn)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i %s: %v\n%s", dsn, err, out)
	}
}

// pgbenchTarget is one server pgbench runs against: its DSN and, for a
// proxy, its process (0 for PostgreSQL itself), whose CPU is charged to
// each transaction.
type pgbenchTarget struct {
	name, metric string
	dsn          string
	pid          int
}

// BenchmarkSuitePgbench runs pgbench's builtin select-only (-S) and
// TPC-B-like scripts against one plain PostgreSQL node, against pgbouncer
// (transaction pooling) in front of it and through Lattice in two
// configurations: pgbench_accounts a tree of LATTICE_BENCH_SHARDS shards on
// 2 nodes, and the same tree with every shard on the catalog node, which is
// the direct node itself (another database of it, and a Lattice of its own
// with its own redis). The branches, tellers and history are ordinary
// tables on the catalog node. The one-node row is the proxy's cost on the
// hardware of direct; the two-node row adds distribution's (two
// PostgreSQL servers on the same cores, and a commit across them for a
// TPC-B transaction whose account is on the other node). Each protocol
// mode, with the same clients and duration, the targets one after the
// other. LATTICE_BENCH_SECONDS, LATTICE_BENCH_CLIENTS, LATTICE_BENCH_SCALE.
func BenchmarkSuitePgbench(b *testing.B) {
	ctx := context.Background()
	secs := benchSeconds()
	clients := envInt("LATTICE_BENCH_CLIENTS", 8)
	scale := envInt("LATTICE_BENCH_SCALE", 4)
	shards := envInt("LATTICE_BENCH_SHARDS", 16)
	const oneDB = "pgbench_one"
	for i := 0; i < b.N; i++ {
		resetNodes(b)
		// Direct and pgbouncer: node 3 on its own, database lattice.
		// Lattice on two nodes: nodes 1 and 2, node 1 being the catalog
		// node. Lattice on one node: node 3, database oneDB.
		directNode := testNode(b, 2)
		direct := directNode.DSN("lattice")
		pgbenchInit(b, ctx, direct, scale)
		pgbenchInit(b, ctx, testNodeDSN(b, 0), scale)
		if err := directNode.CreateDatabase(ctx, oneDB); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dropDatabase(b, directNode, oneDB) })
		pgbenchInit(b, ctx, directNode.DSN(oneDB), scale)
		p := startProxy(b, 2)
		start := time.Now()
		c := connect(b, p.DSN("lattice"))
		mustExec(b, c, fmt.Sprintf(`SELECT lattice_create_tree('pgbench_accounts', 'aid', shard_count => %d)`, shards))
		c.Close(ctx)
		converted := time.Since(start)
		p1 := startOneNodeLattice(b, ctx, directNode, oneDB, shards)
		for _, dsn := range []string{testNodeDSN(b, 0), testNodeDSN(b, 1), direct, directNode.DSN(oneDB)} {
			vc := connect(b, dsn)
			mustExec(b, vc, "VACUUM ANALYZE")
			vc.Close(ctx)
		}
		targets := []pgbenchTarget{{name: "direct", dsn: direct}}
		bouncer, bouncerPID := startPgbouncer(b, directNode.Port)
		if bouncer == "" {
			b.Log("pgbouncer is not installed: its rows show n/a")
		} else {
			targets = append(targets, pgbenchTarget{"pgbouncer", "pgbouncer", bouncer, bouncerPID})
		}
		targets = append(targets,
			pgbenchTarget{"Lattice, 2 nodes", "lattice2", p.DSN("lattice"), p.cmd.Process.Pid},
			pgbenchTarget{"Lattice, 1 node", "lattice1", p1.DSN(oneDB), p1.cmd.Process.Pid})

		// Warm caches and pools on every target before the measured runs.
		warm := min(secs, 3)
		for _, t := range targets {
			runPgbench(ctx, t.dsn, "simple", clients, warm, "-S")
		}

		md("#### pgbench: direct vs pgbouncer vs Lattice on 2 nodes and on 1\n")
		md("%d clients, 2 pgbench threads, %d s per run, scale %d (%d accounts). Direct: one PostgreSQL 15 node. "+
			"pgbouncer: transaction pooling in front of that node. Lattice, 2 nodes: pgbench_accounts is a tree of %d shards "+
			"on 2 other nodes (created with lattice_create_tree from a pgbench -i table in %s), so about half of the TPC-B "+
			"transactions commit across the two (two-phase commit); Lattice, 1 node: the same tree with every shard on "+
			"the direct node itself (another database of it), the same hardware as direct. "+
			"pgbench_branches, pgbench_tellers and pgbench_history are ordinary tables on the catalog node. "+
			"Each (workload, mode) runs the targets one after the other. "+
			"tps excludes connection time; latency is pgbench's average; ratio is tps / direct tps; "+
			"CPU µs/tx is the proxy process's own CPU time (utime+stime from /proc/PID/stat) over the run divided by the transactions it processed.\n",
			clients, secs, scale, scale*100000, shards, converted.Round(time.Millisecond))
		md("| workload | mode | target | tps | ms | ratio to direct | proxy CPU µs/tx |")
		md("|---|---|---|---|---|---|---|")
		for _, w := range []struct {
			name, metric string
			args         []string
		}{{"select-only (-S)", "select", []string{"-S"}}, {"TPC-B-like (default)", "tpcb", nil}} {
			for _, mode := range []string{"simple", "extended", "prepared"} {
				var d pgbenchResult
				for _, t := range targets {
					var r pgbenchResult
					if t.pid == 0 {
						r = runPgbench(ctx, t.dsn, mode, clients, secs, w.args...)
						d = r
					} else {
						r = runProxied(b, ctx, t.pid, t.dsn, mode, clients, secs, w.args...)
					}
					md("| %s | %s | %s | %s |", w.name, mode, t.name, r.cells(d))
					if t.pid != 0 && r.err == "" && d.err == "" && d.tps > 0 {
						b.ReportMetric(r.tps/d.tps, fmt.Sprintf("%s-%s-%s/direct", w.metric, mode, t.metric))
					}
				}
			}
		}
		md("\nAfter the runs, TPC-B's invariant (every delta lands once in each of accounts, tellers, branches and history): "+
			"direct and pgbouncer %s; Lattice on 2 nodes %s; Lattice on 1 node %s.",
			tpcbInvariant(b, ctx, direct), tpcbInvariant(b, ctx, p.DSN("lattice")), tpcbInvariant(b, ctx, p1.DSN(oneDB)))
		md("")
	}
}

// startOneNodeLattice starts a Lattice whose only node is node, with a
// redis of its own, and makes pgbench_accounts of database (loaded by
// pgbench -i) a tree of shards shards there. pgbench's other tables are
// granted to the tenant's role, as an operator would (the harness does so
// for the default database only).
func startOneNodeLattice(b *testing.B, ctx context.Context, node *localnode.Postgres, database string, shards int) *proxyProc {
	b.Helper()
	rd, err := localnode.StartRedis(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	// Registered before the proxy's cleanup, so run after it: the proxy
	// does not outlive its redis.
	b.Cleanup(func() { _ = rd.Stop() })
	p := startProxyOn(b, rd.URL(), []string{node.DSN("lattice")}, nil)
	c := connect(b, p.DSN(database))
	defer c.Close(ctx)
	mustExec(b, c, fmt.Sprintf(`SELECT lattice_create_tree('pgbench_accounts', 'aid', shard_count => %d)`, shards))
	nc := connect(b, node.DSN(database))
	defer nc.Close(ctx)
	mustExec(b, nc, "GRANT ALL ON pgbench_branches, pgbench_tellers, pgbench_history TO "+
		pgx.Identifier{pgshard.TenantRole(database)}.Sanitize())
	return p
}

// dropDatabase drops database on node, ending its sessions first.
func dropDatabase(b *testing.B, node *localnode.Postgres, database string) {
	b.Helper()
	c := connect(b, node.DSN("lattice"))
	defer c.Close(context.Background())
	mustExec(b, c, "DROP DATABASE IF EXISTS "+pgx.Identifier{database}.Sanitize()+" WITH (FORCE)")
}

// tpcbInvariant checks that the sums of the balances of pgbench's four
// tables agree, as they must after any number of committed TPC-B
// transactions from a fresh pgbench -i; through Lattice the accounts sum is
// a fan-out over the shards.
func tpcbInvariant(b testing.TB, ctx context.Context, dsn string) string {
	b.Helper()
	c := connect(b, dsn)
	defer c.Close(ctx)
	var sums [4]int64
	for i, q := range []string{
		"SELECT coalesce(sum(abalance), 0)::int8 FROM pgbench_accounts",
		"SELECT coalesce(sum(tbalance), 0)::int8 FROM pgbench_tellers",
		"SELECT coalesce(sum(bbalance), 0)::int8 FROM pgbench_branches",
		"SELECT coalesce(sum(delta), 0)::int8 FROM pgbench_history",
	} {
		if err := c.QueryRow(ctx, q).Scan(&sums[i]); err != nil {
			return fmt.Sprintf("not checked (%s: %s)", q, mdEscape(err.Error()))
		}
	}
	if sums[0] == sums[1] && sums[1] == sums[2] && sums[2] == sums[3] {
		return fmt.Sprintf("holds (every sum %d)", sums[0])
	}
	broken := fmt.Sprintf("**BROKEN**: accounts %d, tellers %d, branches %d, history %d", sums[0], sums[1], sums[2], sums[3])
	b.Errorf("TPC-B invariant on %s: %s", dsn, broken)
	return broken
}

// BenchmarkSuiteReshardCycle grows a tree of LATTICE_BENCH_RESHARD_ROWS rows
// from 8 to 16 shards on 2 nodes (splits), then shrinks it back to 8
// (folds), each through lattice_reshard with no client load, and compares
// the rows each copied per second with a raw binary COPY TO | COPY FROM of
// as many rows of the same table between the same two nodes. It reports
// the freeze pauses of both from the lattice_migrator_freeze_seconds
// histogram on /metrics and, exactly, from the per-migration log lines.
func BenchmarkSuiteReshardCycle(b *testing.B) {
	ctx := context.Background()
	rows := envInt("LATTICE_BENCH_RESHARD_ROWS", 500_000)
	for i := 0; i < b.N; i++ {
		p, c := benchTree(b, "cycle", rows, 8)

		md("#### Reshard: splits and folds end to end vs raw COPY\n")
		md("A tree of %d rows (bigint key, about 80 bytes a row) on 2 nodes, resharded through `lattice_reshard` with no client load "+
			"(default --max-concurrent-migrations 4; the coordinator starts each migration at once, so the time is the copies, catch-up, freeze, flip, verification and release). "+
			"rows copied is lattice_migrator_rows_copied_total; raw is one binary `COPY (SELECT … LIMIT n) TO STDOUT | COPY … FROM STDIN` "+
			"of as many rows of the same shards between the same two nodes.\n", rows)
		md("| step | migrations | rows copied | wall time s | rows/s | raw COPY rows/s | reshard/raw |")
		md("|---|---|---|---|---|---|---|")
		logFrom := 0
		var pauses []string
		for _, step := range []struct {
			name   string
			shards int
		}{{"grow 8 → 16 (splits)", 16}, {"shrink 16 → 8 (folds)", 8}} {
			before := scrapeMetrics(b, p)
			start := time.Now()
			runUntil(b, ctx, c, fmt.Sprintf(`SELECT lattice_reshard('cycle', %d)`, step.shards), `SELECT lattice_reshard_complete('cycle')`)
			took := time.Since(start)
			after := scrapeMetrics(b, p)
			copied := int64(after.sum("lattice_migrator_rows_copied_total") - before.sum("lattice_migrator_rows_copied_total"))
			log := p.Log()
			stepLog := log[logFrom:]
			logged := pausesFromLog(stepLog)
			logFrom = len(log)
			raw := rawCopyRate(b, ctx, "cycle", copied)
			rate := float64(copied) / took.Seconds()
			md("| %s | %d | %d | %.1f | %.0f | %.0f | %.2f |", step.name, len(logged), copied, took.Seconds(), rate, raw, rate/raw)
			fmt.Print(phaseTimeline(step.name, phaseTimes(stepLog), start, took))
			pauses = append(pauses, fmt.Sprintf("| %s | %s | %s |", step.name, freezeHistogram(before, after), pauseStats(logged)))
		}
		md("\nFreeze pause (write pause of each migration, freeze to flip) of the same reshards:\n")
		md("| step | /metrics histogram lattice_migrator_freeze_seconds | per-migration log lines (exact) |")
		md("|---|---|---|")
		for _, l := range pauses {
			md("%s", l)
		}
		md("")
		c.Close(ctx)
	}
}

// rawCopyRate pipes n rows of tree's shards on node 1 (a tree of the cycle
// benchmark's columns) into a copy of its table on node 2 and returns rows
// per second.
func rawCopyRate(b *testing.B, ctx context.Context, tree string, n int64) float64 {
	b.Helper()
	if n <= 0 {
		return math.NaN()
	}
	src := connect(b, testNodeDSN(b, 0))
	defer src.Close(ctx)
	dst := connect(b, testNodeDSN(b, 1))
	defer dst.Close(ctx)
	// The rows of every shard on node 1, in one query, up to n.
	var shardTables []string
	rows, err := src.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_tables
		WHERE schemaname LIKE 'lattice\_s%' AND tablename = $1 ORDER BY 1`, tree)
	if err != nil {
		b.Fatal(err)
	}
	shardTables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(shardTables) == 0 {
		b.Fatalf("shard tables of %s on node 1: %v (%d)", tree, err, len(shardTables))
	}
	var parts []string
	for _, t := range shardTables {
		parts = append(parts, "SELECT * FROM "+t)
	}
	mustExec(b, dst, `DROP TABLE IF EXISTS public.raw_copy`)
	mustExec(b, dst, `CREATE TABLE public.raw_copy (k bigint PRIMARY KEY, n int8 NOT NULL, pad text NOT NULL)`)
	defer mustExec(b, dst, `DROP TABLE public.raw_copy`)
	start := time.Now()
	r := pgshard.PipeCopy(ctx, src.PgConn(), fmt.Sprintf("COPY (%s LIMIT %d) TO STDOUT (FORMAT binary)", strings.Join(parts, " UNION ALL "), n),
		dst.PgConn(), "COPY public.raw_copy FROM STDIN (FORMAT binary)")
	if err := r.Err(); err != nil {
		b.Fatalf("raw copy: %v", err)
	}
	return float64(r.Written) / time.Since(start).Seconds()
}

// metricsSample is one scrape of /metrics: series (name{labels}) to value.
type metricsSample map[string]float64

func scrapeMetrics(b *testing.B, p *proxyProc) metricsSample {
	b.Helper()
	resp, err := http.Get("http://" + p.AdminAddr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	s := metricsSample{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			s[line[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return s
}

// sum adds every series of the metric name whose labels contain all of
// the given label pairs (`outcome="flipped"`).
func (s metricsSample) sum(name string, labels ...string) float64 {
	var t float64
	for k, v := range s {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(k, l)
		}
		if ok {
			t += v
		}
	}
	return t
}

var leRe = regexp.MustCompile(`le="([^"]+)"`)

// freezeHistogram renders the freezes between two scrapes: count by
// outcome, mean, and the bucket bounds that hold p50, p99 and the maximum
// (nearest rank).
func freezeHistogram(before, after metricsSample) string {
	const name = "lattice_migrator_freeze_seconds"
	flipped := after.sum(name+"_count", `outcome="flipped"`) - before.sum(name+"_count", `outcome="flipped"`)
	rolled := after.sum(name+"_count", `outcome="rolled_back"`) - before.sum(name+"_count", `outcome="rolled_back"`)
	total := after.sum(name+"_count") - before.sum(name+"_count")
	if total == 0 {
		return "no freezes"
	}
	mean := (after.sum(name+"_sum") - before.sum(name+"_sum")) / total
	// Cumulative bucket counts by upper bound, over all outcomes.
	bounds := map[float64]float64{}
	for k, v := range after {
		if !strings.HasPrefix(k, name+"_bucket{") {
			continue
		}
		m := leRe.FindStringSubmatch(k)
		if m == nil {
			continue
		}
		le, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			continue
		}
		bounds[le] += v - before[k]
	}
	les := make([]float64, 0, len(bounds))
	for le := range bounds {
		les = append(les, le)
	}
	slices.Sort(les)
	q := func(p float64) string {
		for _, le := range les {
			if bounds[le] >= math.Ceil(p*total) {
				if math.IsInf(le, 1) {
					return "> 5 s"
				}
				return "≤ " + fmtMS(le*1000)
			}
		}
		return "?"
	}
	return fmt.Sprintf("%d flipped, %d rolled back; mean %s; p50 %s, p99 %s, max %s",
		int(flipped), int(rolled), fmtMS(mean*1000), q(0.5), q(0.99), q(1))
}

func fmtMS(ms float64) string {
	if ms < 10 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

var suitePauseRe = regexp.MustCompile(`\bpause=(\S+)`)

// pausesFromLog returns the pause of each "flipped" log line.
func pausesFromLog(log string) []time.Duration {
	var out []time.Duration
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "msg=flipped ") {
			continue
		}
		if m := suitePauseRe.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				out = append(out, d)
			}
		}
	}
	return out
}

func pauseStats(d []time.Duration) string {
	if len(d) == 0 {
		return "no flips logged"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	// Nearest rank, as for the histogram's buckets above.
	q := func(p float64) string {
		return fmtMS(float64(s[int(math.Ceil(p*float64(len(s))))-1].Microseconds()) / 1000)
	}
	return fmt.Sprintf("%d flips; p50 %s, p99 %s, max %s", len(d), q(0.5), q(0.99), q(1))
}

// benchTree starts a proxy over 2 fresh nodes and creates tree name of
// rows rows (bigint key, about 80 bytes a row) in shards shards, the nodes
// vacuumed and analyzed after, for the migration benchmarks.
// LATTICE_BENCH_PROXY_ARGS adds flags to the proxy's command line, to weigh
// a setting against the default (--verify-moves=false, say).
func benchTree(b *testing.B, name string, rows, shards int) (*proxyProc, *pgx.Conn) {
	b.Helper()
	resetNodes(b)
	p := startProxy(b, 2, strings.Fields(os.Getenv("LATTICE_BENCH_PROXY_ARGS"))...)
	c := connect(b, p.DSN("lattice"))
	mustExec(b, c, fmt.Sprintf(`CREATE TABLE %s (k bigint PRIMARY KEY, n int8 NOT NULL, pad text NOT NULL)`, name))
	mustExec(b, c, fmt.Sprintf(`INSERT INTO %s SELECT g, g, repeat(md5(g::text), 2) FROM generate_series(1, %d) g`, name, rows))
	mustExec(b, c, fmt.Sprintf(`SELECT lattice_create_tree('%s', 'k', shard_count => %d)`, name, shards))
	for n := range 2 {
		vc := connect(b, testNodeDSN(b, n))
		mustExec(b, vc, "VACUUM ANALYZE")
		vc.Close(context.Background())
	}
	return p, c
}

// runUntil runs call through c, then polls the boolean query done until it
// is true, for a benchmark that times an operation to its completion signal.
func runUntil(b *testing.B, ctx context.Context, c *pgx.Conn, call, done string) {
	b.Helper()
	mustExec(b, c, call)
	for {
		var ok bool
		if err := c.QueryRow(ctx, done).Scan(&ok); err != nil {
			b.Fatal(err)
		}
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
