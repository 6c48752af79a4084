#!/usr/bin/env bash
# `make dev`: Composer with everything a first look needs. Starts
# `composer dev` (private Postgres and Redis, the server, an admin token),
# then the example order worker (examples/python), runs one order through
# it, and keeps the worker serving until Ctrl-C stops all of it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

python=$(scripts/python-venv.sh)
env_file=$(mktemp)
# The server and the worker run in sessions of their own: a Ctrl-C in the
# terminal reaches only this script, which then stops each of them once
# (worker first, so it drains against a live server). Were they in the
# terminal's process group, Ctrl-C would reach them directly too, and this
# script's SIGTERM would be their second signal: exit at once, no drain.
setsid target/debug/composer dev --env-file "$env_file" "$@" &
dev_pid=$!
worker_pid=
stop() {
  trap - EXIT INT TERM
  set +e # a worker that exits non-zero must not leave the server running
  if [[ -n $worker_pid ]]; then
    kill -TERM "$worker_pid" 2>/dev/null
    wait "$worker_pid" 2>/dev/null
  fi
  kill -TERM "$dev_pid" 2>/dev/null
  wait "$dev_pid" 2>/dev/null
  rm -f "$env_file"
}
trap stop EXIT INT TERM

for _ in $(seq 1 1200); do
  grep -q '^COMPOSER_ADDRESS=' "$env_file" 2>/dev/null && break
  kill -0 "$dev_pid" 2>/dev/null || exit 1
  sleep 0.1
done
set -a
# shellcheck disable=SC1090
source "$env_file"
set +a
# for tests: a copy of what the server wrote
[[ -n ${DEV_ENV_COPY:-} ]] && cp "$env_file" "$DEV_ENV_COPY"

echo
echo "Running the example order workflow (examples/python) once:"
"$python" examples/python/run_order.py || echo "(the example run failed; the server keeps running)"
setsid "$python" examples/python/workers.py &
worker_pid=$!
echo
echo "The example worker serves the order queues. Try another run:"
echo "  COMPOSER_TOKEN=$COMPOSER_TOKEN $python examples/python/run_order.py"
echo "Ctrl-C stops the worker, the server, Postgres and Redis."
wait "$dev_pid"
