#!/usr/bin/env bash
# Installs the pinned code generators that `buf generate` (buf.gen.yaml) runs
# as local plugins, into .tools/ at the repository root (gitignored):
#
#   .tools/node_modules/.bin/buf                 buf CLI (npm @bufbuild/buf)
#   .tools/node_modules/.bin/protoc-gen-es       TypeScript (npm @bufbuild/protoc-gen-es)
#   .tools/bin/protoc-gen-go                     Go messages
#   .tools/bin/protoc-gen-go-grpc                Go gRPC stubs
#   .tools/venv/                                 grpcio-tools (bundled protoc + gRPC
#                                                Python generator), run by
#                                                tools/protoc-gen-python-grpc
#
# Needs Go, Node 20+ with npm and Python 3.11+ on PATH; reaches only the npm
# registry, the Go module proxy and PyPI. Idempotent: a tool already present
# at its pinned version is left alone, so a second run takes about a second.
#
# The versions below must move together with the SDKs' runtime pins:
#   PROTOC_GEN_ES_VERSION  == "@bufbuild/protobuf" in sdks/typescript/package.json
#   PROTOC_GEN_GO_VERSION  == google.golang.org/protobuf in sdks/go/go.mod (or older)
#   GRPCIO_TOOLS_VERSION   -> protoc 35.1 -> protobuf>=7.35.1,<8 and
#                             grpcio>=1.85.1 in sdks/python/pyproject.toml
set -euo pipefail

BUF_VERSION=1.75.0
PROTOC_GEN_ES_VERSION=2.17.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
GRPCIO_TOOLS_VERSION=1.85.1
GRPCIO_VERSION=1.85.1
PROTOBUF_PY_VERSION=7.36.2 # the protobuf runtime the generator venv runs on
PYTHON=${PYTHON:-python3}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$ROOT/.tools"
mkdir -p "$TOOLS/bin"

log() { printf 'install-codegen-tools: %s\n' "$*" >&2; }

# --- npm: buf and protoc-gen-es ---------------------------------------------
npm_version() { # prints the installed version of an npm package in .tools, or nothing
  local pkg_json="$TOOLS/node_modules/$1/package.json"
  [[ -f $pkg_json ]] && node -p "require(process.argv[1]).version" "$pkg_json" 2>/dev/null || true
}
if [[ $(npm_version @bufbuild/buf) != "$BUF_VERSION" ||
      $(npm_version @bufbuild/protoc-gen-es) != "$PROTOC_GEN_ES_VERSION" ]]; then
  log "npm: @bufbuild/buf@$BUF_VERSION @bufbuild/protoc-gen-es@$PROTOC_GEN_ES_VERSION"
  npm install --prefix "$TOOLS" --save-exact --no-audit --no-fund --loglevel=error \
    "@bufbuild/buf@$BUF_VERSION" "@bufbuild/protoc-gen-es@$PROTOC_GEN_ES_VERSION" >&2
fi

# --- Go: protoc-gen-go and protoc-gen-go-grpc -------------------------------
go_tool() { # name, module path, version, version as the binary prints it
  local bin="$TOOLS/bin/$1"
  if [[ -x $bin && $("$bin" --version 2>/dev/null) == "$1 $4" ]]; then
    return
  fi
  log "go: $2@$3"
  GOBIN="$TOOLS/bin" go install "$2@$3"
}
go_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
  "$PROTOC_GEN_GO_VERSION" "$PROTOC_GEN_GO_VERSION"
go_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  "$PROTOC_GEN_GO_GRPC_VERSION" "${PROTOC_GEN_GO_GRPC_VERSION#v}"

# --- Python: grpcio-tools in a venv -----------------------------------------
VENV="$TOOLS/venv"
py_ok() {
  [[ -x $VENV/bin/python ]] && "$VENV/bin/python" - "$GRPCIO_TOOLS_VERSION" "$PROTOBUF_PY_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if (version("grpcio-tools"), version("protobuf")) == tuple(sys.argv[1:3]) else 1)
EOF
}
if ! py_ok; then
  log "python: grpcio-tools==$GRPCIO_TOOLS_VERSION protobuf==$PROTOBUF_PY_VERSION in .tools/venv"
  [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "grpcio-tools==$GRPCIO_TOOLS_VERSION" "grpcio==$GRPCIO_VERSION" "protobuf==$PROTOBUF_PY_VERSION" >&2
  py_ok || { log "python: grpcio-tools did not install at the pinned version"; exit 1; }
fi

log "ok (buf $BUF_VERSION, protoc-gen-es $PROTOC_GEN_ES_VERSION, protoc-gen-go $PROTOC_GEN_GO_VERSION, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION, grpcio-tools $GRPCIO_TOOLS_VERSION)"
