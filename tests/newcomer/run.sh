#!/usr/bin/env bash
# The newcomer test: what a new user does first, in each SDK, from a
# scratch folder outside the repository, exactly as the READMEs say.
# Starts `composer dev` as the README does (its own Postgres and Redis),
# gives the scripts its address in the README's `http://` form and its
# tokens, and runs each language's script in turn (one at a time: the
# READMEs share a workflow and a queue).
#
#   tests/newcomer/run.sh                 every language
#   tests/newcomer/run.sh go python       some of them
#
# With COMPOSER_BIN set, that binary is used (no cargo build).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

if [[ -n ${COMPOSER_BIN:-} ]]; then
  composer=$COMPOSER_BIN
else
  cargo build --quiet -p composer-cli
  composer=$repo/target/debug/composer
fi
languages=("$@")
[[ ${#languages[@]} -gt 0 ]] || languages=(go python typescript)

scratch=$(mktemp -d)
env_file=$scratch/dev.env
"$composer" dev --listen 127.0.0.1:0 --env-file "$env_file" >"$scratch/dev.log" 2>&1 &
dev_pid=$!
stop() {
  kill -TERM "$dev_pid" 2>/dev/null || true
  wait "$dev_pid" 2>/dev/null || true
  rm -rf "$scratch"
}
trap stop EXIT
# the file first holds the stores' URLs, then, once the server listens,
# its address and tokens (the worker token is the last line)
ready() { grep -q '^COMPOSER_WORKER_TOKEN=' "$env_file" 2>/dev/null; }
for _ in $(seq 1 600); do
  ready && break
  kill -0 "$dev_pid" 2>/dev/null || { cat "$scratch/dev.log" >&2; echo "newcomer: composer dev exited early" >&2; exit 1; }
  sleep 0.1
done
ready || { cat "$scratch/dev.log" >&2; echo "newcomer: composer dev did not start within 60 s" >&2; exit 1; }
set -a
# shellcheck disable=SC1090
source "$env_file"
set +a
# the form the README exports
[[ $COMPOSER_ADDRESS == http*://* ]] || COMPOSER_ADDRESS=http://$COMPOSER_ADDRESS
export COMPOSER_ADDRESS COMPOSER_REPO=$repo

failed=()
for language in "${languages[@]}"; do
  script=$here/$language.sh
  [[ -f $script ]] || { echo "newcomer: no $script" >&2; failed+=("$language"); continue; }
  echo "=== newcomer: $language"
  start=$SECONDS
  if bash "$script"; then
    echo "=== newcomer: $language ok in $((SECONDS - start)) s"
  else
    echo "=== newcomer: $language FAILED after $((SECONDS - start)) s"
    failed+=("$language")
  fi
done
[[ ${#failed[@]} == 0 ]] || { echo "newcomer: failed: ${failed[*]}" >&2; exit 1; }
