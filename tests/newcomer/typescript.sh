#!/usr/bin/env bash
# A newcomer's first TypeScript project, exactly as sdks/typescript/README.md ("Your first project,
# step by step") tells it: in a scratch folder outside the repository it runs the README's setup
# block (npm init, "type": "module", the SDK installed from the repository, typescript + tsx), writes
# the README's tsconfig.json, greet.yaml, worker.ts and client.ts (each taken from the README: the
# fenced block after `<!-- newcomer: NAME -->`), type-checks them with `npx tsc`, runs
# `npx tsx worker.ts` and `npx tsx client.ts` against the server, checks the client prints what the
# README says it prints, and stops the worker as Ctrl-C would. Any README snippet that stops working
# fails this script.
#
# Run by tests/newcomer/run.sh with COMPOSER_REPO (the repository root), COMPOSER_ADDRESS (of a
# running `composer dev`), COMPOSER_TOKEN and COMPOSER_WORKER_TOKEN exported. By hand:
#   target/debug/composer dev --listen 127.0.0.1:0 --env-file /tmp/env &
#   set -a; . /tmp/env; set +a; COMPOSER_ADDRESS=http://$COMPOSER_ADDRESS COMPOSER_REPO=$PWD tests/newcomer/typescript.sh
set -euo pipefail

say() { echo "newcomer/typescript: $*" >&2; }
fail() {
  say "FAIL: $*"
  exit 1
}

for name in COMPOSER_REPO COMPOSER_ADDRESS COMPOSER_TOKEN; do
  [[ -n ${!name:-} ]] || fail "$name is not set (tests/newcomer/run.sh exports it)"
done
repo=$COMPOSER_REPO
sdk=$repo/sdks/typescript
readme=$sdk/README.md
[[ -f $readme ]] || fail "$readme is missing"
started=$SECONDS

# The fenced block that follows `<!-- newcomer: $1 -->` in the README.
block() {
  local text
  text=$(awk -v marker="<!-- newcomer: $1 -->" '
    $0 == marker { armed = 1; next }
    armed && !inside && /^```/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }
  ' "$readme")
  [[ -n $text ]] || fail "the README has no block marked <!-- newcomer: $1 --> (followed by a fenced block)"
  printf '%s\n' "$text"
}

# The SDK is installed from the repository, built: build it only when dist is missing or older than
# src (npm ci only when node_modules is missing), so the script stays fast and offline.
if [[ ! -f $sdk/dist/index.js ]] || [[ -n $(find "$sdk/src" -name '*.ts' -newer "$sdk/dist/index.js" -print -quit) ]]; then
  say "building the SDK (npm run build in sdks/typescript)"
  if [[ ! -d $sdk/node_modules ]]; then
    (cd "$sdk" && timeout 300 npm ci --no-audit --no-fund >/dev/null) || fail "npm ci in sdks/typescript failed"
  fi
  (cd "$sdk" && timeout 180 npm run build >/dev/null) || fail "npm run build in sdks/typescript failed"
fi

scratch=$(mktemp -d)
case $scratch in "$repo"/*) fail "the scratch folder $scratch is inside the repository" ;; esac
worker_group=""
cleanup() {
  if [[ -n $worker_group ]] && kill -0 -- "-$worker_group" 2>/dev/null; then
    { kill -KILL -- "-$worker_group" && wait "$worker_group"; } 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

# npm: no audit, fund or update chatter; packages from the cache when it has them.
export NPM_CONFIG_AUDIT=false NPM_CONFIG_FUND=false NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_PREFER_OFFLINE=true

say "setup block of the README in $scratch"
setup=$(block setup.sh)
setup=${setup//\/path\/to\/composer/$repo}
(cd "$scratch" && timeout 180 bash -euo pipefail -c "$setup"$'\n''pwd >&3' 3>"$scratch/.project") >"$scratch/setup.log" 2>&1 || {
  cat "$scratch/setup.log" >&2
  fail "the README's setup block failed (log above)"
}
project=$(cat "$scratch/.project")
cd "$project"
[[ $(npm pkg get type) == '"module"' ]] || fail "the setup block left package.json without \"type\": \"module\""

for file in tsconfig.json greet.yaml worker.ts client.ts; do
  block "$file" >"$file"
done
expected=$(grep -o "// { text: .* }" client.ts | sed 's#^// ##') || true
[[ -n $expected ]] || fail "client.ts (from the README) no longer says in a comment what it prints"

say "npx tsc (type-check the README's worker.ts and client.ts)"
timeout 120 npx tsc >tsc.log 2>&1 || {
  cat tsc.log >&2
  fail "npx tsc failed on the README's files (above)"
}

say "npx tsx worker.ts against $COMPOSER_ADDRESS"
# Its own process group, so stopping it reaches npx, tsx and node, as Ctrl-C in a terminal does;
# `timeout` bounds it should the stop itself hang.
COMPOSER_LOG_LEVEL=info setsid timeout -s KILL 120 npx tsx worker.ts >worker.log 2>&1 &
worker_group=$!

say "npx tsx client.ts"
if ! timeout 60 npx tsx client.ts >client.log 2>&1; then
  cat client.log >&2
  echo "--- worker.log" >&2
  cat worker.log >&2
  fail "npx tsx client.ts failed or timed out (output above)"
fi
got=$(cat client.log)
[[ $got == "$expected" ]] || {
  echo "--- worker.log" >&2
  cat worker.log >&2
  fail "client.ts printed '$got'; the README says '$expected'"
}
grep -q "polling greetings" worker.log || fail "worker.ts never polled queue greetings: $(cat worker.log)"

# The README: an idle worker takes up to pollWaitMs (20 s) to stop.
say "stopping the worker (SIGINT, as Ctrl-C)"
kill -INT -- "-$worker_group"
for ((i = 0; i < 300; i++)); do
  kill -0 -- "-$worker_group" 2>/dev/null || break
  sleep 0.1
done
kill -0 -- "-$worker_group" 2>/dev/null && fail "worker.ts did not stop within 30 s of SIGINT: $(cat worker.log)"
grep -q "worker .* stopped" worker.log || fail "worker.ts ended without stopping cleanly: $(cat worker.log)"
worker_group=""

say "ok: the README's project printed $got ($((SECONDS - started)) s)"
