#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs into it what the gateway needs to run, at the versions requirements.lock
# pins, and this project; with --test, also the test suite's tools (requirements-test.lock, on top).
#
#   ./scripts/bootstrap.sh          # the runtime: what scripts/demo.sh and `gateway serve` need
#   ./scripts/bootstrap.sh --test   # the runtime and the test tools: what scripts/test.sh and .ci/run need
#
# Idempotent: each part is installed again only when what it is made from has changed (the runtime: requirements.lock,
# pyproject.toml, setup.py and the C scanner gateway/policies/board_cards/_jsonscan.c; the test tools: also
# requirements-test.lock). The C scanner is compiled here; it is optional (without a C compiler, json_splice reads
# every array with its Python paths).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
test_tools=false
case "${1:-}" in
  "") ;;
  --test) test_tools=true ;;
  *) echo "bootstrap: unknown argument $1 (--test, or nothing)" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "bootstrap: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
runtime="$(cat requirements.lock pyproject.toml setup.py gateway/policies/board_cards/_jsonscan.c | sha256sum | cut -d' ' -f1)"
# The C scanner is missing but a compiler is there now (installed since the last run): build it.
scanner_missing() { ! ls gateway/policies/board_cards/_jsonscan*.so >/dev/null 2>&1 && command -v "${CC:-cc}" >/dev/null 2>&1; }
if [ "$(cat .venv/.installed 2>/dev/null)" != "$runtime" ] || scanner_missing; then
  pip -r requirements.lock
  pip --no-deps -e .
  echo "$runtime" > .venv/.installed
fi
if $test_tools; then
  tools="$(sha256sum < requirements-test.lock | cut -d' ' -f1)-$runtime"
  if [ "$(cat .venv/.installed-test 2>/dev/null)" != "$tools" ]; then
    pip -r requirements-test.lock
    echo "$tools" > .venv/.installed-test
  fi
fi
