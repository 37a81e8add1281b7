# Lattice. `make test` and `make demo` install the system packages they need
# (PostgreSQL 15 server and redis-server, via scripts/ensure-tools.sh) when run
# as root; otherwise they print the exact apt-get command to run.
# Note: the first build compiles pg_query_go with cgo, which takes over a minute.

GO ?= go

.PHONY: all build tools demo test vet fuzz bench clean

all: build

build:
	$(GO) build -o bin/lattice ./cmd/lattice

tools:
	@bash scripts/ensure-tools.sh

demo: tools build
	bin/lattice demo

vet:
	$(GO) vet ./...

test: tools
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...
	$(MAKE) fuzz

# Each fuzz target for FUZZTIME (seven targets: about three minutes
# with the builds). Without -race: the race detector slows the fuzzers down
# several times, and the plain tests above already run every target's
# corpus (testdata/fuzz) with -race. A failing input is written to the
# package's testdata/fuzz/<target>/ and fails the run.
FUZZTIME ?= 20s
FUZZ_TARGETS = ./router:FuzzPlan ./router:FuzzRoute ./router:FuzzLexer ./proxy:FuzzHandshake ./proxy:FuzzSession ./proxy:FuzzCopySplit ./proxy:FuzzCopyParse

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

# The published benchmark suite; writes bench/results.md. BENCH_SECONDS and
# the other settings at the top of bench/suite.sh make it shorter or longer.
bench: tools
	bash bench/suite.sh

clean:
	rm -rf bin
