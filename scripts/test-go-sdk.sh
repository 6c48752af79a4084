#!/usr/bin/env bash
# Tests the Go SDK (sdks/go) and the Go programs built on it (examples/go,
# bench/go_worker): go vet, staticcheck, then `go test -race` of the whole
# SDK module with a private Postgres and Redis (scripts/with-services.sh),
# the conformance tests (TestC01..TestC19) against the real `composer serve`.
#
#   scripts/test-go-sdk.sh                 # builds composer-cli unless COMPOSER_BIN is set
#   COMPOSER_BIN=/path/to/composer scripts/test-go-sdk.sh
#
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATICCHECK_VERSION=v0.8.2   # honnef.co/go/tools, supports Go 1.26
STATICCHECK=$ROOT/.tools/bin/staticcheck

if ! command -v go >/dev/null; then
  echo "test-go-sdk: go is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
if ! command -v psql >/dev/null; then
  echo "test-go-sdk: psql is missing (scripts/setup.sh installs postgresql)" >&2
  exit 1
fi
if [[ ! -x $STATICCHECK ]] || ! "$STATICCHECK" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
  echo "test-go-sdk: installing staticcheck $STATICCHECK_VERSION into .tools/bin"
  GOBIN="$ROOT/.tools/bin" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi

started=$(date +%s)
for module in sdks/go examples/go bench/go_worker; do
  echo "== go vet + staticcheck: $module"
  (cd "$module" && go vet ./... && "$STATICCHECK" ./...)
done
echo "== go build: examples/go, bench/go_worker"
(cd examples/go && go build ./...)
(cd bench/go_worker && go build -o /dev/null .)

echo "== go test -race (sdks/go, against the real server)"
# -p 1: the packages' tests start servers; COMPOSER_REQUIRE_SERVER makes a
# missing server a failure instead of a skip.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
COMPOSER_REQUIRE_SERVER=1 scripts/with-services.sh \
  bash -c 'cd sdks/go && go test -race -count=1 -p 1 -timeout 15m -v ./...' >"$log" 2>&1 || status=$?
grep -E '^(ok|FAIL|---|panic:)|^\s+--- FAIL' "$log" | grep -v -- '--- PASS' || true
passed=$(grep -cE '^\s*--- PASS' "$log" || true)
failed=$(grep -cE '^\s*--- FAIL' "$log" || true)
skipped=$(grep -cE '^\s*--- SKIP' "$log" || true)
if [[ $status -ne 0 || $failed -ne 0 ]]; then
  echo "---- go test output (last 300 lines) ----"
  tail -n 300 "$log"
  echo "test-go-sdk: FAILED: $passed passed, $failed failed, $skipped skipped in $(( $(date +%s) - started )) s" >&2
  exit 1
fi
echo "test-go-sdk: ok: $passed passed, $failed failed, $skipped skipped in $(( $(date +%s) - started )) s"
