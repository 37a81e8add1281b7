#!/usr/bin/env bash
# sysbench oltp_read_write through Lattice (two trees of 16 shards over two
# nodes) and on plain PostgreSQL, one after the other on the same machine.
#   bench/sysbench.sh [path/to/lattice]   (default: builds bin/lattice)
# SYSBENCH_TIME sets each run's seconds (default 60), SYSBENCH_THREADS the
# client threads (default 4), SYSBENCH_ARGS more sysbench options. Besides
# tps it prints the proxy's CPU per transaction (utime+stime), which is
# steadier than tps on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pglocal.sh
bin=$(lattice_bin "${1:-}")
pgbin=/usr/lib/postgresql/15/bin
secs=${SYSBENCH_TIME:-60}
threads=${SYSBENCH_THREADS:-4}
work=$(mktemp -d /tmp/lattice-sysbench.XXXXXX)
chmod 755 "$work"
ports=()
cleanup() {
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
  [ -n "${rpid:-}" ] && kill "$rpid" 2>/dev/null && wait "$rpid" 2>/dev/null
  stop_pg n1 n2 plain
  rm -rf "$work"
}
trap cleanup EXIT
p1=$(free_port); p2=$(free_port); pp=$(free_port); lport=$(free_port); aport=$(free_port); rport=$(free_port)
start_pg n1 "$p1"; start_pg n2 "$p2"; start_pg plain "$pp"
# A redis-server of its own, as in production: the embedded one would
# serve the load counters' writes on the proxy's CPU, which is measured.
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no >"$work/redis.log" 2>&1 &
rpid=$!
"$bin" serve --listen 127.0.0.1:$lport --admin 127.0.0.1:$aport --redis "redis://127.0.0.1:$rport/0" \
  --node "n1=postgres://lattice@127.0.0.1:$p1/postgres?sslmode=disable" \
  --node "n2=postgres://lattice@127.0.0.1:$p2/postgres?sslmode=disable" --log-level warn 2>"$work/lattice.log" &
lpid=$!
for _ in $(seq 100); do psql -qAt "postgres://lattice@127.0.0.1:$lport/postgres" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
sb() { # port command...
  local port=$1; shift
  sysbench oltp_read_write --db-driver=pgsql --pgsql-host=127.0.0.1 --pgsql-port="$port" --pgsql-user=lattice \
    --pgsql-db=postgres --tables=2 --table-size=20000 --auto_inc=off --threads="$threads" --time="$secs" --report-interval=0 ${SYSBENCH_ARGS:-} "$@"
}
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime of a process, in clock ticks
run() { # label port [pid whose CPU per transaction to report]
  local out t0
  [ -n "${3:-}" ] && t0=$(ticks "$3")
  out=$(sb "$2" run 2>&1) || { echo "$out" | tail -30; echo "$1: sysbench failed" >&2; return 1; }
  echo "$out" | grep -E 'transactions:|queries:|ignored errors:|reconnects:' | sed "s/^/$1 /"
  if [ -n "${3:-}" ]; then
    local tx
    tx=$(echo "$out" | awk '/transactions:/ {print $2}')
    echo "$1 proxy CPU per transaction: $(( ($(ticks "$3") - t0) * 1000000 / $(getconf CLK_TCK) / tx )) us"
  fi
}
sb "$lport" prepare >/dev/null
psql -q "postgres://lattice@127.0.0.1:$lport/postgres" -c "SELECT lattice_create_tree('sbtest1','id',16)" -c "SELECT lattice_create_tree('sbtest2','id',16)" >/dev/null
run lattice "$lport" "$lpid"
sb "$pp" prepare >/dev/null
run postgres "$pp"
