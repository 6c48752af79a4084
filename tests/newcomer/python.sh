#!/usr/bin/env bash
# A newcomer's first hour with the Python SDK, as sdks/python/README.md's
# "Quick start" tells it: from a scratch folder outside the repository, make
# a virtualenv and install the SDK with the README's own commands, write the
# README's hello.yaml, worker.py and client.py (taken from the blocks marked
# `<!-- newcomer: NAME -->`, never copied here), run the worker and the
# client against a running server, and check the client prints the greeting.
# It fails, naming the step, when a README block stops working.
#
# Needs (tests/newcomer/run.sh exports them): COMPOSER_REPO (the repository
# root), COMPOSER_ADDRESS (of a running `composer dev`), COMPOSER_TOKEN.
# Optional: PYTHON (default python3), NEWCOMER_STEP_TIMEOUT (seconds a step
# may take, default 60).
set -euo pipefail

: "${COMPOSER_REPO:?COMPOSER_REPO must be the repository root}"
: "${COMPOSER_ADDRESS:?COMPOSER_ADDRESS must point at a running composer dev}"
PYTHON=${PYTHON:-python3}
STEP=${NEWCOMER_STEP_TIMEOUT:-60}
README="$COMPOSER_REPO/sdks/python/README.md"

work=$(mktemp -d "${TMPDIR:-/tmp}/composer-newcomer-python.XXXXXX")
worker_pid=""
cleanup() {
  if [[ -n $worker_pid ]]; then
    { kill -KILL "$worker_pid" && wait "$worker_pid"; } 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

say() { echo "newcomer/python: [${SECONDS}s] $*"; }
# fail MESSAGE [LOG...]: says what broke, shows the end of the step's logs, exits 1.
fail() {
  echo "newcomer/python: FAIL: $1" >&2
  shift
  for log in "$@"; do
    [[ -s $work/$log ]] || continue
    echo "--- $log (last 40 lines)" >&2
    tail -n 40 "$work/$log" >&2
  done
  exit 1
}

# The fenced block right after `<!-- newcomer: NAME -->` in the README.
block() {
  local text
  text=$(awk -v marker="<!-- newcomer: $1 -->" '
    $0 == marker { armed = 1; next }
    armed == 1 && /^```/ { armed = 2; next }
    armed == 2 && /^```/ { exit }
    armed == 2 { print }
  ' "$README")
  [[ -n $text ]] || fail "$README has no fenced block after <!-- newcomer: $1 -->"
  printf '%s\n' "$text"
}

cd "$work"
# Nothing of the repository leaks in: the SDK comes from the install only.
unset PYTHONPATH VIRTUAL_ENV
export PYTHONDONTWRITEBYTECODE=1

say "installing as the README says, in $work"
install=$(block install.sh)
[[ $install == *path/to/composer* ]] || fail "the README's install block no longer names path/to/composer (the clone)"
printf '%s\n' "${install//path\/to\/composer/$COMPOSER_REPO}" >install.sh
# the README's `python3` is the PYTHON chosen here
sed -i "s|^python3 |$PYTHON |" install.sh
timeout "$STEP" bash -e install.sh >install.log 2>&1 ||
  fail "the README's install commands failed (or took over ${STEP}s)" install.log
python="$work/.venv/bin/python"
[[ -x $python ]] || fail "the README's install commands made no .venv"
where=$("$python" -c 'import composer; print(composer.__file__)') || fail "the installed SDK does not import"
[[ $where != "$COMPOSER_REPO"* ]] || fail "composer was imported from the repository ($where), not from the install"

say "installed"
block hello.yaml >hello.yaml
block worker.py >worker.py
block client.py >client.py

say "running worker.py and client.py against $COMPOSER_ADDRESS"
"$python" worker.py >worker.log 2>&1 &
worker_pid=$!
timeout "$STEP" "$python" client.py >client.log 2>&1 || {
  status=$?
  [[ $status -eq 124 ]] && fail "client.py did not finish within ${STEP}s" client.log worker.log
  fail "client.py exited with status $status" client.log worker.log
}
kill -0 "$worker_pid" 2>/dev/null || fail "worker.py exited before the client finished" worker.log
say "client.py finished"
output=$(cat client.log)
[[ $output == "Hello, Ada!" ]] || fail "client.py printed '$output', expected 'Hello, Ada!'" client.log worker.log

# The README says Ctrl-C / SIGTERM stops the worker: it drains and exits 0
# (after the long poll it is in returns: up to 20 s).
kill -TERM "$worker_pid"
for _ in $(seq 1 "$STEP"); do
  kill -0 "$worker_pid" 2>/dev/null || break
  sleep 1
done
kill -0 "$worker_pid" 2>/dev/null && fail "worker.py did not stop within ${STEP}s of SIGTERM" worker.log
worker_status=0
wait "$worker_pid" || worker_status=$?
worker_pid=""
[[ $worker_status -eq 0 ]] || fail "worker.py exited with status $worker_status after SIGTERM" worker.log

say "PASS (client.py printed: $output)"
