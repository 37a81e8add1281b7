#!/usr/bin/env bash
# Runs pgx's own test suite (its root package, pgconn, pgtype and pgxpool)
# on plain PostgreSQL and through Lattice in front of the same node, and
# lists the tests that fail only through Lattice.
#   scripts/pgx-suite.sh [path/to/lattice]   (default: builds bin/lattice)
# PGX_SUITE_PKGS overrides the packages; PGX_SUITE_RUN passes -run.
# The integration test TestPgxSuite runs this when LATTICE_PGX_SUITE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. bench/pglocal.sh
bin=$(lattice_bin "${1:-}")
pgbin=/usr/lib/postgresql/15/bin
pkgs=${PGX_SUITE_PKGS:-". ./pgconn ./pgtype ./pgxpool"}
ver=$(go list -m -f '{{.Version}}' github.com/jackc/pgx/v5)
work=$(mktemp -d /tmp/lattice-pgx.XXXXXX)
chmod 755 "$work"
cleanup() {
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
  stop_pg pg
  rm -rf "$work"
}
trap cleanup EXIT
cp -r "$(go env GOMODCACHE)/github.com/jackc/pgx/v5@$ver" "$work/pgx"
chmod -R u+w "$work/pgx"
pgport=$(free_port); lport=$(free_port); aport=$(free_port)
start_pg pg "$pgport" 300
node="postgres://lattice@127.0.0.1:$pgport/pgx_test?sslmode=disable"
psql -q "postgres://lattice@127.0.0.1:$pgport/postgres" -c 'CREATE DATABASE pgx_test'
psql -q "$node" -c 'create extension hstore' -c 'create extension ltree' -c 'create domain uint64 as numeric(20,0)' \
  -c "create user \" tricky, ' } \"\" \\\\ test user \" superuser password 'secret'" >/dev/null
"$bin" serve --listen 127.0.0.1:$lport --admin 127.0.0.1:$aport --node "n1=$node" --pool-size 40 --log-level warn 2>"$work/lattice.log" &
lpid=$!
proxied="postgres://lattice@127.0.0.1:$lport/pgx_test?sslmode=disable"
for _ in $(seq 100); do psql -qAt "$proxied" -c 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
suite() { # label dsn
  # go test fails when a test fails; the summary below says which.
  (cd "$work/pgx" && PGX_TEST_DATABASE="$2" go test -count=1 -p 1 -timeout 20m ${PGX_SUITE_RUN:+-run "$PGX_SUITE_RUN"} $pkgs -json 2>&1 || true) \
    | python3 -c '
import json, sys
fails, passes, out = set(), 0, {}
for line in sys.stdin:
    try: e = json.loads(line)
    except ValueError: continue
    name = e.get("Package", "").split("/v5")[-1] + " " + e.get("Test", "")
    if e.get("Test") and e.get("Action") == "output": out.setdefault(name, []).append(e["Output"])
    if e.get("Test") and e.get("Action") == "fail": fails.add(name)
    if e.get("Test") and e.get("Action") == "pass": passes += 1
open(sys.argv[1], "w").write("\n".join(sorted(fails)) + "\n")
open(sys.argv[1] + ".log", "w").write("".join("".join(out.get(n, [])) for n in sorted(fails)))
print(f"{sys.argv[2]}: {passes} passed, {len(fails)} failed")
' "$work/$1.fail" "$1"
}
suite postgres "$node"
suite lattice "$proxied"
echo "failing only through Lattice:"
comm -13 "$work/postgres.fail" "$work/lattice.fail" | grep -v '^$' | sed 's/^/  /' || true
cp "$work"/*.fail "$work"/*.fail.log "${PGX_SUITE_OUT:-/tmp}/" 2>/dev/null || true
