#!/usr/bin/env bash
# Smoke-tests the generated wire layer of the three SDKs, as committed (it
# does not regenerate; scripts/generate-check.sh does that):
#
#   python      pytest sdks/python/tests + mypy, in the venv .tools/venv-sdk-python
#               (`pip install -e sdks/python[dev]`, redone when pyproject.toml changes)
#   go          go vet + go test ./... in sdks/go
#   typescript  npm ci (when the lockfile changed), tsc build, node --test, in
#               sdks/typescript (node_modules/ there)
#
# Prints one PASS/FAIL line per language and a closing "N passed, N failed";
# exits non-zero when any language failed. Needs Go, Node 20+ and Python 3.11+.
# Usage: scripts/smoke-sdks.sh [python] [go] [typescript]   (default: all)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
LOGDIR=$(mktemp -d)
trap 'rm -rf "$LOGDIR"' EXIT

sha() { sha256sum "$@" | sha256sum | cut -c1-16; }

smoke_python() {
  local python
  python=$(scripts/python-venv.sh) || return 1
  (cd sdks/python && "$python" -m pytest -q -p no:cacheprovider && "$python" -m mypy)
}

smoke_go() {
  (cd sdks/go && go vet ./... && go test -count=1 ./...)
}

smoke_typescript() {
  local stamp=sdks/typescript/node_modules/.composer-smoke-stamp
  local want
  want=$(sha sdks/typescript/package.json sdks/typescript/package-lock.json)
  if [[ $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
    (cd sdks/typescript && npm ci --no-audit --no-fund --loglevel=error) &&
      echo "$want" >"$stamp" || return 1
  fi
  (cd sdks/typescript && npm run --silent build && npm test --silent)
}

langs=("$@")
[[ ${#langs[@]} -gt 0 ]] || langs=(python go typescript)

passed=0
failed=0
for lang in "${langs[@]}"; do
  case $lang in
    python | go | typescript) ;;
    *) echo "smoke-sdks: unknown language '$lang' (python, go, typescript)" >&2; exit 2 ;;
  esac
  log="$LOGDIR/$lang.log"
  start=$SECONDS
  if "smoke_$lang" >"$log" 2>&1; then
    passed=$((passed + 1))
    summary=$(grep -E '[0-9]+ passed|^ok[[:space:]]+[a-z]|^# (pass|fail) |^Success' "$log" | tr -s '\t\n' '  ' | sed 's/ *$//')
    printf 'smoke-sdks: PASS %-10s (%ds) %s\n' "$lang" $((SECONDS - start)) "$summary"
  else
    failed=$((failed + 1))
    printf 'smoke-sdks: FAIL %-10s (%ds), its output:\n' "$lang" $((SECONDS - start))
    sed 's/^/    /' "$log"
  fi
done

echo "smoke-sdks: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
