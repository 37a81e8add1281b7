package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Run with LATTICE_TEST_RACE=0 (the race detector slows the proxy and
// inflates its memory), e.g.
//
//	LATTICE_TEST_RACE=0 go test -run '^$' -bench 'BenchmarkFanOutCount' -benchtime 20x ./integration

// BenchmarkFanOutCount measures SELECT count(*) over 1,000,000 rows in a
// tree of 64 shards on 2 nodes, through the proxy, against count(*) on one
// plain table of the same rows on one node, queried directly; the two
// alternate in one loop, and the ratio is reported.
func BenchmarkFanOutCount(b *testing.B) {
	resetNodes(b)
	p := startProxy(b, 2)
	c := connect(b, p.DSN("lattice"))
	const cols = `(id bigint PRIMARY KEY, v integer NOT NULL, pad text)`
	const fill = `SELECT i, i % 1000, 'row ' || i FROM generate_series(1, 1000000) i`
	mustExec(b, c, `CREATE TABLE big `+cols)
	mustExec(b, c, `INSERT INTO big `+fill)
	mustExec(b, c, `SELECT lattice_create_tree('big', 'id', shard_count => 64)`)
	direct := connect(b, testNodeDSN(b, 0))
	mustExec(b, direct, `CREATE TABLE big_plain `+cols)
	mustExec(b, direct, `INSERT INTO big_plain `+fill)
	for i := range 2 {
		n := connect(b, testNodeDSN(b, i))
		mustExec(b, n, `VACUUM ANALYZE`)
	}

	count := func(conn *pgx.Conn, sql string) time.Duration {
		start := time.Now()
		var n int64
		if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
		if n != 1000000 {
			b.Fatalf("%s: %d rows, want 1000000", sql, n)
		}
		return time.Since(start)
	}
	// Warm both: caches, plans, pooled connections.
	for range 3 {
		count(c, `SELECT count(*) FROM big`)
		count(direct, `SELECT count(*) FROM big_plain`)
	}
	var tree, plain time.Duration
	b.ResetTimer()
	for range b.N {
		tree += count(c, `SELECT count(*) FROM big`)
		plain += count(direct, `SELECT count(*) FROM big_plain`)
	}
	b.StopTimer()
	tm := float64(tree.Microseconds()) / 1000 / float64(b.N)
	pm := float64(plain.Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(tm, "tree-ms/op")
	b.ReportMetric(pm, "plain-ms/op")
	b.ReportMetric(tm/pm, "tree/plain")
	fmt.Printf("\ncount(*) over 1,000,000 rows, %d runs: tree of 64 shards on 2 nodes through Lattice %.2f ms, one plain table on one node directly %.2f ms, ratio %.2f\n", b.N, tm, pm, tm/pm)
}

// BenchmarkFanOutMemory streams a fan-out SELECT of 5,000,000 rows through
// a freshly started proxy, without and with ORDER BY, then an aggregate with
// 5,000,000 partial rows, and reports the proxy's peak resident memory
// (VmHWM) after start and after each.
func BenchmarkFanOutMemory(b *testing.B) {
	const rows = 5000000
	resetNodes(b)
	loader := startProxy(b, 2)
	c := connect(b, loader.DSN("lattice"))
	mustExec(b, c, `CREATE TABLE wide (id bigint PRIMARY KEY, v integer NOT NULL, pad text)`)
	mustExec(b, c, fmt.Sprintf(`INSERT INTO wide SELECT i, i %% 1000, repeat('x', 40) FROM generate_series(1, %d) i`, rows))
	mustExec(b, c, `SELECT lattice_create_tree('wide', 'id', shard_count => 16)`)
	c.Close(context.Background())

	// A fresh proxy: its peak memory is the streaming's alone.
	p := startProxy(b, 2)
	pid := p.cmd.Process.Pid
	client := connect(b, p.DSN("lattice"))
	idle := vmHWM(b, pid)
	stream := func(sql string) {
		start := time.Now()
		got, err := client.Query(context.Background(), sql)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for got.Next() {
			n++
		}
		if err := got.Err(); err != nil || n != rows {
			b.Fatalf("%s: %d rows, %v", sql, n, err)
		}
		fmt.Printf("%s: %d rows in %s, proxy VmHWM %d kB\n", sql, n, time.Since(start).Round(time.Millisecond), vmHWM(b, pid))
	}
	// An aggregate whose partial rows (one per distinct id) go through the
	// temporary table.
	distinct := func() {
		start := time.Now()
		var n int64
		if err := client.QueryRow(context.Background(), `SELECT count(DISTINCT id) FROM wide`).Scan(&n); err != nil || n != rows {
			b.Fatalf("count(DISTINCT id): %d, %v", n, err)
		}
		fmt.Printf("SELECT count(DISTINCT id) FROM wide (%d partial rows) in %s, proxy VmHWM %d kB\n", rows, time.Since(start).Round(time.Millisecond), vmHWM(b, pid))
	}
	fmt.Printf("\nproxy VmHWM after start: %d kB\n", idle)
	b.ResetTimer()
	for range b.N {
		stream(`SELECT id, v, pad FROM wide`)
		stream(`SELECT id, v, pad FROM wide ORDER BY id`)
		distinct()
	}
	b.StopTimer()
	b.ReportMetric(float64(vmHWM(b, pid))/1024, "peak-MiB")
}

// vmHWM reads the peak resident set size of a process, in kB.
func vmHWM(b *testing.B, pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no VmHWM")
	return 0
}
