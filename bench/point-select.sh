#!/usr/bin/env bash
# Point-select tps directly on PostgreSQL, through pgbouncer and through
# Lattice, side by side in one run, in all three pgbench protocol modes.
# Prints a markdown table. LATTICE_BENCH_SECONDS sets each run's length.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh
LATTICE_TEST_RACE=0 go test -count=1 -run '^$' -bench BenchmarkPointSelect -benchtime 1x -timeout 30m ./integration 2>&1 \
  | grep -E '^\||^Point|^Benchmark|FAIL|ok'
