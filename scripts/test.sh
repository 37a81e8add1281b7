#!/usr/bin/env bash
# go vet, then every test with the race detector, and the fuzz targets. The
# integration package runs as LATTICE_TEST_PARTS (3) test processes at once,
# each with its own PostgreSQL nodes, redis-server and partition network
# (LATTICE_NETNS_ID). On 2 cores the run is bound by CPU (1.85 of the 2
# cores over a whole run), so more parts would not end it sooner; balance is
# what matters: the parts are balanced by each test's time in
# integration/testdata/durations.txt (a test missing there counts as 10 s).
# The other packages, then `make fuzz`, run beside them.
# A part's output is printed when it ends (a passing part's as a summary);
# the script fails if any part failed. LATTICE_TEST_DURATIONS=FILE writes
# every integration test's time in this run there, the format of
# durations.txt, which a run on a quiet machine should refresh now and then.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
TIMEOUT=${TEST_TIMEOUT:-45m}
PARTS=${LATTICE_TEST_PARTS:-3}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if ! $GO test -race -c -o "$out/integration.test" ./integration; then
	echo "scripts/test.sh: building the integration tests failed" >&2
	exit 1
fi
# The proxy the parts start, built once rather than linked by each part:
# with the race detector for the tests that serve concurrent work, without
# it for the rest (integration/binary_test.go says which and why).
if ! $GO build -race -o "$out/lattice-race" ./cmd/lattice; then
	echo "scripts/test.sh: building lattice with -race failed" >&2
	exit 1
fi
if ! $GO build -o "$out/lattice" ./cmd/lattice; then
	echo "scripts/test.sh: building lattice failed" >&2
	exit 1
fi
# vet with -race reads the export data the race builds above left in the
# build cache. A plain go vet would compile every package once more without
# -race: on a cold cache 138 CPU-s, against 15 s for this one.
if ! $GO vet -race ./...; then
	echo "scripts/test.sh: go vet failed" >&2
	exit 1
fi
# Balance the parts by the tests' recorded times: the longest first, each
# to the part with the least so far.
mapfile -t tests < <(grep -ho '^func Test[A-Za-z0-9_]*(t \*testing.T)' integration/*_test.go | sed 's/^func \(Test[A-Za-z0-9_]*\).*/\1/')
mapfile -t part < <(
	for t in "${tests[@]}"; do
		d=$(awk -v t="$t" '$1 == t { print $2; exit }' integration/testdata/durations.txt 2>/dev/null)
		echo "${d:-10} $t"
	done | sort -rn | awk -v n="$PARTS" '
		{ h = 0; for (i = 1; i < n; i++) if (load[i] < load[h]) h = i
		  load[h] += $1; list[h] = list[h] (list[h] == "" ? "" : "|") $2 }
		END { for (i = 0; i < n; i++) print list[i] }'
)

pids=()
names=()
run() { # name, command...
	local name=$1
	shift
	("$@" >"$out/$name.log" 2>&1; echo $? >"$out/$name.rc") &
	pids+=($!)
	names+=("$name")
}
units() {
	local rc=0
	$GO test -race -count=1 -timeout "$TIMEOUT" $($GO list ./... | grep -v '/integration$') || rc=1
	make -s --no-print-directory fuzz GO="$GO" || rc=1
	return $rc
}
run packages units
for h in "${!part[@]}"; do
	run "integration-$((h + 1))" env LATTICE_NETNS_ID=$((h + 1)) LATTICE_TEST_BINARY="$out/lattice" LATTICE_TEST_RACE_BINARY="$out/lattice-race" bash -c \
		'cd integration && exec "$0" -test.v -test.run "^($1)\$" -test.timeout "$2"' "$out/integration.test" "${part[h]}" "$TIMEOUT"
done

failed=0
for i in "${!pids[@]}"; do
	wait "${pids[i]}"
	rc=$(cat "$out/${names[i]}.rc")
	echo "=== ${names[i]}: exit $rc"
	log=$out/${names[i]}.log
	if [[ "${names[i]}" == integration-* && "$rc" == 0 ]]; then
		# A passing part's verbose log is long: its summary and slowest tests.
		echo "$(grep -c '^--- PASS' "$log") tests passed; the slowest:"
		grep '^--- PASS' "$log" | sed 's/^--- PASS: \(.*\) (\(.*\)s)$/\2 \1/' | sort -rn | head -5
		tail -n 3 "$log"
	else
		cat "$log"
	fi
	if [[ "$rc" != 0 ]]; then
		failed=1
	fi
done
if [[ -n "${LATTICE_TEST_DURATIONS:-}" ]]; then
	cat "$out"/integration-*.log | sed -n 's/^--- [A-Z]*: \(Test[A-Za-z0-9_]*\) (\([0-9.]*\)s)$/\1 \2/p' | sort >"$LATTICE_TEST_DURATIONS"
fi
if [[ $failed != 0 ]]; then
	echo "scripts/test.sh: some tests failed" >&2
fi
exit $failed
