#!/usr/bin/env bash
# TPC-C with go-tpc v1.0.7's kit (bench/tpcc: its tpcc package, unchanged,
# through pgx), on plain PostgreSQL and through Lattice in one run, tpmC
# side by side:
#   bench/tpcc.sh [path/to/lattice]   (default: builds bin/lattice)
# Lattice serves three nodes; the warehouse-keyed tables are one colocation
# group on their own w_id columns (8 shards) and item a reference table
# (bench/tpcc/lattice.sql), made before the kit loads through the proxy.
# Each side: load, the kit's consistency check, the five transactions with
# TPCC_THREADS clients (default 4) for TPCC_TIME (default 60s) over
# TPCC_WAREHOUSES warehouses (default 1), the consistency check again.
# Any error the kit reports (its 1% New-Order rollbacks are not errors)
# fails the script. TPCC_SIDES="lattice" (or "postgres") runs one side.
# TPCC_RESHARD="16 4" reshards the warehouse group to each shard count in
# turn while the kit runs on Lattice (the first 15 s into the run, each
# once the last completed), and reports each reshard's time and how many
# freezes flipped and rolled back (lattice_migrator_freeze_seconds).
# TPCC_ELASTIC=1 starts Lattice on two nodes instead and, while the kit runs
# (15 s into the run), adds the third with lattice_add_node, rebalances the
# warehouse group, drains n2 and removes it, each step once the one before
# completed, and reports each step's time.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pglocal.sh
bin=$(lattice_bin "${1:-}")
pgbin=/usr/lib/postgresql/15/bin
secs=${TPCC_TIME:-60s}
threads=${TPCC_THREADS:-4}
wh=${TPCC_WAREHOUSES:-1}
work=$(mktemp -d /tmp/lattice-tpcc.XXXXXX)
chmod 755 "$work"
(cd bench/tpcc && go build -o "$work/tpcc" .)
cleanup() {
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
  stop_pg n1 n2 n3 plain
  rm -rf "$work"
}
trap cleanup EXIT
p1=$(free_port); p2=$(free_port); p3=$(free_port); pp=$(free_port); lport=$(free_port); aport=$(free_port)
start_pg n1 "$p1"; start_pg n2 "$p2"; start_pg n3 "$p3"; start_pg plain "$pp"
n3dsn="postgres://lattice@127.0.0.1:$p3/postgres?sslmode=disable"
n3flag=(--node "n3=$n3dsn")
[ -n "${TPCC_ELASTIC:-}" ] && n3flag=()
"$bin" serve --listen 127.0.0.1:$lport --admin 127.0.0.1:$aport \
  --node "n1=postgres://lattice@127.0.0.1:$p1/postgres?sslmode=disable" \
  --node "n2=postgres://lattice@127.0.0.1:$p2/postgres?sslmode=disable" \
  "${n3flag[@]}" --log-level warn 2>"$work/lattice.log" &
lpid=$!
for _ in $(seq 100); do psql -qAt "postgres://lattice@127.0.0.1:$lport/postgres" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime of a process, in clock ticks
failed=0
# reshards DSN: the warehouse group to each count of TPCC_RESHARD in turn.
reshards() {
  sleep 15
  for n in $TPCC_RESHARD; do
    local t0; t0=$(date +%s)
    psql -qAt "$1" -c "SELECT lattice_reshard('warehouse', $n)" >/dev/null || { failed=1; return; }
    until [ "$(psql -qAt "$1" -c "SELECT lattice_reshard_complete('warehouse')")" = t ]; do sleep 1; done
    echo "lattice reshard of warehouse to $n shards: $(( $(date +%s) - t0 )) s"
  done
  curl -s "http://127.0.0.1:$aport/metrics" | awk '/^lattice_migrator_freeze_seconds_count/ && /tree="warehouse"/ {
    o = $0; sub(/.*outcome="/, "", o); sub(/".*/, "", o); n[o] += $NF }
    END { printf "lattice freezes during the run so far: %d flipped, %d rolled back\n", n["flipped"], n["rolled_back"] }'
}
# elastic DSN: n3 joins, the warehouse group is rebalanced, n2 is drained
# and removed.
elastic() {
  sleep 15
  step() { # label statement completion-query
    local t0; t0=$(date +%s)
    psql -qAt "$1" -c "$3" >/dev/null || { failed=1; return 1; }
    if [ -n "$4" ]; then
      until [ "$(psql -qAt "$1" -c "$4")" = t ]; do sleep 1; done
    fi
    echo "lattice $2: $(( $(date +%s) - t0 )) s"
  }
  step "$1" "add n3" "SELECT lattice_add_node('n3', '$n3dsn')" \
    "SELECT count(*) = 3 FROM lattice_nodes() WHERE reachable" || return
  step "$1" "rebalance of warehouse" "SELECT lattice_rebalance('warehouse')" "SELECT lattice_rebalance_complete('warehouse')" || return
  step "$1" "drain of n2" "SELECT lattice_drain_node('n2')" "SELECT lattice_drain_complete('n2')" || return
  step "$1" "removal of n2" "SELECT lattice_remove_node('n2')" "" || return
  psql -qAt "$1" -c "SELECT 'lattice shards per node after: ' || string_agg(node || ' ' || shards || ' (' || pg_size_pretty(bytes) || ')', ', ' ORDER BY node) FROM lattice_nodes()"
}
side() { # label port [extra prepare args]
  local label=$1 dsn="postgres://lattice@127.0.0.1:$2/postgres?sslmode=disable"; shift 2
  tp() { "$work/tpcc" -dsn "$dsn" -warehouses "$wh" -threads "$threads" "$@"; }
  tp "$@" prepare >"$work/$label.prepare" 2>&1 || { tail -20 "$work/$label.prepare"; echo "$label: load failed" >&2; failed=1; return; }
  # A failed check is reported and the run goes on, so one run shows
  # everything that fails (the kit stops a check at its first failure).
  tp check >"$work/$label.check0" 2>&1 || { grep -v '^begin to check' "$work/$label.check0" | tail -5 | sed "s/^/$label check after load: /"; failed=1; }
  tp -time "$secs" run >"$work/$label.run" 2>&1 &
  local run=$!
  [ "$label" = lattice ] && [ -n "${TPCC_RESHARD:-}" ] && reshards "$dsn"
  [ "$label" = lattice ] && [ -n "${TPCC_ELASTIC:-}" ] && elastic "$dsn"
  wait "$run" || { grep -vE '^\[|^tpmC|errors:' "$work/$label.run" | head -20 | sed "s/^/$label run: /"; failed=1; }
  grep -E '^\[Summary\]|^tpmC|errors:' "$work/$label.run" | sed "s/^/$label /" || true
  if tp check >"$work/$label.check" 2>&1; then
    echo "$label consistency after the run: $(grep -c 'begin to check' "$work/$label.check") conditions checked, all held"
  else
    grep -v '^begin to check' "$work/$label.check" | tail -5 | sed "s/^/$label check after run: /"; failed=1
  fi
}
sides=${TPCC_SIDES:-lattice postgres}
for s in $sides; do
  case $s in
  lattice)
    t0=$(ticks "$lpid")
    side lattice "$lport" -setup bench/tpcc/lattice.sql
    echo "lattice proxy CPU during load, checks and run: $(( ($(ticks "$lpid") - t0) / $(getconf CLK_TCK) )) s" ;;
  postgres) side postgres "$pp" ;;
  esac
done
echo
printf '%-10s %s\n' side tpmC
for s in $sides; do printf '%-10s %s\n' "$s" "$(awk '/^tpmC:/ {print $2}' "$work/$s.run" 2>/dev/null | tr -d ,)"; done
exit $failed
