# Composer: the two commands are `make dev` and `make test`.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
BUF := .tools/node_modules/.bin/buf

.PHONY: help setup build dashboard dev test verify lint fmt clippy buf-lint buf-breaking generate generate-check purity module-cycles bench bench-quick

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: ## install what is missing (Postgres, Redis, buf, plugins, grpcurl)
	@scripts/setup.sh

build: setup dashboard ## build the dashboard (when npm is here) and the composer binary
	cargo build -p composer-cli

dashboard: ## build the browser dashboard into dashboard/dist (needs npm; skipped without it)
	@if [[ ! -f dashboard/package.json ]]; then \
	  echo "dashboard: no dashboard/package.json yet, skipped (the server serves a page saying so)"; \
	elif ! command -v npm >/dev/null; then \
	  echo "dashboard: npm not found, skipped (the server serves a page saying how to build it)"; \
	else (cd sdks/typescript && npm ci --no-audit --no-fund && npx tsc -p tsconfig.json) && \
	  cd dashboard && npm ci --no-audit --no-fund && npm run build; fi

dev: build ## run Composer: private Postgres + Redis, the server, the example worker; Ctrl-C stops all
	scripts/dev.sh $(ARGS)

test: setup ## every test in every language (what CI runs), in lanes side by side; prints each stage's time
	scripts/test.sh

lint: setup fmt clippy buf-lint buf-breaking generate-check purity module-cycles ## every check that is not a test

verify: lint test ## fmt, clippy, buf lint + breaking, generated code, all tests

fmt: ## check formatting
	cargo fmt --all --check

clippy: ## clippy, warnings denied
	cargo clippy --workspace --all-targets -- -D warnings

buf-lint: ## lint the API
	$(BUF) lint

buf-breaking: ## refuse breaking API changes against main
	@if git rev-parse --verify -q main >/dev/null; then \
	  $(BUF) breaking --against '.git#branch=main'; \
	else echo "buf-breaking: no main branch here, nothing to compare"; fi

generate: ## regenerate the SDKs' code from api/
	scripts/generate.sh

generate-check: ## fail when generated code differs from what is committed
	scripts/generate-check.sh

purity: ## the engine crate imports no I/O crate
	scripts/check-engine-purity.sh

module-cycles: ## no two modules of a Rust crate import each other in a circle
	scripts/check-module-cycles.sh

bench: setup ## server benchmarks, about 55 min: table written to bench/results/
	bench/run.sh full

bench-quick: setup ## server benchmarks, about 6 min (CI; reports, never fails on a time)
	bench/run.sh quick
