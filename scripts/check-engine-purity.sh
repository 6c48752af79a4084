#!/usr/bin/env bash
# The engine is pure: no I/O crate may enter its normal dependency tree.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(cargo tree -p composer-engine -e normal --prefix none)
bad=$(grep -E '^(tokio|sqlx|redis|tonic|hyper|reqwest|mio)( |-)' <<<"$tree" || true)
if [[ -n $bad ]]; then
  echo "check-engine-purity: FAIL: composer-engine depends on I/O crates:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "check-engine-purity: ok"
