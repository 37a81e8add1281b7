# Lattice. `make test` and `make demo` install the system packages they need
# (PostgreSQL 15 server and redis-server, via scripts/ensure-tools.sh) when run
# as root; otherwise they print the exact apt-get command to run.
# Note: the first build compiles pg_query_go with cgo, which takes over a minute.

GO ?= go

.PHONY: all build tools demo test vet bench clean

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

# The published benchmark suite; writes bench/results.md. BENCH_SECONDS and
# the other settings at the top of bench/suite.sh make it shorter or longer.
bench: tools
	bash bench/suite.sh

clean:
	rm -rf bin
