#!/usr/bin/env bash
# The TypeScript SDK's tests: unit (no services), conformance against the real server (C1-C19),
# the browser entry point in headless Chromium over grpc-web, the JavaScript code runner, and
# `npm pack` into a fresh folder. Installs what is missing (npm ci; chromium via apt when root),
# builds, runs everything under scripts/with-services.sh (Postgres + Redis), and ends with node's
# test runner summary; exits non-zero on any failure.
#
#   scripts/test-ts-sdk.sh                      # COMPOSER_BIN=... to use a built server binary
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
sdk=$repo/sdks/typescript

if [[ ! -d $sdk/node_modules ]] || [[ $sdk/package-lock.json -nt $sdk/node_modules/.package-lock.json ]]; then
  (cd "$sdk" && npm ci --no-audit --no-fund)
fi
if [[ ! -x ${CHROMIUM_PATH:-/usr/bin/chromium} ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y chromium >/dev/null || { apt-get update >/dev/null && apt-get install -y chromium >/dev/null; }
  else
    echo "test-ts-sdk: ${CHROMIUM_PATH:-/usr/bin/chromium} is missing and this is not root: apt-get install -y chromium" >&2
    exit 1
  fi
fi
if ! command -v psql >/dev/null; then
  echo "test-ts-sdk: psql is needed to create the test database (apt-get install -y postgresql-client)" >&2
  exit 1
fi

(cd "$sdk" && rm -rf dist dist-test && npx tsc -p tsconfig.json && npx tsc -p tsconfig.test.json)

# COMPOSER_BIN, when set, is the server binary (else with-services.sh builds target/debug/composer).
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# Integration and browser files each start their own server; two files run at once.
scripts/with-services.sh bash -c "cd '$sdk' && node --test --test-concurrency=2 --test-reporter=spec \
  dist-test/test/unit/ dist-test/test/integration/ dist-test/test/browser/ dist-test/test/pack/"
