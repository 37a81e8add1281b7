package integration

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// verifiedLines sums the "move verified" lines of a proxy log: rows
// compared, bytes of table scanned, and time.
func verifiedLines(log string) (rows, bytes int64, took time.Duration, n int) {
	re := regexp.MustCompile(`msg="move verified".*? rows=(\d+) bytes_scanned=(\d+) took=(\S+)`)
	for _, m := range re.FindAllStringSubmatch(log, -1) {
		r, _ := strconv.ParseInt(m[1], 10, 64)
		b, _ := strconv.ParseInt(m[2], 10, 64)
		d, _ := time.ParseDuration(m[3])
		rows, bytes, took, n = rows+r, bytes+b, took+d, n+1
	}
	return
}

// BenchmarkVerifyMoves reshards trees of 200,000 rows from 8 to 16 shards
// on 3 nodes under point-query load, with the verification of moves on
// and off (--verify-moves) in rounds on, off, off, on of one run (a load
// that drifts through the run weighs on both modes alike): the freeze
// pause (p50, p99, max over the migrations of each mode) and each of its
// steps, the snapshots' exports after the flip, and the comparison's time
// and table bytes scanned per million rows compared.
//
//	LATTICE_TEST_RACE=0 go test -run '^$' -bench BenchmarkVerifyMoves -benchtime 1x ./integration
func BenchmarkVerifyMoves(b *testing.B) {
	for i := 0; i < b.N; i++ {
		resetNodes(b)
		ctx := context.Background()
		pauses := map[bool][]time.Duration{}
		steps := map[bool]map[string][]time.Duration{true: {}, false: {}}
		var snaps []time.Duration
		var vRows, vBytes int64
		var vTook time.Duration
		for round, verify := range []bool{true, false, false, true} {
			p := startProxy(b, 3, "--verify-moves="+strconv.FormatBool(verify), "--reshard-tick", "200ms")
			pool, err := pgxpool.New(ctx, p.DSN("lattice")+"&pool_max_conns=8")
			if err != nil {
				b.Fatal(err)
			}
			tree := fmt.Sprintf("items%d", round)
			const keys = 200_000
			for _, q := range []string{
				"CREATE TABLE " + tree + " (k text PRIMARY KEY, v bigint NOT NULL, pad text)",
				"INSERT INTO " + tree + " SELECT 'c-' || g, g, md5(g::text) FROM generate_series(0, " + strconv.Itoa(keys-1) + ") g",
				"SELECT lattice_create_tree('" + tree + "', 'k', shard_count => 8)",
				"SELECT lattice_reshard('" + tree + "', 16)",
			} {
				if _, err := pool.Exec(ctx, q); err != nil {
					b.Fatalf("%s: %v", q, err)
				}
			}
			load, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { _, err := pointLoadOn(load, pool, tree, 4, keys); done <- err }()
			for {
				var complete bool
				if err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete($1)", tree).Scan(&complete); err != nil {
					b.Fatal(err)
				}
				if complete {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			pool.Close()
			log := p.Log()
			pauses[verify] = append(pauses[verify], flipTimes(log, "pause")...)
			for _, k := range freezeSteps {
				steps[verify][k] = append(steps[verify][k], flipTimes(log, k)...)
			}
			if verify {
				snaps = append(snaps, flipTimes(log, "snapshots_after_flip")...)
				r, by, d, _ := verifiedLines(log)
				vRows, vBytes, vTook = vRows+r, vBytes+by, vTook+d
			}
			p.cleanup(b)
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(percentile(pauses[true], 0.5)), "pause_p50_ms_verify")
		b.ReportMetric(ms(percentile(pauses[false], 0.5)), "pause_p50_ms_noverify")
		b.ReportMetric(ms(percentile(pauses[true], 0.99)), "pause_p99_ms_verify")
		b.ReportMetric(ms(percentile(pauses[false], 0.99)), "pause_p99_ms_noverify")
		b.ReportMetric(ms(percentile(pauses[true], 1)), "pause_max_ms_verify")
		b.ReportMetric(ms(percentile(pauses[false], 1)), "pause_max_ms_noverify")
		b.ReportMetric(ms(percentile(snaps, 0.5)), "snapshots_after_flip_p50_ms")
		if vRows > 0 {
			b.ReportMetric(vTook.Seconds()/float64(vRows)*1e6, "verify_s_per_Mrow")
			b.ReportMetric(float64(vBytes)/float64(vRows), "verify_bytes_per_row")
		}
		var ps []string
		for _, v := range []bool{true, false} {
			ps = append(ps, fmt.Sprintf("verify=%v: %d migrations, pause p50 %s p99 %s max %s", v, len(pauses[v]), percentile(pauses[v], 0.5), percentile(pauses[v], 0.99), percentile(pauses[v], 1)))
		}
		// The pause's steps side by side, so a step that grows with the
		// verification shows in the same run.
		for _, k := range freezeSteps {
			fmt.Printf("freeze step %s: p50 %s / %s, p99 %s / %s (verify on / off)\n", k,
				percentile(steps[true][k], 0.5).Round(10*time.Microsecond), percentile(steps[false][k], 0.5).Round(10*time.Microsecond),
				percentile(steps[true][k], 0.99).Round(10*time.Microsecond), percentile(steps[false][k], 0.99).Round(10*time.Microsecond))
		}
		fmt.Printf("%s; snapshot exports after the flip p50 %s; verification: %d rows in %s (%.2f s per million rows, %.0f MB of table scanned per million rows)\n",
			strings.Join(ps, "; "), percentile(snaps, 0.5), vRows, vTook, vTook.Seconds()/float64(max(vRows, 1))*1e6, float64(vBytes)/float64(max(vRows, 1)))
	}
}

// pointLoadOn runs, from workers until ctx ends, point reads and updates
// (one in four) of tree's keys c-0 .. c-(keys-1), and returns how many.
func pointLoadOn(ctx context.Context, pool *pgxpool.Pool, tree string, workers, keys int) (int64, error) {
	errs := make(chan error, workers)
	counts := make(chan int64, workers)
	for w := range workers {
		go func() {
			var n int64
			for ctx.Err() == nil {
				k := "c-" + strconv.Itoa((w*7919+int(n)*104729)%keys)
				var err error
				if n%4 == 0 {
					_, err = pool.Exec(ctx, "UPDATE "+tree+" SET v = v + 1 WHERE k = $1", k)
				} else {
					var v int64
					err = pool.QueryRow(ctx, "SELECT v FROM "+tree+" WHERE k = $1", k).Scan(&v)
				}
				if err != nil && ctx.Err() == nil {
					errs <- err
					counts <- n
					return
				}
				n++
			}
			errs <- nil
			counts <- n
		}()
	}
	var first error
	var total int64
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
		total += <-counts
	}
	return total, first
}
