#!/usr/bin/env bash
# Every test, with the race detector. The integration package runs as two
# test processes at once, each with its own PostgreSQL nodes, redis-server
# and partition network (LATTICE_NETNS_ID), half of its tests each: its wall
# time is mostly waiting on servers, leases and partitions rather than CPU,
# so two halves finish in a little over half the time. The other packages
# run beside them as one `go test`. Each part's output is printed whole
# when it ends; the script fails if any part failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
TIMEOUT=${TEST_TIMEOUT:-45m}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if ! $GO test -race -c -o "$out/integration.test" ./integration; then
	echo "scripts/test.sh: building the integration tests failed" >&2
	exit 1
fi
# Alternate the tests, in file order, between the halves.
mapfile -t tests < <(grep -ho '^func Test[A-Za-z0-9_]*(t \*testing.T)' integration/*_test.go | sed 's/^func \(Test[A-Za-z0-9_]*\).*/\1/')
half=("" "")
for i in "${!tests[@]}"; do
	h=$((i % 2))
	half[h]+="${half[h]:+|}${tests[i]}"
done

pids=()
names=()
run() { # name, command...
	local name=$1
	shift
	("$@" >"$out/$name.log" 2>&1; echo $? >"$out/$name.rc") &
	pids+=($!)
	names+=("$name")
}
run packages $GO test -race -count=1 -timeout "$TIMEOUT" $($GO list ./... | grep -v '/integration$')
for h in 0 1; do
	run "integration-$((h + 1))" env LATTICE_NETNS_ID=$((h + 1)) bash -c \
		'cd integration && exec "$0" -test.run "^($1)\$" -test.timeout "$2"' "$out/integration.test" "${half[h]}" "$TIMEOUT"
done

failed=0
for i in "${!pids[@]}"; do
	wait "${pids[i]}"
	rc=$(cat "$out/${names[i]}.rc")
	echo "=== ${names[i]}: exit $rc"
	cat "$out/${names[i]}.log"
	if [[ "$rc" != 0 ]]; then
		failed=1
	fi
done
if [[ $failed != 0 ]]; then
	echo "scripts/test.sh: some tests failed" >&2
fi
exit $failed
