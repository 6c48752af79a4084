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
target/debug/composer dev --env-file "$env_file" "$@" &
dev_pid=$!
worker_pid=
stop() {
  trap - EXIT INT TERM
  [[ -n $worker_pid ]] && kill -TERM "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  kill -TERM "$dev_pid" 2>/dev/null || true
  wait "$dev_pid" 2>/dev/null || true
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

echo
echo "Running the example order workflow (examples/python) once:"
"$python" examples/python/run_order.py || echo "(the example run failed; the server keeps running)"
"$python" examples/python/workers.py &
worker_pid=$!
echo
echo "The example worker serves the order queues. Try another run:"
echo "  COMPOSER_TOKEN=$COMPOSER_TOKEN $python examples/python/run_order.py"
echo "Ctrl-C stops the worker, the server, Postgres and Redis."
wait "$dev_pid"
