#!/usr/bin/env bash
# `make test`: every test in every language, in lanes that run side by side
# (decision 0041). Two cores build the Rust tree; then the Rust suites and
# the SDK suites, which mostly wait on servers, leases and timers, run at
# the same time, each lane on a Postgres and Redis of its own; the debug
# benchmark, which wants the machine to itself, runs last. Each stage's
# output is printed whole when the stage ends, and a table of every
# stage's time closes the run. A failed stage fails the run, but the other
# stages still run, so one run shows every failure.
#
#   scripts/test.sh            every stage
#   TEST_LANES=rust scripts/test.sh   only the build and the named lanes
#                              (prep, rust, sdks, bench; comma-separated)
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
lanes=${TEST_LANES:-prep,rust,sdks,bench}
composer=$PWD/target/debug/composer
# one selection for every cargo command here and in bench/run.sh: another
# (`-p composer-cli`, no tests) unifies features differently and compiles
# again
targets="--workspace --lib --bins --tests"
started=$SECONDS

wanted() { [[ ,$lanes, == *,$1,* ]]; }

# stage LANE NAME COMMAND...: runs COMMAND, prints its output whole when it
# ends, and records its time and result.
stage() {
  local lane=$1 name=$2
  shift 2
  local log="$logs/$lane.$name.log" start=$SECONDS status
  "$@" >"$log" 2>&1
  status=$?
  local took=$((SECONDS - start))
  {
    flock 9
    echo "=== $lane / $name: $([[ $status == 0 ]] && echo ok || echo "FAILED ($status)") in ${took}s"
    cat "$log"
    echo "=== end of $lane / $name"
    printf '%s\t%s\t%s\t%s\n' "$lane" "$name" "$took" "$status" >>"$logs/times"
  } 9>>"$logs/print.lock"
  return "$status"
}

prep_lane() {
  stage prep python-venv scripts/python-venv.sh
  stage prep npm-sdk bash -c 'cd sdks/typescript && npm ci --no-audit --no-fund --loglevel=error'
  stage prep npm-dashboard bash -c 'cd dashboard && npm ci --no-audit --no-fund --loglevel=error'
  stage prep go-modules bash -c 'cd sdks/go && go mod download && cd ../../bench/go_worker && go mod download'
}

rust_lane() {
  # the integration tests mostly wait on their servers: four at a time
  # keep two cores busy without starving any test's server
  stage rust cargo-test env COMPOSER_BIN="$composer" scripts/with-services.sh \
    cargo test $targets --no-fail-fast -- --skip alone:: --test-threads=4
  # the tests that need the machine to themselves, one at a time
  stage rust cargo-test-alone env COMPOSER_BIN="$composer" scripts/with-services.sh \
    cargo test $targets --no-fail-fast -- alone:: --test-threads=1
  stage rust engine-purity scripts/check-engine-purity.sh
  stage rust doc-links scripts/check-doc-links.sh
}

sdks_lane() {
  # the Go and TypeScript stages below run all that their smoke checks
  # run (vet, unit tests, the build) and more; Python's smoke check holds
  # its unit tests and mypy
  stage sdks python-unit scripts/smoke-sdks.sh python
  stage sdks python env COMPOSER_BIN="$composer" scripts/with-services.sh \
    .tools/venv-sdk-python/bin/python -m pytest -q -p no:cacheprovider sdks/python/tests/integration
  stage sdks go env COMPOSER_BIN="$composer" scripts/test-go-sdk.sh
  stage sdks typescript env COMPOSER_BIN="$composer" scripts/test-ts-sdk.sh
  stage sdks dashboard env COMPOSER_BIN="$composer" scripts/test-dashboard.sh
  stage sdks sdk-parity python3 tests/sdk-parity/check.py
  stage sdks newcomer env COMPOSER_BIN="$composer" tests/newcomer/run.sh
}

# the build comes first (the prep lane's downloads overlap it): every lane
# after it runs what it built and none waits on cargo's lock
wanted prep && { prep_lane & }
stage build cargo cargo build $targets
built=$?
wait

if [[ $built == 0 ]]; then
  wanted rust && { rust_lane & }
  wanted sdks && { sdks_lane & }
  wait
  wanted bench && stage bench check env BENCH_APPEND=0 BENCH_BUILD=debug bench/run.sh check
fi

echo
echo "stage times (lane / stage / seconds / result), $((SECONDS - started)) s in all:"
failed=0
while IFS=$'\t' read -r lane name took status; do
  result=ok
  if [[ $status != 0 ]]; then
    result="FAILED ($status)"
    failed=$((failed + 1))
  fi
  printf '  %-6s %-16s %5s  %s\n' "$lane" "$name" "$took" "$result"
done <"$logs/times"
[[ $failed == 0 ]] && exit 0
# what failed, again at the very end: a CI that keeps only the output's
# tail still names the failing tests
while IFS=$'\t' read -r lane name _ status; do
  [[ $status == 0 ]] && continue
  echo "--- $lane / $name failed at:"
  grep -E '✘|^test .* FAILED|^    [a-z_:]+$|^--- FAIL|^FAILED |panicked at|Error: ' "$logs/$lane.$name.log" | head -12
done <"$logs/times"
echo "test: $failed stage(s) failed"
exit 1
