#!/usr/bin/env bash
# The proxy's own CPU per point select: CPU ticks (utime+stime from
# /proc/PID/stat) of a separate lattice process over a fixed pgbench run,
# divided by the transaction count, in the simple, extended and prepared
# protocols, beside pgbouncer (transaction pooling) in front of the same
# node in the same run. One PostgreSQL node; Lattice reads a 16-shard tree
# kv of 100,000 rows, pgbouncer a plain table kv_plain of the same rows.
#   bench/proxy-cpu.sh [path/to/lattice]   (default: builds bin/lattice)
#   bench/proxy-cpu.sh NAME=BIN[:VAR=VALUE,VAR=VALUE] ...
# The second form runs several builds (or one build under several
# environments, such as GOMAXPROCS=1) side by side: each is its own lattice
# process over the same tree (they share one redis-server), and every
# repetition runs pgbouncer and then each of them in turn, so that a change
# is compared with its base under the same load. A machine shared with
# other work moves every figure by 10-20% from one run to the next: compare
# the medians of several repetitions.
# Load counting on and off (--load-stats, as $LATTICE_LOAD_STATS) in one run:
#   bench/proxy-cpu.sh on=bin/lattice off=bin/lattice:LATTICE_LOAD_STATS=false
# LATTICE_CPU_TX sets the transactions per client (default 20000),
# LATTICE_CPU_REPS the repetitions of each mode (default 1).
# LATTICE_CPU_PROFILE=DIR saves a CPU profile of each build's first run in
# each mode there (go tool pprof -top DIR/NAME-extended.pprof).
# The "user" figure is the utime part: the rest is the kernel's (system
# calls, most of it loopback TCP). The last lines give each process's peak
# resident memory (VmHWM), so that a runtime setting such as GOGC is judged
# on memory too, and its context switches per query over all runs (every
# thread's, voluntary and not): the Go scheduler parks and wakes threads
# where pgbouncer's one thread loops over epoll.
# pgbouncer 1.18 cannot run -M prepared in transaction mode: the prepared
# row's ratio is against its extended run.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pglocal.sh
pgbin=/usr/lib/postgresql/15/bin
tx=${LATTICE_CPU_TX:-20000}
reps=${LATTICE_CPU_REPS:-1}
[ $# = 0 ] && set -- "$(lattice_bin "")"
names=(); bins=(); envs=()
for v in "$@"; do
  if [[ "$v" == *=* ]]; then
    name=${v%%=*}; rest=${v#*=}
  else
    name=lattice; rest=$v
  fi
  names+=("$name"); bins+=("$(readlink -f "${rest%%:*}")")
  e=""; [[ "$rest" == *:* ]] && e=${rest#*:}
  envs+=("${e//,/ }")
done
work=$(mktemp -d /tmp/lattice-cpu.XXXXXX)
chmod 755 "$work"
pgport=$(free_port); rport=$(free_port); bport=$(free_port)
# The admin endpoint serves pprof only with a token.
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
pids=()
cleanup() {
  # Without errexit: a server that dies of SIGTERM with a nonzero status
  # must not end the cleanup before PostgreSQL is stopped. The lattice
  # processes go first (newest first), so none logs a lost redis.
  set +e
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[$i]}" 2>/dev/null; wait "${pids[$i]}" 2>/dev/null; done
  stop_pg pg
  rm -rf "$work"
}
trap cleanup EXIT
start_pg pg "$pgport"
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no >"$work/redis.log" 2>&1 &
pids+=($!)
node="postgres://lattice@127.0.0.1:$pgport/postgres?sslmode=disable"
dsns=(); lpids=(); aports=()
for i in "${!names[@]}"; do
  lport=$(free_port); aport=$(free_port)
  # One reshard coordinator is enough; the others only serve.
  coord=true; [ "$i" -gt 0 ] && coord=false
  env LATTICE_ADMIN_TOKEN="$token" ${envs[$i]} "${bins[$i]}" serve --listen 127.0.0.1:$lport --admin 127.0.0.1:$aport \
    --redis "redis://127.0.0.1:$rport/0" --coordinator=$coord --node "n1=$node" --log-level warn 2>"$work/lattice$i.log" &
  lpids+=($!); pids+=($!); aports+=("$aport")
  dsns+=("postgres://lattice@127.0.0.1:$lport/postgres?sslmode=disable")
  up=false
  for _ in $(seq 300); do psql -qAt "${dsns[$i]}" -c 'select 1' >/dev/null 2>&1 && { up=true; break; }; sleep 0.2; done
  if ! $up; then echo "${names[$i]} (${bins[$i]}) did not start; its log:" >&2; cat "$work/lattice$i.log" >&2; exit 1; fi
done
psql -q "${dsns[0]}" -c 'CREATE TABLE kv (k integer PRIMARY KEY, v integer NOT NULL)' \
  -c 'INSERT INTO kv SELECT i, i FROM generate_series(1, 100000) i' \
  -c "SELECT lattice_create_tree('kv', 'k', shard_count => 16)" >/dev/null
psql -q "$node" -c 'CREATE TABLE kv_plain (k integer PRIMARY KEY, v integer NOT NULL)' \
  -c 'INSERT INTO kv_plain SELECT i, i FROM generate_series(1, 100000) i' -c 'VACUUM ANALYZE' >/dev/null
# Every build serves the tree before any run: the others learn of it from
# redis, and a run that starts before that fails its first statements.
for i in "${!names[@]}"; do
  served=false
  for _ in $(seq 300); do psql -qAt "${dsns[$i]}" -c 'SELECT v FROM kv WHERE k = 1' 2>/dev/null | grep -qx 1 && { served=true; break; }; sleep 0.2; done
  if ! $served; then echo "${names[$i]} does not serve the tree kv:" >&2; psql -qAt "${dsns[$i]}" -c 'SELECT v FROM kv WHERE k = 1' >&2; exit 1; fi
done
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
  bpid=$!; pids+=($bpid)
  bx="postgres://lattice@127.0.0.1:$bport/postgres?sslmode=disable"
  for _ in $(seq 100); do psql -qAt "$bx" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
fi

hz=$(getconf CLK_TCK)
stat() { awk '{print $14, $15}' "/proc/$1/stat"; }
# switches PID: the context switches of all the process's threads so far.
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n + 0}'; }
# counted PID DSN MODE SCRIPT: "µs/query user-µs/query tps
# switches/query" of one fixed-count run, or "failed failed failed failed"
# with pgbench's first error on stderr: one failed cell, not an empty table.
counted() {
  local u0 s0 u1 s1 out n tps c0 c1
  read -r u0 s0 <<<"$(stat "$1")"
  c0=$(switches "$1")
  if ! out=$(pgbench -n -c 8 -j 2 -t "$tx" -M "$3" -f "$4" "$2" 2>&1); then
    echo "pgbench -M $3 against $2 failed: $(echo "$out" | grep -m1 -i error)" >&2
    echo "failed failed failed failed"
    return
  fi
  read -r u1 s1 <<<"$(stat "$1")"
  c1=$(switches "$1")
  n=$(echo "$out" | awk '/number of transactions actually processed/ {split($NF,a,"/"); print a[1]}')
  tps=$(echo "$out" | awk '/^tps/ {printf "%.0f", $3}')
  awk -v d=$((u1 + s1 - u0 - s0)) -v u=$((u1 - u0)) -v hz="$hz" -v n="$n" -v tps="$tps" -v c=$((c1 - c0)) \
    'BEGIN {printf "%.1f %.1f %s %.2f", d * 1e6 / hz / n, u * 1e6 / hz / n, tps, c / n}'
}
# switches per query of each measured run, by process, for the last lines.
declare -A swsum swn
addsw() {
  [ "$2" = failed ] && return
  swsum[$1]=$(awk -v a="${swsum[$1]:-0}" -v b="$2" 'BEGIN {print a + b}')
  swn[$1]=$((${swn[$1]:-0} + 1))
}
# memline NAME PID: the process's peak resident memory and its mean context
# switches per query.
memline() {
  local hwm
  hwm=$(awk '/^VmHWM/ {printf "%.1f MB", $2 / 1024}' "/proc/$2/status" 2>/dev/null || echo "n/a")
  echo "$1: peak RSS $hwm, context switches/query $(awk -v s="${swsum[$1]:-0}" -v n="${swn[$1]:-0}" 'BEGIN {if (n > 0) printf "%.2f", s / n; else print "n/a"}')"
}
echo "transactions per run: $((8 * tx)), 8 clients; CPU µs/query = proxy utime+stime / transactions (user: the utime part); load at start $(cut -d' ' -f1-3 /proc/loadavg)"
echo
head="| mode | run | pgbouncer CPU µs/query (user) | pgbouncer tps |"
rule="|---|---|---|---|"
for n in "${names[@]}"; do head="$head $n CPU µs/query (user) | $n tps | $n/pgbouncer CPU |"; rule="$rule---|---|---|"; done
echo "$head"
echo "$rule"
for mode in simple extended prepared; do
  bmode=$mode; [ "$mode" = prepared ] && bmode=extended # pgbouncer 1.18 cannot prepare
  # Warm the pools; a failure shows in the measured run's cell.
  [ -n "$bx" ] && { pgbench -n -c 8 -j 2 -t 200 -M "$bmode" -f "$work/plain.sql" "$bx" >/dev/null 2>&1 || true; }
  for i in "${!names[@]}"; do
    pgbench -n -c 8 -j 2 -t 200 -M "$mode" -f "$work/f.sql" "${dsns[$i]}" >/dev/null 2>&1 || true
  done
  for r in $(seq "$reps"); do
    bus="" bu="" btps=""
    if [ -n "$bx" ]; then
      read -r bus bu btps bsw <<<"$(counted "$bpid" "$bx" "$bmode" "$work/plain.sql")"
      addsw pgbouncer "$bsw"
    fi
    [ "$mode" = prepared ] && [ -n "$bx" ] && btps="$btps (extended)"
    line="| $mode | $r | ${bus:-n/a} (${bu:-n/a}) | ${btps:-n/a} |"
    for i in "${!names[@]}"; do
      cpid=""
      if [ -n "${LATTICE_CPU_PROFILE:-}" ] && [ "$r" = 1 ]; then
        mkdir -p "$LATTICE_CPU_PROFILE"
        # Long enough to cover the run; it ends early with the run's end below.
        curl -s -H "Authorization: Bearer $token" -o "$LATTICE_CPU_PROFILE/${names[$i]}-$mode.pprof" \
          "http://127.0.0.1:${aports[$i]}/debug/pprof/profile?seconds=${LATTICE_CPU_PROFILE_SECONDS:-10}" &
        cpid=$!
      fi
      read -r lus lu ltps lsw <<<"$(counted "${lpids[$i]}" "${dsns[$i]}" "$mode" "$work/f.sql")"
      addsw "${names[$i]}" "$lsw"
      if [ -n "$cpid" ]; then wait "$cpid" || echo "profile of ${names[$i]} $mode failed" >&2; fi
      ratio=$(awk -v l="$lus" -v b="${bus:-0}" 'BEGIN {if (b+0 > 0 && l+0 > 0) printf "%.2f×", l / b; else print "n/a"}')
      line="$line $lus ($lu) | $ltps | $ratio |"
    done
    echo "$line"
  done
done
echo
[ -n "$bx" ] && memline pgbouncer "$bpid"
for i in "${!names[@]}"; do memline "${names[$i]}" "${lpids[$i]}"; done
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
