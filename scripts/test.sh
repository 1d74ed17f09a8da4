#!/usr/bin/env bash
# Runs the whole test suite; installs what it needs into .venv first (idempotent, pinned versions).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
