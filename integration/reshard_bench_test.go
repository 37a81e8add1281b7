package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pointLoad runs point SELECTs from workers until ctx ends and returns the
// latencies.
func pointLoad(ctx context.Context, pool *pgxpool.Pool, workers, keys int) ([]time.Duration, error) {
	var mu sync.Mutex
	var all []time.Duration
	var first error
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			var lat []time.Duration
			for ctx.Err() == nil {
				k := "c-" + strconv.Itoa(rng.IntN(keys))
				start := time.Now()
				var v int64
				if err := pool.QueryRow(ctx, "SELECT v FROM catalogue WHERE k = $1", k).Scan(&v); err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						first = err
						mu.Unlock()
					}
					break
				}
				lat = append(lat, time.Since(start))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, first
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// flipTimes returns, for each "flipped" line of a proxy log, the duration
// logged under key (the pause, or one of its steps).
func flipTimes(log, key string) []time.Duration {
	re := regexp.MustCompile(`\b` + key + `=(\S+)`)
	var out []time.Duration
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "msg=flipped ") {
			continue
		}
		if m := re.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				out = append(out, d)
			}
		}
	}
	return out
}

// slowestPauses is a table of the n longest pauses of a proxy log with
// their steps, so the steps that make the tail, not the median, show.
func slowestPauses(log string, n int) string {
	pauses := flipTimes(log, "pause")
	cols := make([][]time.Duration, len(freezeSteps))
	for i, k := range freezeSteps {
		cols[i] = flipTimes(log, k)
		if len(cols[i]) != len(pauses) {
			return "slowest pauses: the flipped lines lack a step\n"
		}
	}
	order := make([]int, len(pauses))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(pauses[b] - pauses[a]) })
	// The fence's halves, where the log has them.
	var parts [][]time.Duration
	for _, k := range fenceParts {
		if d := flipTimes(log, k); len(d) == len(pauses) {
			parts = append(parts, d)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "slowest pauses (ms): %8s", "pause")
	for _, k := range freezeSteps {
		fmt.Fprintf(&sb, " %11s", k)
	}
	for _, k := range fenceParts[:len(parts)] {
		fmt.Fprintf(&sb, " %12s", k)
	}
	sb.WriteString("\n")
	for _, i := range order[:min(n, len(order))] {
		fmt.Fprintf(&sb, "                     %8.1f", float64(pauses[i].Microseconds())/1000)
		for c := range freezeSteps {
			fmt.Fprintf(&sb, " %11.1f", float64(cols[c][i].Microseconds())/1000)
		}
		for _, d := range parts {
			fmt.Fprintf(&sb, " %12.1f", float64(d[i].Microseconds())/1000)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// freezeSteps are the parts of a freeze the migrator logs with each flip.
var freezeSteps = []string{"freeze_wait", "map_write", "acks", "fence", "final_drain", "flip"}

// fenceParts are the fence step's two halves, which run side by side: the
// fence's transaction and the look for proxies cut off from Redis.
var fenceParts = []string{"fence_arm", "cut_off_look"}

// BenchmarkReshardPointQueries measures point-query throughput and p99
// latency through the proxy before and during a reshard of a 200,000-row
// tree from 64 to 128 shards on 3 nodes, and the freeze-to-flip pause of
// each migration (p50, p99) from the proxy's log.
//
//	LATTICE_TEST_RACE=0 go test -run '^$' -bench BenchmarkReshardPointQueries -benchtime 1x ./integration
//
// LATTICE_BENCH_LOG=file keeps the proxy's log there, to line up a slow
// pause with what else the proxy logged. LATTICE_BENCH_PROXY_ARGS adds
// flags to the proxy's command line, to weigh a setting against the
// default in the same conditions (--max-concurrent-migrations=2, say).
func BenchmarkReshardPointQueries(b *testing.B) {
	for i := 0; i < b.N; i++ {
		resetNodes(b)
		ctx := context.Background()
		p := startProxy(b, 3, strings.Fields(os.Getenv("LATTICE_BENCH_PROXY_ARGS"))...)
		pool, err := pgxpool.New(ctx, p.DSN("lattice")+"&pool_max_conns=8")
		if err != nil {
			b.Fatal(err)
		}
		const keys = 200_000
		for _, q := range []string{
			"CREATE TABLE catalogue (k text PRIMARY KEY, v bigint NOT NULL, pad text)",
			"INSERT INTO catalogue SELECT 'c-' || g, g, md5(g::text) FROM generate_series(0, " + strconv.Itoa(keys-1) + ") g",
			"SELECT lattice_create_tree('catalogue', 'k', shard_count => 64)",
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				b.Fatalf("%s: %v", q, err)
			}
		}
		secs := benchSeconds()
		before, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second)
		start := time.Now()
		latBefore, err := pointLoad(before, pool, 8, keys)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		tookBefore := time.Since(start)

		if _, err := pool.Exec(ctx, "SELECT lattice_reshard('catalogue', 128)"); err != nil {
			b.Fatal(err)
		}
		during, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		var latDuring []time.Duration
		var loadErr error
		start = time.Now()
		go func() {
			defer close(done)
			latDuring, loadErr = pointLoad(during, pool, 8, keys)
		}()
		for {
			var complete bool
			if err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete('catalogue')").Scan(&complete); err != nil {
				b.Fatal(err)
			}
			if complete {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		stop()
		<-done
		tookDuring := time.Since(start)
		if loadErr != nil {
			b.Fatal(loadErr)
		}
		log := p.Log()
		if f := os.Getenv("LATTICE_BENCH_LOG"); f != "" {
			_ = os.WriteFile(f, []byte(log), 0o644)
		}
		pauses := flipTimes(log, "pause")
		var steps []string
		for _, k := range freezeSteps {
			d := flipTimes(log, k)
			steps = append(steps, fmt.Sprintf("%s p50 %s p99 %s", k, percentile(d, 0.5).Round(10*time.Microsecond), percentile(d, 0.99).Round(10*time.Microsecond)))
		}
		pool.Close()
		tpsBefore := float64(len(latBefore)) / tookBefore.Seconds()
		tpsDuring := float64(len(latDuring)) / tookDuring.Seconds()
		b.ReportMetric(tpsBefore, "tps_before")
		b.ReportMetric(tpsDuring, "tps_during")
		b.ReportMetric(float64(percentile(latBefore, 0.99).Microseconds())/1000, "p99_ms_before")
		b.ReportMetric(float64(percentile(latDuring, 0.99).Microseconds())/1000, "p99_ms_during")
		b.ReportMetric(float64(percentile(pauses, 0.5).Microseconds())/1000, "pause_p50_ms")
		b.ReportMetric(float64(percentile(pauses, 0.99).Microseconds())/1000, "pause_p99_ms")
		b.ReportMetric(float64(percentile(pauses, 1).Microseconds())/1000, "pause_max_ms")
		b.ReportMetric(float64(len(pauses)), "migrations")
		b.ReportMetric(tookDuring.Seconds(), "reshard_s")
		fmt.Printf("reshard 64 -> 128 of %d rows took %s; %d migrations; point queries: before %.0f tps p99 %s, during %.0f tps p99 %s; freeze pause p50 %s p99 %s max %s\n",
			keys, tookDuring.Round(time.Millisecond), len(pauses), tpsBefore, percentile(latBefore, 0.99), tpsDuring, percentile(latDuring, 0.99),
			percentile(pauses, 0.5), percentile(pauses, 0.99), percentile(pauses, 1))
		fmt.Printf("freeze steps: %s\n", strings.Join(steps, "; "))
		fmt.Print(slowestPauses(log, 10))
	}
}
