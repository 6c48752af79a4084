#!/usr/bin/env bash
# The dashboard's end-to-end tests: Playwright drives Debian's chromium against the real
# `composer serve` (each test file starts its own on a free port, with its own database, serving
# the freshly built dashboard/dist). Installs what is missing (the TypeScript SDK's build, npm ci,
# chromium via apt when root), builds the dashboard, runs the tests under scripts/with-services.sh
# (Postgres + Redis), and ends with Playwright's summary and the line `dashboard: N passed, N failed`;
# exits non-zero on any failure.
#
#   scripts/test-dashboard.sh                  # COMPOSER_BIN=... to use a built server binary
#   scripts/test-dashboard.sh tests/roles-and-namespaces.spec.ts   # arguments go to playwright
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
sdk=$repo/sdks/typescript
dashboard=$repo/dashboard
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

if [[ ! -x ${CHROMIUM_PATH:-/usr/bin/chromium} ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y chromium >/dev/null || { apt-get update >/dev/null && apt-get install -y chromium >/dev/null; }
  else
    echo "test-dashboard: ${CHROMIUM_PATH:-/usr/bin/chromium} is missing and this is not root: apt-get install -y chromium" >&2
    exit 1
  fi
fi
if ! command -v psql >/dev/null; then
  echo "test-dashboard: psql is needed to create the test databases (apt-get install -y postgresql-client)" >&2
  exit 1
fi

# The dashboard depends on the SDK by path (file:../sdks/typescript) and uses its built dist/.
if [[ ! -d $sdk/node_modules ]] || [[ $sdk/package-lock.json -nt $sdk/node_modules/.package-lock.json ]]; then
  (cd "$sdk" && npm ci --no-audit --no-fund)
fi
if [[ ! -f $sdk/dist/web.js ]] || [[ -n $(find "$sdk/src" -newer "$sdk/dist/web.js" -name '*.ts' -print -quit) ]]; then
  (cd "$sdk" && npx tsc -p tsconfig.json)
fi
if [[ ! -d $dashboard/node_modules ]] || [[ $dashboard/package-lock.json -nt $dashboard/node_modules/.package-lock.json ]]; then
  (cd "$dashboard" && npm ci --no-audit --no-fund)
fi
(cd "$dashboard" && npm run build --silent)

# COMPOSER_BIN, when set, is the server binary (else with-services.sh builds target/debug/composer,
# which tests/harness.ts then uses).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
scripts/with-services.sh bash -c 'cd dashboard && npx playwright test "$@"' playwright-tests "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Playwright's summary is split over lines and the services' shutdown logs follow it: end with one
# plain line of the counts.
passed=$(sed -nE 's/^ +([0-9]+) passed.*/\1/p' "$log" | tail -1)
failed=$(sed -nE 's/^ +([0-9]+) failed.*/\1/p' "$log" | tail -1)
flaky=$(sed -nE 's/^ +([0-9]+) flaky.*/\1/p' "$log" | tail -1)
if [[ -n $passed || -n $failed ]]; then
  echo "dashboard: ${passed:-0} passed, ${failed:-0} failed${flaky:+, $flaky flaky (passed on their retry)}"
fi
exit "$status"
