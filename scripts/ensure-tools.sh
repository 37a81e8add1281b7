#!/usr/bin/env bash
# Makes sure the system packages that `make demo` and `make test` need are
# installed: the PostgreSQL 15 server (Debian postgresql-15), redis-server, and
# a C compiler for cgo (pg_query_go and the race detector). As root it installs
# what is missing with apt-get; otherwise it prints the exact command and fails.
set -euo pipefail

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
if ! command -v go >/dev/null 2>&1; then
	echo "ensure-tools: go is not on PATH; install Go 1.26 or newer (https://go.dev/doc/install)" >&2
	exit 1
fi

if [[ ${#missing_pkgs[@]} -eq 0 ]]; then
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
echo "ensure-tools: done" >&2
