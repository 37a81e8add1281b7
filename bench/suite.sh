#!/usr/bin/env bash
# The published benchmark suite (`make bench`). In one run it starts its own
# servers (3 PostgreSQL 15 nodes and redis-server, through the integration
# harness), builds lattice without -race, runs pgbouncer, and measures:
#   - point selects, direct vs pgbouncer vs Lattice, with each proxy's own
#     CPU per query, in the simple, extended and prepared protocols;
#   - pgbench select-only and TPC-B-like, direct vs pgbouncer vs Lattice
#     (the tree on 2 nodes, and on the direct node alone), in the simple,
#     extended and prepared protocols;
#   - split and fold throughput against a raw COPY TO | COPY FROM;
#   - a whole grow and a move, end to end, against the same raw pipe, with
#     the time each phase of the pipeline takes;
#   - the freeze pause distribution;
#   - point-select tps and p99 during a reshard against before it.
# It writes bench/results.md (machine, versions, date, the command to rerun)
# and prints it. Settings, all optional:
#   BENCH_SECONDS=10         length of each pgbench run and of the
#                            "before" phase of the reshard benchmark
#   BENCH_CLIENTS=8          pgbench clients
#   BENCH_SCALE=4            pgbench scale (100,000 accounts each)
#   BENCH_SHARDS=16          shards of the pgbench_accounts tree
#   BENCH_CPU_TX=10000       transactions per client of each point-select
#                            run that measures proxy CPU per query
#   BENCH_RESHARD_ROWS=500000  rows of the grow/shrink cycle
#   BENCH_SPLIT_ROWS=1000000   rows of the shard the split benchmark copies half of
#   BENCH_PIPELINE_ROWS=1000000  rows of the tree the pipeline benchmark
#                            grows from 2 to 4 shards and moves a shard of
#   BENCH_OUT=bench/results.md
#   BENCH_NOTE="..."         a line printed under the heading (why the
#                            figures may be off, say)
#   BENCH_README=1           also replace the results in README.md (between
#                            the bench-results markers) with this run's
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh

out=${BENCH_OUT:-bench/results.md}
secs=${BENCH_SECONDS:-10}
clients=${BENCH_CLIENTS:-8}
scale=${BENCH_SCALE:-4}
shards=${BENCH_SHARDS:-16}
cpu_tx=${BENCH_CPU_TX:-10000}
reshard_rows=${BENCH_RESHARD_ROWS:-500000}
split_rows=${BENCH_SPLIT_ROWS:-1000000}
pipeline_rows=${BENCH_PIPELINE_ROWS:-1000000}
pgbin=/usr/lib/postgresql/15/bin

rerun="BENCH_SECONDS=$secs BENCH_CLIENTS=$clients BENCH_SCALE=$scale BENCH_SHARDS=$shards BENCH_CPU_TX=$cpu_tx BENCH_RESHARD_ROWS=$reshard_rows BENCH_SPLIT_ROWS=$split_rows BENCH_PIPELINE_ROWS=$pipeline_rows make bench"
cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
cores=$(nproc)
mem=$(awk '/^MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
pgver=$("$pgbin/postgres" --version)
bouncer=$( (/usr/sbin/pgbouncer --version 2>/dev/null || pgbouncer --version 2>/dev/null || echo "not installed") | head -1)
gover=$(go version)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -q . && echo " (with uncommitted changes)" || true)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

log=$(mktemp -t lattice-bench.XXXXXX)
trap 'rm -f "$log"' EXIT
t0=$(date +%s)
# One go test run: one set of servers, one lattice build for every part.
# BenchmarkFold* is picked up when it exists on this branch.
status=0
LATTICE_TEST_RACE=0 LATTICE_BENCH_SECONDS=$secs LATTICE_BENCH_CLIENTS=$clients LATTICE_BENCH_SCALE=$scale \
  LATTICE_BENCH_SHARDS=$shards LATTICE_BENCH_CPU_TX=$cpu_tx LATTICE_BENCH_RESHARD_ROWS=$reshard_rows LATTICE_SPLIT_ROWS=$split_rows \
  LATTICE_BENCH_PIPELINE_ROWS=$pipeline_rows \
  go test -count=1 -run '^$' -benchtime 1x -timeout 60m \
  -bench '^(BenchmarkPointSelect|BenchmarkSuitePgbench|BenchmarkSplitCopy|BenchmarkFold.*|BenchmarkSuiteReshardCycle|BenchmarkPipeline|BenchmarkReshardPointQueries|BenchmarkVerifyMoves)$' \
  ./integration >"$log" 2>&1 || status=$?
took=$(( $(date +%s) - t0 ))
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# metric NAME UNIT: the value a benchmark line reported for UNIT.
metric() {
  awk -v b="$1" -v u="$2" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 3; i < NF; i += 2) if ($(i+1) == u) { print $i; exit } }' "$log"
}
has() { grep -qE "^$1(-[0-9]+)?[[:space:]]" "$log"; }

{
  echo "### Results"
  echo
  if [ -n "${BENCH_NOTE:-}" ]; then echo "**${BENCH_NOTE}**"; echo; fi
  echo "Run on $started, commit $commit$dirty, in $((took / 60)) min $((took % 60)) s."
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| CPU | $cpu |"
  echo "| cores | $cores |"
  echo "| memory | $mem |"
  echo "| load average (1/5/15 min) at start, at end | $load_start; $load_end |"
  echo "| PostgreSQL | $pgver |"
  echo "| pgbouncer | $bouncer |"
  echo "| Go | $gover |"
  echo
  echo "Every server runs on this one machine: 3 PostgreSQL nodes (fsync off), redis-server, pgbouncer, lattice (built without -race) and the load generators share its cores. Rerun with:"
  echo
  echo '```'
  echo "$rerun"
  echo '```'
  echo
  # The pipeline's section is printed after the reshard cycle's.
  sed -n "s/^BENCHMD //p" "$log" | awk '/^#### Reshard: splits and folds/ {exit} /^#### Pipeline/ {skip=1; next} /^#### / {skip=0} !skip {print}'

  echo "#### Split and fold shadow copy vs raw COPY"
  echo
  echo "The shadow copy of one migration (publication with a slot row filter, exported snapshot, binary COPY) against a raw binary \`COPY TO STDOUT | COPY FROM STDIN\` of the same rows between the same two nodes (BenchmarkSplitCopy: half the slots of a $split_rows-row shard; BenchmarkFold*: see its comment)."
  echo
  echo "| benchmark | metric | value |"
  echo "|---|---|---|"
  found=0
  for b in $(grep -oE '^Benchmark(SplitCopy|Fold[A-Za-z0-9_]*)(-[0-9]+)?' "$log" | sed 's/-[0-9]*$//' | sort -u); do
    found=1
    awk -v b="$b" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 5; i < NF; i += 2) printf "| %s | %s | %s |\n", b, $(i+1), $i }' "$log"
  done
  if [ "$found" = 0 ]; then echo "| (none ran) | | |"; fi
  if ! has 'BenchmarkFold[A-Za-z0-9_]*'; then
    echo
    echo "No BenchmarkFold* on this branch: fold throughput is in the grow/shrink table below."
  fi
  echo
  sed -n "s/^BENCHMD //p" "$log" | awk '/^#### Reshard: splits and folds/ {p=1} p {print}'
  if has BenchmarkPipeline; then
    sed -n "s/^BENCHMD //p" "$log" | awk '/^#### Pipeline/ {p=1; print; next} /^#### / {p=0} p {print}'
  else
    echo "#### Pipeline: a whole grow and a move vs raw COPY"
    echo
    echo "BenchmarkPipeline did not report (see the failures below)."
    echo
  fi

  echo "#### Point selects during a reshard"
  echo
  if has BenchmarkReshardPointQueries; then
    echo "BenchmarkReshardPointQueries: 8 pgx workers run \`SELECT v FROM catalogue WHERE k = \$1\` through Lattice on a 200,000-row tree on 3 nodes, for $secs s before and then while it reshards from 64 to 128 shards. Freeze pauses from the per-migration log lines."
    echo
    echo "| | before | during reshard | during/before |"
    echo "|---|---|---|---|"
    tb=$(metric BenchmarkReshardPointQueries tps_before); td=$(metric BenchmarkReshardPointQueries tps_during)
    pb=$(metric BenchmarkReshardPointQueries p99_ms_before); pd=$(metric BenchmarkReshardPointQueries p99_ms_during)
    awk -v tb="$tb" -v td="$td" -v pb="$pb" -v pd="$pd" 'BEGIN {
      printf "| point-select tps | %.0f | %.0f | %.2f |\n", tb, td, (tb > 0 ? td / tb : 0)
      printf "| p99 latency ms | %.2f | %.2f | %.2f |\n", pb, pd, (pb > 0 ? pd / pb : 0) }'
    echo
    echo "Reshard took $(metric BenchmarkReshardPointQueries reshard_s) s, $(metric BenchmarkReshardPointQueries migrations | awk '{printf "%.0f", $1}') migrations; freeze pause p50 $(metric BenchmarkReshardPointQueries pause_p50_ms) ms, p99 $(metric BenchmarkReshardPointQueries pause_p99_ms) ms, max $(metric BenchmarkReshardPointQueries pause_max_ms) ms."
  else
    echo "BenchmarkReshardPointQueries did not report (see the failures below)."
  fi
  echo
  echo "#### Verification of moves"
  echo
  if has BenchmarkVerifyMoves; then
    echo "BenchmarkVerifyMoves: four reshards of 200,000-row trees from 8 to 16 shards on 3 nodes under point reads and updates, with \`--verify-moves\` on, off, off and on, in one run."
    echo
    echo "| | verification on | off |"
    echo "|---|---|---|"
    echo "| freeze pause p50 ms | $(metric BenchmarkVerifyMoves pause_p50_ms_verify) | $(metric BenchmarkVerifyMoves pause_p50_ms_noverify) |"
    echo "| freeze pause p99 ms | $(metric BenchmarkVerifyMoves pause_p99_ms_verify) | $(metric BenchmarkVerifyMoves pause_p99_ms_noverify) |"
    echo "| freeze pause max ms | $(metric BenchmarkVerifyMoves pause_max_ms_verify) | $(metric BenchmarkVerifyMoves pause_max_ms_noverify) |"
    echo
    echo "Snapshot exports after the flip, out of the pause: p50 $(metric BenchmarkVerifyMoves snapshots_after_flip_p50_ms) ms. The comparison after the flip: $(metric BenchmarkVerifyMoves verify_s_per_Mrow) s and $(metric BenchmarkVerifyMoves verify_bytes_per_row | awk '{printf "%.0f", $1}') MB of table scanned per million rows compared."
  else
    echo "BenchmarkVerifyMoves did not report (see the failures below)."
  fi
  echo
  if [ "$status" != 0 ] || grep -qE '^(--- FAIL|FAIL|panic:)' "$log"; then
    echo "#### Failures"
    echo
    echo "go test exited with status $status:"
    echo
    echo '```'
    grep -E -A 15 '^(--- FAIL|panic:)' "$log" | head -60 || true
    grep -E '^(FAIL|ok)' "$log" || true
    echo '```'
  fi
} >"$out"

cat "$out"
if [ "${BENCH_README:-}" = 1 ]; then
  # The results go between the markers; everything else stays.
  awk -v f="$out" '
    /<!-- bench-results:end -->/ { skip = 0 }
    !skip { print }
    /<!-- bench-results:begin -->/ { while ((getline l < f) > 0) print l; skip = 1 }
  ' README.md >README.md.tmp && mv README.md.tmp README.md
  echo "replaced the results in README.md" >&2
fi
echo
echo "wrote $out in ${took}s (go test status $status)" >&2
exit "$status"
