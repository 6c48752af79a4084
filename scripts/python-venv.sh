#!/usr/bin/env bash
# Makes sure .tools/venv-sdk-python has the Python SDK installed (editable,
# with its dev extras); reinstalls when sdks/python/pyproject.toml changed.
# Prints the venv's python.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
venv="$ROOT/.tools/venv-sdk-python"
stamp="$venv/.composer-smoke-stamp"
want=$(sha256sum sdks/python/pyproject.toml | sha256sum | cut -c1-16)
if [[ ! -x $venv/bin/python || $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e 'sdks/python[dev]' >&2
  echo "$want" >"$stamp"
fi
echo "$venv/bin/python"
