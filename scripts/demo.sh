#!/usr/bin/env bash
# Starts the sandbox service and the gateway in front of it on the default config, prints a few commands to try,
# and stops both on Ctrl-C. Installs what it needs into .venv first (idempotent, pinned versions).
#
#   ./scripts/demo.sh [--port 8080] [--admin-port 9090] [--sandbox-port 8081]
#
# The ports can also come from GATEWAY_PORT, ADMIN_PORT and SANDBOX_PORT. If the sandbox or the gateway does not
# become ready (a port taken, a bad config), it says which, shows the end of its log and exits non-zero.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port="${GATEWAY_PORT:-8080}"
admin_port="${ADMIN_PORT:-9090}"
sandbox_port="${SANDBOX_PORT:-8081}"
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --admin-port) admin_port="$2"; shift 2 ;;
    --sandbox-port) sandbox_port="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for p in "$port" "$admin_port" "$sandbox_port"; do
  [[ "$p" =~ ^[0-9]+$ ]] && [ "$p" -ge 1 ] && [ "$p" -le 65535 ] || { echo "demo: not a port: $p" >&2; exit 2; }
done
"$root/scripts/bootstrap.sh"
cd "$root"
work="$(mktemp -d -t gateway-demo.XXXXXX)"
# The default config, in front of the sandbox on the port chosen here.
config="${GATEWAY_CONFIG:-config/gateway.yaml}"
sed "s#http://127.0.0.1:8081#http://127.0.0.1:${sandbox_port}#g" "$config" > "$work/gateway.yaml"
# The admin listener answers only /livez and /readyz without its token: the demo makes one for this run, given to
# the gateway through the environment as a Secret would be (server.admin_token: "${GATEWAY_ADMIN_TOKEN}").
export GATEWAY_ADMIN_TOKEN="${GATEWAY_ADMIN_TOKEN:-$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(16))')}"
# For the demo only, so that both bridges can be seen end to end: a legacy client (User-Agent legacy-demo/...)
# exempted onto the "full" phase with the card backfill bridge (the sandbox plays the service's own withdrawal), and
# a legacy uploader (its own token, "legacy-uploader": a security behaviour is exempted by token only) whose refused
# uploads the upload upgrade bridge performs on the restricted routes. The usage ledger in the demo's own directory
# (unless the config names one): the demo leaves nothing behind.
.venv/bin/python - "$work/gateway.yaml" <<'PY'
import hashlib, sys, yaml
path = sys.argv[1]
data = yaml.safe_load(open(path))
data.setdefault("server", {})["admin_token"] = "${GATEWAY_ADMIN_TOKEN}"
rollout = data.setdefault("rollout", {})
uploader = hashlib.sha256(b"Bearer legacy-uploader").hexdigest()[:12]
rollout["exemptions"] = [*(rollout.get("exemptions") or []), {
    "name": "demo-legacy-client", "phase": "full", "until": "2099-01-01",
    "header": {"name": "User-Agent", "prefix": "legacy-demo/"}, "bridge": True}, {
    "name": "demo-legacy-uploader", "behaviour": "legacy_uploads", "phase": "forbidden", "until": "2099-01-01",
    "token_fingerprint": uploader, "bridge": True}]
ledger = data.setdefault("usage", {}).setdefault("ledger", {})
ledger.setdefault("url", f"sqlite:///{path.rpartition('/')[0]}/usage.sqlite3")
ledger.setdefault("flush_interval", 1)  # the demo's usage command shows its own requests a second later
yaml.safe_dump(data, open(path, "w"), sort_keys=False)
PY
.venv/bin/gateway check-config "$work/gateway.yaml" >/dev/null

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The sandbox plays the service's own withdrawal of cards from the board route (spec, "Limits" 2-3).
.venv/bin/python -m sandbox --host 127.0.0.1 --port "$sandbox_port" --token sandbox-token --token legacy-uploader \
  --cards-cap-from 2026-10-01 \
  --cards-removal-from 2026-11-01 > >(tee "$work/sandbox.log" | sed -u 's/^/[sandbox] /' >&2) 2>&1 &
pids+=($!)
.venv/bin/gateway serve --config "$work/gateway.yaml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin_port" \
  > >(tee "$work/gateway.log" | sed -u 's/^/[gateway] /') 2>&1 &
pids+=($!)

ready() {
  .venv/bin/python - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1)
PY
}
fail() {
  echo >&2
  echo "demo: $1 did not become ready; the end of its log:" >&2
  tail -n 20 "$work/$2.log" >&2 || true
  exit 1
}
for name in sandbox gateway; do
  if [ "$name" = sandbox ]; then url="http://127.0.0.1:$sandbox_port/_sandbox/journal"; pid="${pids[0]}";
  else url="http://127.0.0.1:$admin_port/readyz"; pid="${pids[1]}"; fi
  for _ in $(seq 1 75); do
    ready "$url" && break
    kill -0 "$pid" 2>/dev/null || fail "the $name (exited)" "$name"
    sleep 0.2
  done
  ready "$url" || fail "the $name (nothing answers $url)" "$name"
done

gw="http://127.0.0.1:$port"
sb="http://127.0.0.1:$sandbox_port"
# Each command shows one thing (its comment says what); tests/integration/test_demo.py runs every one of them.
cat <<TXT

The gateway is on $gw in front of the sandbox ($sb); admin on http://127.0.0.1:$admin_port.
Try, from the repository's root:

  T='Authorization: Bearer sandbox-token'
  # The board route without cards (the sandbox plays the service after 2026-11-01): the message names the card list
  curl -s -H "\$T" $gw/api/latest/boards/1 | grep -o '"cards_deprecation_message":"[^"]*"'
  # The replacement: the paginated card list
  curl -s -H "\$T" '$gw/api/latest/cards?board_id=1&limit=2&offset=0'; echo
  # An exempted legacy client gets its cards back: X-Gateway-Backfill
  curl -s -D - -o /dev/null -A legacy-demo/1.0 -H "\$T" $gw/api/latest/boards/1
  # A deprecated upload, forbidden for this company (created after 2026-05-21): 403, never forwarded
  curl -si -H "\$T" -X PUT -F file=@README.md $gw/api/v1/cards/1/files; echo
  # The same by the legacy uploader: performed on the restricted route (X-Gateway-Upload-Upgrade)
  curl -si -H 'Authorization: Bearer legacy-uploader' -X PUT -F file=@README.md $gw/api/v1/cards/1/files; echo
  # A company with the setting off: passes, with a Deprecation header
  curl -si -H "\$T" -H 'Host: legacy.localhost' -X PUT -F file=@README.md $gw/api/v1/cards/1/files; echo
  # A path with // and %2e%2e is normalised once, before routing: the service received /api/v1/cards/1
  curl -s -o /dev/null -H "\$T" '$gw/api/v1/cards//1/%2e%2e/1'; curl -s $sb/_sandbox/journal | grep -o '"path":"[^"]*"' | tail -n 1
  # Refused, never forwarded: an encoded '/'
  curl -si -H "\$T" '$gw/api/v1/cards/1%2Ffiles'; echo
  # One count per request
  curl -s -H "Authorization: Bearer $GATEWAY_ADMIN_TOKEN" http://127.0.0.1:$admin_port/metrics | grep '^gateway_requests_total'
  # Who still uses deprecated behaviour, client by client: read from the usage ledger (written every second here)
  GATEWAY_ADMIN_TOKEN=$GATEWAY_ADMIN_TOKEN .venv/bin/gateway usage --config $work/gateway.yaml --since 1h
  # The shipped config's phases in force per company, why, and what changes next
  .venv/bin/gateway rollout --config config/gateway.yaml --host localhost
  # The tenants, routes and chains of the shipped config
  .venv/bin/gateway check-config --config config/gateway.yaml

The status page, in a browser (the token once in the address; a cookie keeps you in):
http://127.0.0.1:$admin_port/status?token=$GATEWAY_ADMIN_TOKEN
Ctrl-C stops both.
TXT
wait -n "${pids[@]}"
