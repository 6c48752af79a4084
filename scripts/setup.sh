#!/usr/bin/env bash
# Installs what building, running and testing Composer needs and is missing.
# Idempotent and quick when everything is there. Reaches only Debian's
# packages, crates.io, the npm registry, the Go module proxy and PyPI.
#
#   postgresql, redis-server,  apt-get (as root; otherwise prints the command);
#   chromium                   chromium drives the browser tests (no download)
#   rustfmt, clippy            rustup components
#   buf, codegen plugins       scripts/install-codegen-tools.sh (into .tools/)
#   grpcurl                    go install (into .tools/bin)
#   moto                       pip, into .tools/moto: the S3 API the blob store's
#                              tests run against (decision 0046)
#   SDK packages               installed by scripts/smoke-sdks.sh on first use
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
GRPCURL_VERSION=v1.9.4
MOTO_VERSION=5.2.6

log() { printf 'setup: %s\n' "$*" >&2; }

have_postgres() {
  command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing_packages=()
have_postgres || missing_packages+=(postgresql)
command -v redis-server >/dev/null 2>&1 || missing_packages+=(redis-server)
[[ -x ${CHROMIUM_PATH:-/usr/bin/chromium} ]] || missing_packages+=(chromium)
command -v pgbench >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/pgbench' >/dev/null ||
  missing_packages+=(postgresql-contrib)
if ((${#missing_packages[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    log "apt-get install ${missing_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${missing_packages[@]}" >&2
    # Debian's package starts a cluster of its own; Composer never uses it.
    if command -v service >/dev/null 2>&1; then
      service postgresql stop >/dev/null 2>&1 || true
      service redis-server stop >/dev/null 2>&1 || true
    fi
  else
    log "missing: ${missing_packages[*]}; install them with:"
    echo "  sudo apt-get install -y ${missing_packages[*]}" >&2
    exit 1
  fi
fi

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  log "rustup component add rustfmt clippy"
  rustup component add rustfmt clippy >&2
fi

scripts/install-codegen-tools.sh

if [[ ! -x .tools/bin/grpcurl ]]; then
  log "go install grpcurl@$GRPCURL_VERSION"
  GOBIN="$ROOT/.tools/bin" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
fi
if [[ ! -x .tools/moto/bin/moto_server ]]; then
  log "pip install moto[server]==$MOTO_VERSION (into .tools/moto)"
  python3 -m venv .tools/moto >&2
  .tools/moto/bin/pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
fi
log "ok"
