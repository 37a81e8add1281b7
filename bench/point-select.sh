#!/usr/bin/env bash
# Point-select tps directly on PostgreSQL, through pgbouncer and through
# Lattice, with each proxy's own CPU per query, side by side in one run, in
# all three pgbench protocol modes (make bench runs the same benchmark).
# Prints a markdown table. LATTICE_BENCH_CPU_TX sets the transactions per
# client of each run (default 10000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh
LATTICE_TEST_RACE=0 go test -count=1 -run '^$' -bench BenchmarkPointSelect -benchtime 1x -timeout 30m ./integration 2>&1 \
  | sed -n -E 's/^BENCHMD //p; /^(Benchmark|FAIL|ok)/p'
