#!/usr/bin/env bash
# Starts the sandbox service (127.0.0.1:8081) and the gateway in front of it (127.0.0.1:8080, admin 9090)
# on the default config, prints a few commands to try, and stops both on Ctrl-C.
# Installs what it needs into .venv first (idempotent, pinned versions).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
config="${GATEWAY_CONFIG:-config/gateway.yaml}"
.venv/bin/gateway check-config "$config" >/dev/null

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

.venv/bin/python -m sandbox --host 127.0.0.1 --port 8081 > >(sed -u 's/^/[sandbox] /' >&2) 2>&1 &
pids+=($!)
.venv/bin/gateway serve --config "$config" > >(sed -u 's/^/[gateway] /') 2>&1 &
pids+=($!)

for _ in $(seq 1 50); do
  if .venv/bin/python - <<'PY' 2>/dev/null; then break; fi
import urllib.request
urllib.request.urlopen("http://127.0.0.1:9090/readyz", timeout=1)
urllib.request.urlopen("http://127.0.0.1:8081/_sandbox/journal", timeout=1)
PY
  sleep 0.2
done

cat <<'TXT'

The gateway is on http://127.0.0.1:8080 in front of the sandbox (http://127.0.0.1:8081). Try:

  T='Authorization: Bearer sandbox-token'
  curl -s -H "$T" http://127.0.0.1:8080/api/latest/boards/1 | head -c 600; echo
  curl -s -H "$T" 'http://127.0.0.1:8080/api/latest/cards?board_id=1&limit=2&offset=0'; echo
  curl -s -H "$T" http://127.0.0.1:8080/api/v1/cards/1; echo
  curl -si -H "$T" -X PUT -F file=@README.md http://127.0.0.1:8080/api/v1/cards/1/files      # deprecated upload
  curl -si -H "$T" -H 'Host: legacy.localhost' -X PUT -F file=@README.md http://127.0.0.1:8080/api/v1/cards/1/files
  curl -si 'http://127.0.0.1:8080/api/v1/cards//1/%2e%2e/1'                            # canonical path
  curl -si 'http://127.0.0.1:8080/api/v1/cards/1%2Ffiles'                               # refused: encoded '/'
  curl -s http://127.0.0.1:9090/metrics | grep ^gateway_requests_total
  .venv/bin/gateway check-config config/gateway.yaml

Ctrl-C stops both.
TXT
wait -n "${pids[@]}"
