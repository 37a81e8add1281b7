#!/usr/bin/env bash
# The proxy's own CPU per point select: CPU ticks (utime+stime from
# /proc/PID/stat) of a separate lattice process over a fixed pgbench run,
# divided by the transaction count, in the simple, extended and prepared
# protocols, beside pgbouncer (transaction pooling) in front of the same
# node in the same run. One PostgreSQL node; Lattice reads a 16-shard tree
# kv of 100,000 rows, pgbouncer a plain table kv_plain of the same rows.
#   bench/proxy-cpu.sh [path/to/lattice]   (default: builds bin/lattice)
# LATTICE_CPU_TX sets the transactions per client (default 20000).
# LATTICE_CPU_PROFILE=DIR saves a CPU profile of each mode's Lattice run
# there (go tool pprof -top DIR/extended.pprof).
# pgbouncer 1.18 cannot run -M prepared in transaction mode: the prepared
# row's ratio is against its extended run.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pglocal.sh
bin=$(lattice_bin "${1:-}")
pgbin=/usr/lib/postgresql/15/bin
tx=${LATTICE_CPU_TX:-20000}
work=$(mktemp -d /tmp/lattice-cpu.XXXXXX)
chmod 755 "$work"
pgport=$(free_port); lport=$(free_port); aport=$(free_port); bport=$(free_port)
cleanup() {
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
  [ -n "${bpid:-}" ] && kill "$bpid" 2>/dev/null && wait "$bpid" 2>/dev/null
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
psql -q "$node" -c 'CREATE TABLE kv_plain (k integer PRIMARY KEY, v integer NOT NULL)' \
  -c 'INSERT INTO kv_plain SELECT i, i FROM generate_series(1, 100000) i' -c 'VACUUM ANALYZE' >/dev/null
printf '\\set k random(1,100000)\nSELECT v FROM kv WHERE k = :k;\n' >"$work/f.sql"
printf '\\set k random(1,100000)\nSELECT v FROM kv_plain WHERE k = :k;\n' >"$work/plain.sql"

bouncer=$(command -v pgbouncer || ls /usr/sbin/pgbouncer 2>/dev/null || true)
bx=""
if [ -n "$bouncer" ]; then
  bdir="$work/pgbouncer"
  mkdir "$bdir"
  printf '"lattice" ""\n' >"$bdir/users.txt"
  cat >"$bdir/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$pgport dbname=postgres user=lattice
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
auth_type = trust
auth_file = $bdir/users.txt
pool_mode = transaction
max_client_conn = 200
default_pool_size = 32
unix_socket_dir =
logfile = $bdir/pgbouncer.log
INI
  # As root, pgbouncer runs as postgres, which must be able to write its log.
  if [ "$(id -u)" = 0 ]; then chown -R postgres "$bdir"; fi
  bargs=("$bdir/pgbouncer.ini"); [ "$(id -u)" = 0 ] && bargs=(-u postgres "${bargs[@]}")
  "$bouncer" "${bargs[@]}" >/dev/null 2>&1 &
  bpid=$!
  bx="postgres://lattice@127.0.0.1:$bport/postgres?sslmode=disable"
  for _ in $(seq 100); do psql -qAt "$bx" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
fi

hz=$(getconf CLK_TCK)
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# counted PID DSN MODE SCRIPT: "µs/query tps" of one fixed-count run.
counted() {
  local t0 t1 out n tps
  t0=$(ticks "$1")
  out=$(pgbench -n -c 8 -j 2 -t "$tx" -M "$3" -f "$4" "$2" 2>&1)
  t1=$(ticks "$1")
  n=$(echo "$out" | awk '/number of transactions actually processed/ {split($NF,a,"/"); print a[1]}')
  tps=$(echo "$out" | awk '/^tps/ {printf "%.0f", $3}')
  awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$n" -v tps="$tps" 'BEGIN {printf "%.1f %s", d * 1e6 / hz / n, tps}'
}
echo "transactions per run: $((8 * tx)), 8 clients; CPU µs/query = proxy utime+stime / transactions"
echo
echo "| mode | pgbouncer CPU µs/query | pgbouncer tps | lattice CPU µs/query | lattice tps | lattice/pgbouncer CPU |"
echo "|---|---|---|---|---|---|"
b=""
for mode in simple extended prepared; do
  pgbench -n -c 8 -j 2 -t 200 -M "$mode" -f "$work/f.sql" "$px" >/dev/null 2>&1 # warm the pools
  if [ -n "$bx" ] && [ "$mode" != prepared ]; then
    pgbench -n -c 8 -j 2 -t 200 -M "$mode" -f "$work/plain.sql" "$bx" >/dev/null 2>&1
    b=$(counted "$bpid" "$bx" "$mode" "$work/plain.sql")
  fi
  cpid=""
  if [ -n "${LATTICE_CPU_PROFILE:-}" ]; then
    mkdir -p "$LATTICE_CPU_PROFILE"
    # Long enough to cover the run; it ends early with the run's end below.
    curl -s -o "$LATTICE_CPU_PROFILE/$mode.pprof" "http://127.0.0.1:$aport/debug/pprof/profile?seconds=${LATTICE_CPU_PROFILE_SECONDS:-10}" &
    cpid=$!
  fi
  l=$(counted "$lpid" "$px" "$mode" "$work/f.sql")
  [ -n "$cpid" ] && wait "$cpid"
  read -r bus btps <<<"${b:-n/a n/a}"
  read -r lus ltps <<<"$l"
  ratio=$(awk -v l="$lus" -v b="$bus" 'BEGIN {if (b+0 > 0) printf "%.2f×", l / b; else print "n/a"}')
  [ "$mode" = prepared ] && [ -n "$b" ] && bus="$bus (extended)" && btps="$btps (extended)"
  echo "| $mode | $bus | $btps | $lus | $ltps | $ratio |"
done
