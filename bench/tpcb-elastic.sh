#!/usr/bin/env bash
# pgbench's TPC-B through Lattice while the set of nodes changes under it:
# pgbench_accounts a tree of 16 shards on n1 and n2, pgbench_tellers and
# pgbench_branches reference tables (every transaction writes both, on
# every node that holds them), pgbench_history on the catalog node. Ten
# seconds into the run n3 is added, the tree rebalanced onto it (n3 gets
# its copies of the reference tables before its first shard), n2 drained
# and removed (its copies are dropped). Prints pgbench's count of failed
# transactions and the errors it printed, TPC-B's invariant (the four
# balance sums agree) through the proxy and the copies' sums on the nodes
# left, and how many writes the proxy held while copies changed.
#   bench/tpcb-elastic.sh [path/to/lattice]   (default: builds bin/lattice)
# TPCB_MODE sets pgbench's protocol (default prepared), TPCB_TIME the run's
# seconds (default 90).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/pglocal.sh
bin=$(lattice_bin "${1:-}")
pgbin=/usr/lib/postgresql/15/bin
work=$(mktemp -d /tmp/lattice-tpcbe.XXXXXX)
chmod 755 "$work"
cleanup() {
  set +e
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
  stop_pg n1 n2 n3
  rm -rf "$work"
}
trap cleanup EXIT
p1=$(free_port); p2=$(free_port); p3=$(free_port); lport=$(free_port); aport=$(free_port)
start_pg n1 "$p1"; start_pg n2 "$p2"; start_pg n3 "$p3"
dsn() { echo "postgres://lattice@127.0.0.1:$1/postgres?sslmode=disable"; }
"$bin" serve --listen 127.0.0.1:$lport --admin 127.0.0.1:$aport \
  --node "n1=$(dsn "$p1")" --node "n2=$(dsn "$p2")" --log-level warn 2>"$work/lattice.log" &
lpid=$!
L=$(dsn "$lport")
for _ in $(seq 100); do psql -qAt "$L" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
q() { psql -qAt "$L" -c "$1"; }
pgbench -q -i -s 8 -I dtgp "$L" >/dev/null 2>&1
q "SELECT lattice_create_tree('pgbench_accounts', 'aid', shard_count => 16)" >/dev/null
q "SELECT lattice_create_reference_table('pgbench_branches')" >/dev/null
q "SELECT lattice_create_reference_table('pgbench_tellers')" >/dev/null
pgbench -n -c 8 -j 2 -T "${TPCB_TIME:-90}" -M "${TPCB_MODE:-prepared}" "$L" >"$work/pgbench.out" 2>&1 &
pb=$!
sleep 10
step() { # label statement completion-query
  local t0; t0=$(date +%s)
  q "$2" >/dev/null
  if [ -n "$3" ]; then until [ "$(q "$3")" = t ]; do sleep 1; done; fi
  echo "$1: $(( $(date +%s) - t0 )) s"
}
step "add n3" "SELECT lattice_add_node('n3', '$(dsn "$p3")')" "SELECT count(*) = 3 FROM lattice_nodes() WHERE reachable"
step "rebalance" "SELECT lattice_rebalance('pgbench_accounts')" "SELECT lattice_rebalance_complete('pgbench_accounts')"
step "drain n2" "SELECT lattice_drain_node('n2')" "SELECT lattice_drain_complete('n2')"
step "remove n2" "SELECT lattice_remove_node('n2')" ""
wait "$pb" || true
grep -E "^tps|failed transactions" "$work/pgbench.out"
echo "pgbench errors: $(grep -ci error "$work/pgbench.out" || true)"
grep -i error "$work/pgbench.out" | head -3 || true
sums=""
for t in "abalance) FROM pgbench_accounts" "tbalance) FROM pgbench_tellers" "bbalance) FROM pgbench_branches" "delta) FROM pgbench_history"; do
  sums="$sums $(q "SELECT sum($t")"
done
echo "balance sums through the proxy (accounts, tellers, branches, history):$sums"
for p in "$p1" "$p3"; do
  echo "copies on the node at port $p (tellers, branches): $(psql -qAt "$(dsn "$p")" -c "SELECT (SELECT sum(tbalance) FROM pgbench_tellers) || ' ' || (SELECT sum(bbalance) FROM pgbench_branches)")"
done
curl -s "http://127.0.0.1:$aport/metrics" | grep -E '^lattice_proxy_(reference_holds|errors_sent)_total' || true
