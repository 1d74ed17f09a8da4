#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs the pinned dependencies and this project into it.
# Idempotent: does nothing when requirements.lock, pyproject.toml, setup.py and the C scanner (gateway/policies/board_cards/_jsonscan.c)
# have not changed since the last install. The C scanner is compiled here; it is optional (without a C compiler,
# json_splice reads every array with its Python paths).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "bootstrap: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.installed
want="$(cat requirements.lock pyproject.toml setup.py gateway/policies/board_cards/_jsonscan.c | sha256sum | cut -d' ' -f1)"
# The C scanner is missing but a compiler is there now (installed since the last run): build it.
scanner_missing() { ! ls gateway/policies/board_cards/_jsonscan*.so >/dev/null 2>&1 && command -v "${CC:-cc}" >/dev/null 2>&1; }
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || scanner_missing; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  echo "$want" > "$stamp"
fi
