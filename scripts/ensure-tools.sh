#!/usr/bin/env bash
# Makes sure the system packages that `make demo` and `make test` need are
# installed: the PostgreSQL 15 server (Debian postgresql-15), redis-server, a C
# compiler for cgo (pg_query_go and the race detector), and the clients of the
# driver tests (integration/drivers_test.go): psycopg 3 and psycopg2 for
# /usr/bin/python3, pgjdbc, and node-postgres (npm pg, pinned) under
# integration/testdata/drivers/node, and Chromium for the admin page's test
# (integration/admin_test.go, driven headless over the DevTools protocol). As root it installs what is missing with
# apt-get; otherwise it prints the exact command and fails. Quick when
# everything is there: it only looks at files.
#   scripts/ensure-tools.sh [test]
# With "test" (make test), as root, also ip, tc and iptables (iproute2,
# iptables): the network partition tests (integration/netns_test.go) make
# namespaces and drop packets, which needs root, so a run as another user
# skips them and needs neither.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
node_dir="$root/integration/testdata/drivers/node"
# Keep in step with node_dir/package.json and nodePgVersion in drivers_test.go.
node_pg_version=8.16.3

pg_bindir="${LATTICE_PG_BINDIR:-/usr/lib/postgresql/15/bin}"
missing_pkgs=()
missing_what=()

if [[ ! -x "$pg_bindir/postgres" || ! -x "$pg_bindir/initdb" ]]; then
	missing_pkgs+=(postgresql-15)
	missing_what+=("$pg_bindir/postgres")
fi
if ! command -v redis-server >/dev/null 2>&1 && [[ ! -x /usr/bin/redis-server ]]; then
	missing_pkgs+=(redis-server)
	missing_what+=(redis-server)
fi
if ! command -v gcc >/dev/null 2>&1; then
	missing_pkgs+=(gcc libc6-dev)
	missing_what+=(gcc)
fi
if [[ ! -x /usr/bin/python3 ]] || ! /usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1; then
	missing_pkgs+=(python3-psycopg)
	missing_what+=("psycopg 3 for /usr/bin/python3")
fi
if [[ ! -x /usr/bin/python3 ]] || ! /usr/bin/python3 -c 'import psycopg2' >/dev/null 2>&1; then
	missing_pkgs+=(python3-psycopg2)
	missing_what+=("psycopg2 for /usr/bin/python3")
fi
if [[ ! -f /usr/share/java/postgresql.jar ]]; then
	missing_pkgs+=(libpostgresql-jdbc-java)
	missing_what+=(/usr/share/java/postgresql.jar)
fi
if ! command -v java >/dev/null 2>&1; then
	missing_pkgs+=(openjdk-17-jre-headless)
	missing_what+=(java)
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	missing_pkgs+=(nodejs npm)
	missing_what+=("node and npm")
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 && ! command -v google-chrome >/dev/null 2>&1; then
	missing_pkgs+=(chromium)
	missing_what+=(chromium)
fi
if [[ "${1:-}" == test && "$(id -u)" -eq 0 ]]; then
	if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
		missing_pkgs+=(iproute2)
		missing_what+=("ip and tc")
	fi
	if ! command -v iptables >/dev/null 2>&1; then
		missing_pkgs+=(iptables)
		missing_what+=(iptables)
	fi
fi
if ! command -v go >/dev/null 2>&1; then
	echo "ensure-tools: go is not on PATH; install Go 1.26 or newer (https://go.dev/doc/install)" >&2
	exit 1
fi

# node-postgres at the pinned version, installed into the test's directory
# (not system-wide) by whoever runs this; needs only npm and the registry.
ensure_node_pg() {
	local have=""
	if [[ -f "$node_dir/node_modules/pg/package.json" ]]; then
		have="$(node -p "require('$node_dir/node_modules/pg/package.json').version" 2>/dev/null || true)"
	fi
	if [[ "$have" == "$node_pg_version" ]]; then
		return 0
	fi
	echo "ensure-tools: installing node-postgres (npm pg $node_pg_version) into $node_dir" >&2
	npm install --prefix "$node_dir" --no-audit --no-fund >&2
}

if [[ ${#missing_pkgs[@]} -eq 0 ]]; then
	ensure_node_pg
	exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
	echo "ensure-tools: missing ${missing_what[*]}." >&2
	echo "ensure-tools: install with: sudo apt-get update && sudo apt-get install -y ${missing_pkgs[*]}" >&2
	exit 1
fi

echo "ensure-tools: installing ${missing_pkgs[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
# Wait for a concurrent apt/dpkg run instead of failing on its lock.
apt-get -o DPkg::Lock::Timeout=600 update -q
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing_pkgs[@]}"

if [[ ! -x "$pg_bindir/postgres" ]] || ! command -v redis-server >/dev/null 2>&1; then
	echo "ensure-tools: still missing tools after apt-get install ${missing_pkgs[*]}" >&2
	exit 1
fi
ensure_node_pg
echo "ensure-tools: done" >&2
