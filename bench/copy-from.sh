#!/usr/bin/env bash
# COPY FROM STDIN of 1,000,000 rows directly into one plain table on one
# node and through Lattice into a tree of 64 shards on 2 nodes, side by side
# in one run, text and binary format. Prints a markdown table.
# LATTICE_BENCH_COPY_ROWS sets the row count.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh
LATTICE_TEST_RACE=0 go test -count=1 -run '^$' -bench BenchmarkCopyFrom -benchtime 1x -timeout 30m ./integration 2>&1 \
  | grep -E '^\||^COPY|^Benchmark|FAIL|ok'
