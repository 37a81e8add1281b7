#!/usr/bin/env bash
# The proxy's own CPU per point select: CPU ticks (utime+stime from
# /proc/PID/stat) of a separate lattice process over a fixed pgbench run,
# divided by the transaction count, in the simple, extended and prepared
# protocols. One PostgreSQL node, a 16-shard tree kv of 100,000 rows.
#   bench/proxy-cpu.sh [path/to/lattice]   (default: builds bin/lattice)
# LATTICE_CPU_TX sets the transactions per client (default 20000).
# LATTICE_CPU_PROFILE=DIR saves a 10 s CPU profile of each mode's run there
# (go tool pprof -top DIR/extended.pprof).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pglocal.sh
bin=$(lattice_bin "${1:-}")
pgbin=/usr/lib/postgresql/15/bin
tx=${LATTICE_CPU_TX:-20000}
work=$(mktemp -d /tmp/lattice-cpu.XXXXXX)
chmod 755 "$work"
pgport=$(free_port); lport=$(free_port); aport=$(free_port)
cleanup() {
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
  stop_pg pg
  rm -rf "$work"
}
trap cleanup EXIT
start_pg pg "$pgport"
node="postgres://lattice@127.0.0.1:$pgport/postgres?sslmode=disable"
"$bin" serve --listen 127.0.0.1:$lport --admin 127.0.0.1:$aport --node "n1=$node" --log-level warn 2>"$work/lattice.log" &
lpid=$!
px="postgres://lattice@127.0.0.1:$lport/postgres?sslmode=disable"
for _ in $(seq 100); do psql -qAt "$px" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
psql -q "$px" -c 'CREATE TABLE kv (k integer PRIMARY KEY, v integer NOT NULL)' \
  -c 'INSERT INTO kv SELECT i, i FROM generate_series(1, 100000) i' \
  -c "SELECT lattice_create_tree('kv', 'k', shard_count => 16)" >/dev/null
printf '\\set k random(1,100000)\nSELECT v FROM kv WHERE k = :k;\n' >"$work/f.sql"
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$lpid/stat"; }
echo "| mode | transactions | proxy CPU µs/query | tps |"
echo "|---|---|---|---|"
for mode in simple extended prepared; do
  pgbench -n -c 8 -j 2 -t 200 -M "$mode" -f "$work/f.sql" "$px" >/dev/null 2>&1 # warm the pools
  if [ -n "${LATTICE_CPU_PROFILE:-}" ]; then
    mkdir -p "$LATTICE_CPU_PROFILE"
    curl -s -o "$LATTICE_CPU_PROFILE/$mode.pprof" "http://127.0.0.1:$aport/debug/pprof/profile?seconds=10" &
    cpid=$!
  fi
  t0=$(ticks)
  out=$(pgbench -n -c 8 -j 2 -t "$tx" -M "$mode" -f "$work/f.sql" "$px" 2>&1)
  t1=$(ticks)
  [ -n "${cpid:-}" ] && wait "$cpid"
  n=$(echo "$out" | awk '/number of transactions actually processed/ {split($NF,a,"/"); print a[1]}')
  tps=$(echo "$out" | awk '/^tps/ {printf "%.0f", $3}')
  us=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$n" 'BEGIN {printf "%.1f", d * 1e6 / hz / n}')
  echo "| $mode | $n | $us | $tps |"
done
