# phonehome — plain go commands; no Docker needed to build or test.
GO        ?= go
BIN       ?= bin
FUZZTIME  ?= 30s
SCENARIO  ?= steady

.DEFAULT_GOAL := help

# The receiver is built with Prometheus' dedupelabels labels implementation:
# its head series keep their labels as references into a shared symbol table,
# ~300 B less per series than the default (bench/results/README.md). The
# forwarder, which holds a few thousand series for one cycle, is faster with
# the default. The tests run with RECEIVER_TAGS; the e2e tests build the
# receiver with the tests' tags and the forwarder without, as they ship, and
# the forwarder and every package of ours it uses are tested once more
# without.
RECEIVER_TAGS := dedupelabels
FORWARDER_PKGS = $$($(GO) list -deps ./cmd/forwarder | grep '^github.com/phonehome/phonehome/')

.PHONY: all
all: fmt lint test build ## Format, lint, test and build.

.PHONY: build
build: ## Build the receiver and forwarder into ./bin.
	$(GO) build -trimpath -tags=$(RECEIVER_TAGS) -o $(BIN)/ ./cmd/receiver
	$(GO) build -trimpath -o $(BIN)/ ./cmd/forwarder

.PHONY: demo
demo: build ## Run the system on its embedded default: receiver (filesystem bucket) fed by a forwarder.
	./scripts/demo.sh

.PHONY: test
test: ## Run every test, e2e included (needs prometheus, alertmanager, pushgateway, versitygw, thanos: see .ci/run). -count=1: the e2e tests run binaries the test cache cannot see.
	$(GO) test -race -count=1 -timeout 40m -tags=$(RECEIVER_TAGS) ./...
	$(GO) test -race -count=1 $(FORWARDER_PKGS)

.PHONY: test-short
test-short: ## Unit tests only (no e2e).
	$(GO) test -race -short -tags=$(RECEIVER_TAGS) $$($(GO) list ./... | grep -v /e2e)
	$(GO) test -race -short $(FORWARDER_PKGS)

.PHONY: e2e
e2e: ## Only the end-to-end tests.
	$(GO) test -race -count=1 -timeout 30m -tags=$(RECEIVER_TAGS) ./e2e/...

.PHONY: bench
bench: ## Micro-benchmarks, 10 runs each, into bench/latest.txt.
	$(GO) test -run='^$$' -bench=. -benchmem -count=10 ./... | tee bench/latest.txt

BENCH_SIZE   ?= 100k
BENCH_REPEAT ?= 1

.PHONY: bench-fleet
bench-fleet: ## Fleet benchmark vs Prometheus (SCENARIO=steady, BENCH_SIZE=smoke|100k|1m, BENCH_REPEAT=n); writes bench/results.
	$(GO) build -tags=$(RECEIVER_TAGS) -o bench/tmp/receiver ./cmd/receiver
	$(GO) run ./bench/cmd/benchrun --scenario=$(SCENARIO) --size=$(BENCH_SIZE) --repeat=$(BENCH_REPEAT)

.PHONY: bench-fleet-smoke
bench-fleet-smoke: ## Quick check of the fleet benchmark harness (10 clusters × 500 series); records nothing.
	$(GO) build -tags=$(RECEIVER_TAGS) -o bench/tmp/receiver ./cmd/receiver
	$(GO) run ./bench/cmd/benchrun --size=smoke --no-record

.PHONY: bench-fleetstart
bench-fleetstart: ## Catch-up with 500 real forwarders started together, with and without jitter (bench/results/jitter.md); ~3.5 min.
	$(GO) build -tags=$(RECEIVER_TAGS) -o bench/tmp/receiver ./cmd/receiver
	$(GO) run ./bench/cmd/fleetstart --clusters=500 --backlog=27 --interval=270s

.PHONY: bench-fleet-report
bench-fleet-report: ## Regenerate bench/results/README.md from the recorded JSON.
	$(GO) run ./bench/cmd/benchrun --report-only

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each.
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$pkg; \
	  done; \
	done

.PHONY: lint
lint: ## golangci-lint v2 (go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0), without and with RECEIVER_TAGS.
	golangci-lint run ./...
	GOFLAGS=-tags=$(RECEIVER_TAGS) golangci-lint run ./...

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: tidy-check
tidy-check: ## Fail if go.mod/go.sum are not tidy.
	$(GO) mod tidy && git diff --exit-code go.mod go.sum

.PHONY: deploy-check
deploy-check: build ## Validate the example configs with --check-config, and the manifests, kustomizations, images and rules (go test ./deploy/...).
	$(BIN)/receiver --check-config --config.file=deploy/receiver.yaml
	$(GO) test -count=1 ./deploy/...

.PHONY: clean
clean: ## Remove build output and demo data.
	rm -rf $(BIN) data

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
