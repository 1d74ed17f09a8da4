#!/usr/bin/env bash
# Runs the whole test suite; installs what it needs into .venv first (idempotent, pinned versions).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
# tests/deploy runs promtool (Debian's prometheus package): installed once, as root with apt-get, when missing.
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq --no-install-recommends prometheus \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }; } >/dev/null 2>&1 \
    || echo "test.sh: could not install promtool (Debian package prometheus); tests/deploy will skip its checks" >&2
fi
cd "$root"
exec .venv/bin/python -m pytest "$@"
