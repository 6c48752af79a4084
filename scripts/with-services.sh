#!/usr/bin/env bash
# Runs a command with a private Postgres and Redis (started by
# `composer dev --no-server` in a temporary folder, on free loopback ports),
# exported as COMPOSER_TEST_DATABASE_URL and COMPOSER_TEST_REDIS_URL, and a
# folder for the test servers' blobs (COMPOSER_TEST_BLOB_ROOT). Both stop,
# and the folders go, when the command ends.
#
#   scripts/with-services.sh cargo test --workspace
#
# With COMPOSER_BIN set, that binary is used as it is (no cargo build): a
# test run of one SDK then never waits on, or races, a Rust build.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n ${COMPOSER_BIN:-} ]]; then
  composer=$COMPOSER_BIN
else
  cargo build --quiet -p composer-cli
  composer=target/debug/composer
fi
env_file=$(mktemp)
# the test servers' blobs: a folder of this run's, gone when it ends
blob_root=$(mktemp -d -t composer-test-blobs.XXXXXX)
"$composer" dev --no-server --env-file "$env_file" >/dev/null &
dev_pid=$!
stop() {
  kill -TERM "$dev_pid" 2>/dev/null || true
  wait "$dev_pid" 2>/dev/null || true
  rm -f "$env_file"
  rm -rf "$blob_root"
}
trap stop EXIT

for _ in $(seq 1 600); do
  [ -s "$env_file" ] && break
  kill -0 "$dev_pid" 2>/dev/null || { echo "with-services: composer dev exited early" >&2; exit 1; }
  sleep 0.1
done
[ -s "$env_file" ] || { echo "with-services: Postgres and Redis did not start within 60 s" >&2; exit 1; }

# shellcheck disable=SC1090
source "$env_file"
export COMPOSER_TEST_DATABASE_URL="${COMPOSER_DATABASE_URL%/*}/postgres"
export COMPOSER_TEST_REDIS_URL="$COMPOSER_REDIS_URL"
export COMPOSER_TEST_BLOB_ROOT="$blob_root"
unset COMPOSER_DATABASE_URL COMPOSER_REDIS_URL
"$@"
