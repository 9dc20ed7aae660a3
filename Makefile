# holdfast: `make test` is the one command that runs the whole suite on a
# fresh machine (it builds the Consul server once, then caches it).
export GOTOOLCHAIN := local
GO ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: test consul lint demo bench mutants fuzz

test: consul
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...
	$(GO) test -count=1 -run 'TestMemoryPerGrant|TestSemaphoreRPCsFlat256|TestWaitersCostFlat512' ./etcd/ ./consul/   # memory figures and 256 contenders, without -race's slowness

# Build (first run: about 4 minutes) or locate the cached Consul server.
consul:
	@./scripts/consul.sh >/dev/null

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

demo:
	$(GO) run ./cmd/holdfast demo

bench:
	$(GO) run ./cmd/holdfast bench --backend etcd --scenario all

# Remove each safety guard in turn (docs/GUARDS.md) and check that the tests
# meant to catch its absence fail. About 3 minutes; .ci/run runs it after `make test`.
mutants: consul
	./scripts/mutants.sh

# Fuzz the decoders of the Consul semaphore's and read-write lock's lock key
# (consul/permits_fuzz_test.go), FUZZTIME each (default 1m). The seed corpus
# runs with every plain `go test` too.
FUZZTIME ?= 1m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzSemaphoreLock$$' -fuzztime $(FUZZTIME) ./consul/
	$(GO) test -run '^$$' -fuzz '^FuzzRWLock$$' -fuzztime $(FUZZTIME) ./consul/
