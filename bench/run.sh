#!/usr/bin/env bash
# Runs the server benchmarks (issue #7): `make bench` (full, ~20 min) and
# `make bench-quick` (~6 min, CI). Builds the release server and the
# load generator, makes sure the Python SDK's venv exists (the same one
# scripts/smoke-sdks.sh makes; the Python row is left out if it cannot be
# made), then runs bench/loadgen, which starts its own Postgres and Redis
# (`composer dev --no-server`), servers and workers, prints a table and
# writes it to bench/results/<date>-<profile>.md (not with BENCH_APPEND=0,
# as `make test` runs it). It reports; it never fails on a time, only when a
# benchmark cannot run.
#
# BENCH_BUILD=debug runs it on the debug build the tests made instead of
# compiling everything again for release: `make test` does, with the
# `check` profile (every row in small windows and sizes), so CI checks
# that the benchmarks run without a second build of the whole tree (all
# but B5's quarter-core series and the large-payload rows, which a debug
# server cannot keep up with); its figures are never quoted.
#
#   bench/run.sh quick|full|check [extra composer-loadgen flags]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
profile=${1:-quick}
shift || true
case $profile in
  quick) command="make bench-quick" ;;
  full) command="make bench" ;;
  check) command="make test" ;;
  *) echo "usage: bench/run.sh quick|full|check" >&2; exit 2 ;;
esac

build=${BENCH_BUILD:-release}
case $build in
  release) cargo build --release --quiet -p composer-cli -p composer-loadgen ;;
  # a debug server cannot work within B5's quarter of a core, nor move
  # 100 KB payloads within the payload rows' window: those two are the
  # release build's alone
  debug)
    # the selection `make test` builds (scripts/test.sh): nothing compiles
    # again
    cargo build --quiet --workspace --lib --bins --tests
    set -- --server-cores 0 --only floor,b1,sdk,b2,b3,b4,b7,b6,obs,bulk,migrate,b8,b5 "$@"
    ;;
  *) echo "bench: BENCH_BUILD is release or debug, not $build" >&2; exit 2 ;;
esac

sdk_args=()
if python=$(scripts/python-venv.sh); then
  sdk_args+=(--python "$python")
else
  echo "bench: no Python SDK venv; the Python row is left out" >&2
fi
mkdir -p target/bench
if (cd bench/go_worker && go build -o ../../target/bench/go_worker .) >&2; then
  sdk_args+=(--go-worker target/bench/go_worker)
else
  echo "bench: the Go worker did not build; its row is left out" >&2
fi
if [[ -f sdks/typescript/dist/index.js ]] ||
  (cd sdks/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build) >&2; then
  sdk_args+=(--ts-worker bench/ts_worker/worker.mjs)
else
  echo "bench: the TypeScript SDK did not build; its row is left out" >&2
fi

# each run's raw table goes to a file of its own; BENCHMARKS.md quotes
# the latest full one and keeps the history of the figures
mkdir -p bench/results
append_args=(--append "bench/results/$(date -u +%Y-%m-%d-%H%M)-$profile.md")
if [[ ${BENCH_APPEND:-1} == 0 ]]; then
  append_args=()
fi

exec "target/$build/composer-loadgen" --profile "$profile" --composer "target/$build/composer" \
  "${sdk_args[@]}" "${append_args[@]}" --command "$command" "$@"
