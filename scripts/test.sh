#!/usr/bin/env bash
# Runs the whole test suite; installs what it needs into .venv first: the runtime and, on top, the test tools
# (scripts/bootstrap.sh --test: requirements.lock and requirements-test.lock, pinned versions; idempotent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh" --test
# tests/differential runs real Node parsers (busboy, formidable) and writers: installed with npm ci from their
# lockfile, again only when it changes. Without node and npm those tests fail and say why.
node_dir="$root/tests/differential/node"
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  want="$(sha256sum "$node_dir/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$node_dir/node_modules/.installed" 2>/dev/null)" != "$want" ]; then
    if (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1); then
      echo "$want" > "$node_dir/node_modules/.installed"
    else
      echo "test.sh: npm ci failed in tests/differential/node; tests/differential will fail" >&2
    fi
  fi
fi
# tests/deploy runs promtool (Debian's prometheus package): installed once, as root with apt-get, when missing.
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends prometheus \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install promtool (Debian package prometheus); tests/deploy will skip its checks" >&2
fi
# tests/integration/test_status_page.py drives Debian's chromium with Playwright: installed the same way when missing.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends chromium \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install chromium (Debian package chromium); the status page's browser tests will skip" >&2
fi
# tests/deploy/test_image.py builds and runs the container image with podman (runtime runc), on a Python base that
# mmdebstrap makes from Debian's archive (deploy/python-base-image.sh): installed the same way when missing.
if ! { command -v podman && command -v runc && command -v mmdebstrap; } >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends podman runc mmdebstrap \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends podman runc mmdebstrap; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install podman, runc, mmdebstrap (Debian packages); the image test will skip" >&2
fi
# The usage ledger's tests start a real PostgreSQL server (Debian's postgresql package: initdb and pg_ctl, run by the
# tests in a temporary directory as an unprivileged user): installed the same way when missing.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends postgresql \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install PostgreSQL (Debian package postgresql); the usage ledger's PostgreSQL tests will skip" >&2
fi
cd "$root"
exec .venv/bin/python -m pytest "$@"
