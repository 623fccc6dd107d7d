# Quick start: `make demo` runs the whole system once; `make test` runs every test.
# Both install what they need (Mosquitto and its clients, Chromium and PostgreSQL from Debian's packages) first.

GO        ?= go
MOSQUITTO ?= /usr/sbin/mosquitto
PGBIN     := /usr/lib/postgresql/15/bin
BIN       := bin

.PHONY: all deps build test fuzz vet bench bench-postgres gobench demo scenarios scenarios-postgres soak clean

all: build

# Mosquitto from Debian's packages when it is missing (needs root, as on CI).
deps:
	@if [ ! -x $(MOSQUITTO) ]; then \
		echo "installing mosquitto (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto >/dev/null; \
	fi
	@$(MOSQUITTO) -h 2>/dev/null | head -1 | grep -q 'mosquitto version 2' || { echo "need Mosquitto 2.x at $(MOSQUITTO)"; exit 1; }
	@# Debian's mosquitto_pub and mosquitto_sub: the security tests play the intruder with them.
	@if [ ! -x /usr/bin/mosquitto_pub ] || [ ! -x /usr/bin/mosquitto_sub ]; then \
		echo "installing mosquitto-clients (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto-clients >/dev/null; \
	fi
	@# Headless Chromium renders the HTML report and drives the dashboard in their tests.
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "installing chromium (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; \
	fi
	@# PostgreSQL 15 (Debian 12's postgresql): the tests start throwaway clusters
	@# of their own with its initdb and pg_ctl (internal/testenv); the cluster
	@# the package may create and start on port 5432 is not used.
	@if [ ! -x $(PGBIN)/initdb ]; then \
		echo "installing postgresql (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; \
	fi
	@[ -x $(PGBIN)/initdb ] || { echo "need PostgreSQL 15 at $(PGBIN) (Debian 12's postgresql package)"; exit 1; }

build:
	$(GO) build -o $(BIN)/controller ./cmd/controller
	$(GO) build -o $(BIN)/devicesim ./cmd/devicesim

vet:
	@unformatted=$$(gofmt -l cmd internal); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

# .ci/gotest runs go test with a line per package, failures in full and a
# line on what is still running at least every 30 s, inside a scratch
# directory under $$TMPDIR that is removed afterwards, also on Ctrl-C or
# SIGTERM. exec: a SIGTERM that make passes on reaches the script itself.
# Then .ci/fuzz runs every fuzz target (go test -fuzz, one at a time) for
# about 2 minutes in all, failing on any failing input (FUZZ_BUDGET seconds,
# or FUZZTIME per target).
export GO
test: deps vet
	exec .ci/gotest -count=1 -timeout 25m ./...
	exec .ci/fuzz

# The fuzz targets alone: `make fuzz`, `FUZZTIME=60s make fuzz`.
fuzz:
	exec .ci/fuzz

# The controller beside the pass-through (the same job with no database, in
# bin/bench itself), in one run on one broker and devicesim's devices, then
# every action serial (internal/bench): a table, bench/out/latest.json and
# bench/out/latest.html.
# BENCH_DEVICES (100), BENCH_SECONDS (10, each measured phase), BENCH_DB (an
# SQLite file or a postgres:// URL; default a temporary file),
# BENCH_INSTANCES (1; more controller instances need PostgreSQL).
bench: deps build
	$(GO) build -o $(BIN)/bench ./cmd/bench
	$(BIN)/bench --bin $(BIN) --out bench/out --doc docs/bench-latest.md

# The same on PostgreSQL: a throwaway cluster (scripts/throwaway-postgres, in
# a temporary directory, stopped and removed at the end, also on failure or
# Ctrl-C), a fresh database per run, one controller instance and then
# BENCH_PG_INSTANCES (3) sharing it: bench/out/postgres-1.json and
# postgres-3.json (and .html), latest.* being the last run's.
BENCH_PG_INSTANCES ?= 3
bench-postgres: deps build
	$(GO) build -o $(BIN)/bench ./cmd/bench
	@set -e; \
	dir=$$(mktemp -d "$${TMPDIR:-/tmp}/fleetctl-bench-pg.XXXXXX"); \
	trap 'scripts/throwaway-postgres stop "$$dir"' EXIT; \
	trap 'exit 130' INT TERM; \
	url=$$(scripts/throwaway-postgres start "$$dir"); \
	for n in 1 $(BENCH_PG_INSTANCES); do \
		db=bench_$$n; \
		psql "$$url" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $$db"; \
		echo "bench-postgres: $$n instance(s) on database $$db"; \
		BENCH_INSTANCES=$$n BENCH_NAME=postgres-$$n BENCH_DOC=docs/bench-latest-postgres-$$n.md BENCH_DB="$$(echo "$$url" | sed "s#/postgres?#/$$db?#")" \
			$(BIN)/bench --bin $(BIN) --out bench/out; \
	done

# The Go benchmarks (one operation at a time, and eight callers, end to end).
gobench: deps
	exec .ci/gotest -run '^$$' -bench . -benchtime 200x -count 1 ./internal/e2e/ ./internal/failpoint/ ./internal/store/

# Every failure-window scenario with its invariant verdicts (the soak: 2 min on CI, 30 min otherwise).
scenarios: deps
	scenarios/run all

# The same scenarios with every controller on PostgreSQL (a throwaway cluster).
scenarios-postgres: deps
	SCENARIO_DB=postgres scenarios/run all

soak: deps
	SOAK_DURATION=$${SOAK_DURATION:-30m} scenarios/run 17-soak

# Built and run, not go run: go run passes no SIGTERM on (make sends one to
# its child when it gets one), and the demo stops its processes and
# removes its files on SIGINT, SIGTERM and SIGHUP.
demo: deps build
	$(GO) build -o $(BIN)/demo ./cmd/demo
	$(BIN)/demo --bin $(BIN)

clean:
	rm -rf $(BIN)
