#!/usr/bin/env bash
# The engine is pure: it must not depend on any I/O crate (docs/architecture.md: the engine
# depends on no I/O crate). Fails, naming the crate, if one shows up in the
# normal (non-dev) dependency tree of composer-engine.
set -euo pipefail
cd "$(dirname "$0")/.."
forbidden='^(tokio|sqlx|redis|tonic|hyper|reqwest|mio)(-|$)'
tree="$(cargo tree -p composer-engine -e normal --prefix none --format '{p}')"
found="$(printf '%s\n' "$tree" | awk '{print $1}' | grep -E "$forbidden" | sort -u || true)"
if [ -n "$found" ]; then
    echo "composer-engine must stay pure, but depends on:" >&2
    printf '  %s\n' $found >&2
    exit 1
fi
echo "composer-engine is pure: no tokio, sqlx, redis, tonic, hyper, reqwest or mio"
