# Lattice. `make test` and `make demo` install the system packages they need
# (PostgreSQL 15 server and redis-server, via scripts/ensure-tools.sh) when run
# as root; otherwise they print the exact apt-get command to run.
# Note: the first build compiles pg_query_go with cgo, which takes over a minute.

GO ?= go

.PHONY: all build tools demo test vet fuzz hunt bench tpcc clean

all: build

build:
	$(GO) build -o bin/lattice ./cmd/lattice

tools:
	@bash scripts/ensure-tools.sh

demo: tools build
	bin/lattice demo

vet:
	$(GO) vet ./...

# scripts/test.sh: go vet, every package with -race, then the fuzz targets,
# beside the integration package in three parts at once (each with its own
# servers). As root it installs the network partition tests' tools too.
test:
	@bash scripts/ensure-tools.sh test
	GO="$(GO)" bash scripts/test.sh

# Each fuzz target for a fixed number of executions (pkg:Target:count).
# Counts, not durations: with go1.26 a duration budget can end a fuzzer with
# "context deadline exceeded" and no failing input (golang/go#75804), so a
# failure here always means an input. In `make test` the targets run beside
# the integration tests, and on 2 cores they took 330 to 450 s in all at
# twice these counts (three CI runs of 12-06: 89 to 104 s gathering the
# corpus's baseline coverage, the rest executing), CPU taken from the
# integration tests and enough to push the run past 25 minutes; these
# counts halve the executing. FuzzPlan and FuzzRoute, the slowest per
# execution, are halved once more (at 40000 and 32000 they took 75 s and
# 106 s of the 234 s all took in a run of 12-06), to make room for the
# network partition tests, which need 170 CPU-seconds. FUZZX scales every count (FUZZX=10
# for a longer hunt). Without -race: the race detector slows the fuzzers
# down several times, and the plain tests above already run every target's
# corpus (testdata/fuzz) with -race. A failing input is written to the
# package's testdata/fuzz/<target>/ and fails the run.
FUZZX ?= 1
FUZZ_TARGETS = ./router:FuzzPlan:20000 ./router:FuzzRoute:16000 ./router:FuzzLexer:50000 \
	./proxy:FuzzHandshake:35000 ./proxy:FuzzSession:37000 ./proxy:FuzzCopySplit:17000 ./proxy:FuzzCopyParse:30000 \
	./shardmap:FuzzMapJSON:30000

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$$(( $${rest##*:} * $(FUZZX) )); \
		echo "fuzz $$pkg $$name for $${n} executions"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $${n}x $$pkg; \
	done

# The generated differential tests over other seeds than make test's
# (scripts/hunt.sh): make hunt SEEDS="101 102 103", or 20 seeds from 1000.
hunt: tools
	GO="$(GO)" bash scripts/hunt.sh $(SEEDS)

# The published benchmark suite; writes bench/results.md. BENCH_SECONDS and
# the other settings at the top of bench/suite.sh make it shorter or longer.
bench: tools
	bash bench/suite.sh

# TPC-C (go-tpc v1.0.7's kit) on plain PostgreSQL and through Lattice, tpmC
# side by side; TPCC_TIME, TPCC_THREADS and TPCC_WAREHOUSES at the top of
# bench/tpcc.sh set its length and size.
tpcc: tools
	bash bench/tpcc.sh

clean:
	rm -rf bin
