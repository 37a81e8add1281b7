package integration

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// BenchmarkPipeline measures the migration pipeline end to end against a
// raw binary COPY TO | COPY FROM of as many rows between the same two
// nodes, in one run: a whole grow of LATTICE_BENCH_PIPELINE_ROWS rows
// (1,000,000) from 2 to 4 shards on 2 nodes, from lattice_reshard to
// lattice_reshard_complete = true, then a lattice_move_shard of one shard
// from node 1 to node 2, to lattice_rebalance_complete = true. With each it
// splits the time into the pipeline's phases, from the migrator's
// "migration phase" log lines.
//
//	LATTICE_TEST_RACE=0 go test -run '^$' -bench '^BenchmarkPipeline$' -benchtime 1x ./integration
func BenchmarkPipeline(b *testing.B) {
	ctx := context.Background()
	rows := envInt("LATTICE_BENCH_PIPELINE_ROWS", 1_000_000)
	for i := 0; i < b.N; i++ {
		p, c := benchTree(b, "pipe", rows, 2)
		md("#### Pipeline: a whole grow and a move vs raw COPY\n")
		md("A tree of %d rows (bigint key, about 80 bytes a row) on 2 nodes, with no client load: a grow from 2 to 4 shards "+
			"from `lattice_reshard` to `lattice_reshard_complete` = true, then `lattice_move_shard` of one shard from n1 to n2 "+
			"to `lattice_rebalance_complete` = true. raw is one binary `COPY (SELECT … LIMIT n) TO STDOUT | COPY … FROM STDIN` "+
			"of as many rows between the same two nodes, right after each. The phases are the mean time each migration spent in "+
			"each (they overlap when migrations run at once); wait is from the call to the first migration's start, tail from "+
			"the last migration's end to the completion seen.\n", rows)
		md("| step | migrations | rows copied | wall time s | rows/s | raw COPY rows/s | pipeline/raw |")
		md("|---|---|---|---|---|---|---|")
		var breakdowns []string
		logFrom := len(p.Log())
		for _, step := range []struct {
			name, call, done, metric string
		}{
			{"grow 2 → 4 (splits)", `SELECT lattice_reshard('pipe', 4)`, `SELECT lattice_reshard_complete('pipe')`, "grow/raw"},
			{"move shard to n2", "", `SELECT lattice_rebalance_complete('pipe')`, "move/raw"},
		} {
			call := step.call
			if call == "" {
				idx, most := int32(-1), int32(0)
				// The proxy serves lattice_shards only whole.
				rs, err := c.Query(ctx, `SELECT shard, node, schema, slot_ranges, slot_count, state, rows_estimate FROM lattice_shards('pipe')`)
				if err != nil {
					b.Fatal(err)
				}
				for rs.Next() {
					var shard, slots int32
					var node, schema, ranges, state string
					var estimate *int64
					if err := rs.Scan(&shard, &node, &schema, &ranges, &slots, &state, &estimate); err != nil {
						b.Fatal(err)
					}
					if node == "n1" && state == "active" && slots > most {
						idx, most = shard, slots
					}
				}
				if rs.Close(); rs.Err() != nil || idx < 0 {
					b.Fatalf("no active shard on n1 to move: %v", rs.Err())
				}
				call = fmt.Sprintf(`SELECT lattice_move_shard('pipe', %d, 'n2')`, idx)
			}
			before := scrapeMetrics(b, p)
			start := time.Now()
			runUntil(b, ctx, c, call, step.done)
			took := time.Since(start)
			after := scrapeMetrics(b, p)
			copied := int64(after.sum("lattice_migrator_rows_copied_total") - before.sum("lattice_migrator_rows_copied_total"))
			log := p.Log()
			stepLog := log[logFrom:]
			phases := phaseTimes(stepLog)
			logFrom = len(log)
			raw := rawCopyRate(b, ctx, "pipe", copied)
			rate := float64(copied) / took.Seconds()
			md("| %s | %d | %d | %.2f | %.0f | %.0f | %.2f |", step.name, len(phases), copied, took.Seconds(), rate, raw, rate/raw)
			b.ReportMetric(rate/raw, step.metric)
			for _, l := range strings.Split(stepLog, "\n") {
				if strings.Contains(l, `msg="moved rows released"`) || strings.Contains(l, `msg="move verified"`) ||
					strings.Contains(l, `msg="shadow copy done"`) || strings.Contains(l, `msg=flipped`) {
					fmt.Println(l)
				}
			}
			fmt.Print(phaseTimeline(step.name, phases, start, took))
			breakdowns = append(breakdowns, "| "+step.name+" | "+phaseBreakdown(phases, start, took)+" |")
		}
		md("\nWhere the time goes (ms):\n")
		md("| step | wait | prepare | copy | drain | freeze | verify | release | tail |")
		md("|---|---|---|---|---|---|---|---|---|")
		for _, l := range breakdowns {
			md("%s", l)
		}
		md("")
		c.Close(ctx)
	}
}

// pipelinePhases are the phases a migration logs, in order; "run" is its
// start, "done" its end.
var pipelinePhases = []string{"run", "copy", "drain", "freeze", "flip", "release", "done"}

var phaseLineRe = regexp.MustCompile(`^time=(\S+) .*msg="migration (?:run|phase)" .*migration=(\w+) .*phase=(\w+)`)

// phaseTimes reads, per migration, when it started ("run", its first run)
// and when it entered each later phase, from a proxy log.
func phaseTimes(log string) map[string]map[string]time.Time {
	out := map[string]map[string]time.Time{}
	for _, line := range strings.Split(log, "\n") {
		m := phaseLineRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		phase := m[3]
		if strings.Contains(line, `msg="migration run"`) {
			phase = "run"
		}
		if out[m[2]] == nil {
			out[m[2]] = map[string]time.Time{}
		}
		if _, seen := out[m[2]][phase]; !seen {
			out[m[2]][phase] = at
		}
	}
	return out
}

// phaseTimeline prints, per migration, when it entered each phase, in ms
// from the call: which phases overlap, and which one ends the step.
func phaseTimeline(step string, phases map[string]map[string]time.Time, start time.Time, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "timeline of %s (ms from the call; complete seen at %d):\n", step, took.Milliseconds())
	ids := make([]string, 0, len(phases))
	for id := range phases {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return phases[ids[i]]["run"].Before(phases[ids[j]]["run"]) })
	for _, id := range ids {
		fmt.Fprintf(&b, "  %s", id)
		for _, ph := range pipelinePhases {
			if at, ok := phases[id][ph]; ok {
				fmt.Fprintf(&b, " %s=%d", ph, at.Sub(start).Milliseconds())
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// phaseBreakdown is the table cells of one step: wait, the mean of each
// phase over its migrations, tail.
func phaseBreakdown(phases map[string]map[string]time.Time, start time.Time, took time.Duration) string {
	var first, last time.Time
	sums := make([]time.Duration, len(pipelinePhases)-1)
	counts := make([]int, len(sums))
	for _, at := range phases {
		if t, ok := at["run"]; ok && (first.IsZero() || t.Before(first)) {
			first = t
		}
		if t, ok := at["done"]; ok && t.After(last) {
			last = t
		}
		for i := range sums {
			from, ok1 := at[pipelinePhases[i]]
			to, ok2 := at[pipelinePhases[i+1]]
			if ok1 && ok2 {
				sums[i] += to.Sub(from)
				counts[i]++
			}
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }
	cells := []string{"–"}
	if !first.IsZero() {
		cells[0] = ms(first.Sub(start))
	}
	for i := range sums {
		if counts[i] == 0 {
			cells = append(cells, "–")
			continue
		}
		cells = append(cells, ms(sums[i]/time.Duration(counts[i])))
	}
	if last.IsZero() {
		cells = append(cells, "–")
	} else {
		cells = append(cells, ms(start.Add(took).Sub(last)))
	}
	return strings.Join(cells, " | ")
}
