#!/usr/bin/env bash
# A newcomer's first hour with the Go SDK, as sdks/go/README.md tells it:
# from a scratch folder outside the repository, make a Go module with the
# README's commands, write the files the README shows (pulled out of the
# README, from the fenced blocks marked `<!-- newcomer: NAME -->`), run its
# worker and its client against a running server, and check the client
# prints what the README says. Any README snippet that stops working fails
# this script.
#
# Needs (tests/newcomer/run.sh exports them): COMPOSER_REPO (the repository
# root), COMPOSER_ADDRESS (a running `composer dev`), COMPOSER_TOKEN and
# COMPOSER_WORKER_TOKEN (from `composer dev --env-file`). The SDK comes from
# the clone through the README's `replace`; its dependencies from the Go
# module proxy (or the module cache).
set -euo pipefail

fail() {
  echo "newcomer/go: FAIL: $*" >&2
  exit 1
}
trap 'echo "newcomer/go: FAIL: \"$BASH_COMMAND\" exited $? (line $LINENO)" >&2' ERR

for var in COMPOSER_REPO COMPOSER_ADDRESS COMPOSER_TOKEN COMPOSER_WORKER_TOKEN; do
  [[ -n ${!var:-} ]] || fail "$var is not set (tests/newcomer/run.sh sets it)"
done
command -v go >/dev/null || fail "go is not installed"
README=$COMPOSER_REPO/sdks/go/README.md
[[ -f $README ]] || fail "$README not found"

scratch=$(mktemp -d)
worker_pid=""
cleanup() {
  if [[ -n $worker_pid ]] && kill -0 "$worker_pid" 2>/dev/null; then
    kill -TERM "$worker_pid" 2>/dev/null || true
    wait "$worker_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

# snippet NAME: the fenced block that follows `<!-- newcomer: NAME -->` in
# the README, without its fences.
snippet() {
  local text
  text=$(awk -v want="<!-- newcomer: $1 -->" '
    $0 == want { armed = 1; next }
    armed && !inside && /^```/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }
  ' "$README")
  [[ -n $text ]] || fail "the README has no block marked <!-- newcomer: $1 -->"
  printf '%s\n' "$text"
}

# GOFLAGS=-mod=mod: go.mod may change as the commands run; no network fetch
# of the SDK itself is needed (the replace points at the clone).
export GOFLAGS=-mod=mod
started=$(date +%s)
cd "$scratch"

echo "== the README's module setup, in $scratch"
module_sh=$(snippet module.sh)
# The README's placeholder for the clone is /path/to/composer.
module_sh=${module_sh//\/path\/to\/composer/$COMPOSER_REPO}
printf '%s\n' "$module_sh"
eval "$module_sh" # set -e: a failing README command stops the script here
[[ -f go.mod ]] || fail "the README's module commands made no go.mod in $(pwd)"
module_dir=$(pwd)

echo "== the README's files"
for file in greet.yaml worker/main.go client/main.go; do
  mkdir -p "$(dirname "$file")"
  snippet "$file" >"$file"
  echo "   $file ($(wc -l <"$file") lines)"
done

echo "== the README's go mod tidy"
tidy_sh=$(snippet tidy.sh)
timeout 180 bash -euo pipefail -c "$tidy_sh" || fail "'$tidy_sh' failed (or took over 180 s)"
grep -q 'github.com/composer-dev/composer/sdks/go v' go.mod || fail "go.mod does not require the SDK after '$tidy_sh'"

echo "== go run ./worker (worker token), go run ./client (admin token); COMPOSER_ADDRESS=$COMPOSER_ADDRESS"
# The worker is built first, as `go run` would, so that the process the
# script stops is the worker itself (go run's child may outlive it).
timeout 180 go build -o "$scratch/worker-bin" ./worker || fail "the README's worker does not build"
COMPOSER_TOKEN=$COMPOSER_WORKER_TOKEN "$scratch/worker-bin" >"$scratch/worker.log" 2>&1 &
worker_pid=$!
client_status=0
output=$(cd "$module_dir" && timeout 90 go run ./client 2>"$scratch/client.log") || client_status=$?
if ((client_status != 0)); then
  echo "--- client stderr" >&2; cat "$scratch/client.log" >&2
  echo "--- worker log" >&2; cat "$scratch/worker.log" >&2
  ((client_status == 124)) && fail "the README's client did not finish within 90 s"
  fail "the README's client exited $client_status"
fi
kill -0 "$worker_pid" 2>/dev/null || { cat "$scratch/worker.log" >&2; fail "the README's worker exited early"; }

expected=$(snippet output)
if [[ $output != "$expected" ]]; then
  echo "--- worker log" >&2; cat "$scratch/worker.log" >&2
  fail "the client printed '$output'; the README says '$expected'"
fi

# The worker stops gracefully on SIGTERM, as the README says.
kill -TERM "$worker_pid"
stop_status=0
for _ in $(seq 1 300); do
  kill -0 "$worker_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$worker_pid" 2>/dev/null; then
  fail "the README's worker did not stop within 30 s of SIGTERM"
fi
wait "$worker_pid" || stop_status=$?
worker_pid=""
((stop_status == 0)) || { cat "$scratch/worker.log" >&2; fail "the README's worker exited $stop_status on SIGTERM"; }

echo "newcomer/go: ok: the client printed '$output' ($(($(date +%s) - started)) s)"
