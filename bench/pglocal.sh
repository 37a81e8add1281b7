# Sourced by the bench and suite scripts that run their own PostgreSQL
# servers and a lattice binary. Needs $work (a fresh temp dir) and $pgbin.

# lattice_bin prints the absolute path of the lattice binary to use: $1, or
# bin/lattice built from this checkout.
lattice_bin() {
  local bin=${1:-}
  if [ -z "$bin" ]; then go build -o bin/lattice ./cmd/lattice; bin=bin/lattice; fi
  readlink -f "$bin"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# as_pg runs a command as the postgres user when this script runs as root:
# PostgreSQL refuses to run as root.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# start_pg NAME PORT [MAX_CONNECTIONS] initdb's $work/NAME (trust, superuser
# lattice) and starts it on 127.0.0.1:PORT with logical WAL and prepared
# transactions, fsync off.
start_pg() {
  mkdir "$work/$1"; [ "$(id -u)" = 0 ] && chown postgres "$work/$1"
  as_pg "$pgbin/initdb" -D "$work/$1" -U lattice -A trust >/dev/null
  cat >>"$work/$1/postgresql.conf" <<CONF
port = $2
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = ${3:-200}
wal_level = logical
max_prepared_transactions = 100
fsync = off
CONF
  as_pg "$pgbin/pg_ctl" -D "$work/$1" -l "$work/$1/log" -w start >/dev/null
}

# stop_pg NAME... stops the servers start_pg started, ignoring those that
# are not running.
stop_pg() {
  local n
  for n in "$@"; do as_pg "$pgbin/pg_ctl" -D "$work/$n" -m fast stop >/dev/null 2>&1 || true; done
}
