# holdfast: `make test` is the one command that runs the whole suite on a
# fresh machine (it builds the Consul server once, then caches it).
export GOTOOLCHAIN := local
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
# The modules of go.work: the library with the light embedtest (.), the
# command with its benchmark, safety suite and plot generator (cmd/holdfast),
# the embedded etcd and the throwaway PostgreSQL for tests
# (embedtest/etcdtest, embedtest/pgtest), the runnable examples (examples)
# and the tests against those servers (tests). vet, staticcheck and the tests
# cover them all.
MODULES := . cmd/holdfast embedtest/etcdtest embedtest/pgtest examples tests
PKGS := ./... $(foreach m,$(filter-out .,$(MODULES)),./$(m)/...)
# The slowest packages first: go test runs the packages in the order given
# (two at a time on 2 cores), so that none of them starts last, alone.
SLOWPKGS := ./cmd/holdfast/ ./tests/etcd/ ./consul/ ./cmd/holdfast/internal/safety/ ./conformance/ ./cmd/holdfast/internal/bench/ ./tests/shard/ ./tests/semaphore/ ./embedtest/etcdtest/ ./tests/leader/
# tests/etcd uses etcd's test hooks (etcd/export_testhooks.go) and refuses to
# run without this tag; nothing else depends on it.
TESTTAGS := holdfast_testhooks

.PHONY: test consul lint tidy demo bench bench-docs bench-plots mutants conformance-full fuzz faults once-soak codestats

test: consul
	./scripts/modgraph.sh
	$(GO) vet -tags $(TESTTAGS) $(PKGS)
	$(GO) test -race -count=1 -tags $(TESTTAGS) -timeout 25m $(SLOWPKGS) $(PKGS)
	$(GO) test -p 1 -count=1 -tags $(TESTTAGS) -run 'TestMemoryPerGrant|TestSemaphoreRPCsFlat256|TestManyLocksMemory|TestWaitersCostFlat512' ./tests/etcd/ ./consul/ ./cmd/holdfast/internal/bench/   # memory figures and 256 contenders, without -race's slowness, one package at a time (cost ratios drift when packages load the machine beside them)

# Build (first run: about 4 minutes) or locate the cached Consul server.
consul:
	@./scripts/consul.sh >/dev/null

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	./scripts/tidy.sh -diff
	$(GO) vet $(PKGS)
	$(GO) vet -tags $(TESTTAGS) $(PKGS)
	@set -e; for m in $(MODULES); do echo "staticcheck: $$m"; (cd $$m && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags $(TESTTAGS) ./...); done

demo:
	$(GO) run ./cmd/holdfast demo

# Every scenario on both stores, holdfast vs native vs floor (see
# cmd/holdfast/internal/bench/doc.go); BENCH_FLAGS=--quick for the smoke run (under 2 minutes).
BENCH_FLAGS ?=
bench: consul
	$(GO) run ./cmd/holdfast bench --backend etcd --scenario all $(BENCH_FLAGS)
	$(GO) run ./cmd/holdfast bench --backend consul --scenario all $(BENCH_FLAGS)

# docs/BENCHMARKS.md: run every benchmark scenario on both stores (embedded
# etcd, Consul dev agent), one JSON line per row into docs/bench/<store>.jsonl,
# then `make bench-plots`. About 8.5 minutes at the default 3 s window on a
# 2-core machine (7.4 measured with BENCH_DURATION=1s) (docs/BENCHMARKS.md, "Reproducing"); BENCH_DURATION=1s for a
# reduced run, and then say so with BENCH_LABEL.
BENCH_DURATION ?= 3s
BENCH_SCENARIOS ?= all
BENCH_LABEL ?=
bench-docs: consul
	@mkdir -p docs/bench
	@set -e; for b in etcd consul; do \
		rm -f docs/bench/$$b.jsonl.tmp; \
		for s in $(BENCH_SCENARIOS); do \
			echo "bench-docs: $$b $$s" >&2; \
			$(GO) run ./cmd/holdfast bench --backend $$b --scenario $$s --duration $(BENCH_DURATION) $(BENCH_FLAGS) --json >> docs/bench/$$b.jsonl.tmp; \
		done; \
		mv docs/bench/$$b.jsonl.tmp docs/bench/$$b.jsonl; \
	done
	@echo "bench-docs: etcd, 3 members, lock" >&2
	$(GO) run ./cmd/holdfast bench --backend etcd --nodes 3 --scenario lock --duration $(BENCH_DURATION) $(BENCH_FLAGS) --json > docs/bench/etcd-3-members.jsonl.tmp
	mv docs/bench/etcd-3-members.jsonl.tmp docs/bench/etcd-3-members.jsonl
	$(MAKE) bench-plots

# Regenerate the plots (docs/bench/*.png) and the tables of docs/BENCHMARKS.md
# from the JSON lines already in docs/bench/, without running anything.
bench-plots:
	$(GO) run ./cmd/holdfast/internal/cmd/benchdocs -out docs/bench -doc docs/BENCHMARKS.md -label "$(BENCH_LABEL)" docs/bench/*.jsonl

# Issue 27's readability figures (lines, long and nested functions, exported
# names, long doc comments, hand-rolled retry loops) of the root package,
# etcd, consul and internal/core, as one table; what each figure counts is
# in cmd/holdfast/internal/cmd/codestats/main.go. CODESTATS_FLAGS=-names
# lists the exported names too.
CODESTATS_FLAGS ?=
codestats:
	$(GO) run ./cmd/holdfast/internal/cmd/codestats $(CODESTATS_FLAGS) . etcd consul internal/core

# Remove each safety guard in turn (docs/GUARDS.md) and check that the tests
# meant to catch its absence fail: 45 rows, 2 at a time, in 2m17 on this
# 2-core machine (shared, build cache warm); .ci/run runs it after `make test`.
mutants: consul
	./scripts/mutants.sh

# holdfast once under freezes: 4 processes per 2 s period for 60 s on etcd
# 3.4 (--at-least 1s, then without) and Consul (without), the store's
# process stopped 3 s every 15 s (about 5 minutes; the tests run for 10 s
# in `make test`).
once-soak: consul
	HOLDFAST_ONCE_SOAK=60s $(GO) test -count=1 -v -run 'TestOnceFrozen' ./cmd/holdfast/
	HOLDFAST_ONCE_SOAK=60s HOLDFAST_ONCE_AT_LEAST=0s $(GO) test -count=1 -v -run 'TestOnceFrozenEtcd' ./cmd/holdfast/

# The conformance suite against each of the fake's broken stores: every
# property of the bug's families, where `make test` runs only the properties
# meant to catch it (measured on 2 cores, without -race: 313 s against 109 s);
# and the whole suite on etcd's 3-member cluster, where `make test` leaves
# out the claim properties (they run on one member).
conformance-full:
	$(GO) test -count=1 -run '^TestSuiteCatchesBrokenFakes$$' ./conformance/ -args -conformance.full
	$(GO) test -count=1 -tags $(TESTTAGS) -run '^TestConformanceThreeNodes$$' ./tests/etcd/ -args -conformance.full

# The request-fault tables: every kind of request each algorithm sends x
# the three fault modes (refused, answer lost, late) x the primitives, each
# case a short scenario checking exclusion, liveness and leftovers; `make
# test` runs a subset of each. etcd (tests/etcd/faulttable_test.go): 107
# cases with the claim's, about 95 s on 2 cores. Consul (consul/faults_test.go):
# the Mutex, RWMutex, Semaphore, Election, MultiMutex and the claim (`make
# test` runs the Mutex's only), 279 cases, about 1 minute.
faults: consul
	$(GO) test -count=1 -tags $(TESTTAGS) -run '^TestEtcdFaultTable$$' ./tests/etcd/ -args -faults.full
	HOLDFAST_FAULTS=all $(GO) test -count=1 -run '^TestRequestFaults$$' -v ./consul/

# Fuzz the decoders of the Consul semaphore's and read-write lock's lock key
# (consul/permits_fuzz_test.go), FUZZTIME each (default 1m). The seed corpus
# runs with every plain `go test` too.
FUZZTIME ?= 1m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzSemaphoreLock$$' -fuzztime $(FUZZTIME) ./consul/
	$(GO) test -run '^$$' -fuzz '^FuzzRWLock$$' -fuzztime $(FUZZTIME) ./consul/

# go mod tidy in every module, keeping the library's go.mod free of what
# the servers, the command, the examples and the tests need (scripts/tidy.sh).
tidy:
	./scripts/tidy.sh
