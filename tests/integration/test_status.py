"""The status page as HTTP serves it (the browser tests in test_status_page.py drive it in Chromium): the redirect,
the headers that lock it down, escaping of what clients send, the data behind it, and that it shows nothing the
other admin endpoints do not."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from gateway.core.http import token_fingerprint
from gateway.lifecycle import Reloads
from gateway.ops.admin import make_admin_app
from gateway.ops.status import ConfigHistory
from gateway.rollout import FixedClock, parse_instant
from tests.gateway_testlib import GatewayFactory, RecordingUpstream, admin_url, guarded_routes, make_config

XSS = '<script>window.pwned=1</script>"><img src=x onerror=alert(1)>'


async def _admin(gw: Any, **kwargs: Any) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(make_admin_app(gw.gateway, **kwargs), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, admin_url(runner.addresses[0][1])


def _config(upstream: RecordingUpstream) -> dict[str, Any]:
    config = make_config(upstream.url, routes=guarded_routes())
    # Credentials in an upstream URL: /config masks them; the page must not show them at all.
    config["tenants"][1]["upstream"] = upstream.url.replace("http://", "http://svc:hunter2-secret@")
    config["tenants"][1]["restricted_file_access"] = True
    config["tenants"][1]["forbid_legacy_uploads"] = False
    config["tenants"][1]["rollout"] = {"forbid_legacy_uploads": "2027-01-15", "board_cards_removal": "2026-12-01",
                                       "brownouts": [{"start": "2026-11-10T10:00:00", "end": "2026-11-10T12:00:00"}]}
    config["rollout"] = {"exemptions": [{"name": "mobile-3x", "until": "2026-12-15", "phase": "full",
                                         "token_fingerprint": "3f9a1c0b2d4e"}]}
    return config


async def test_the_page_escapes_what_clients_send_and_is_locked_down(
        upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(_config(upstream), clock=FixedClock(parse_instant("2026-11-05T12:00:00Z")))
    runner, admin = await _admin(gw)
    try:
        async with aiohttp.ClientSession() as client:
            async with client.put(gw.url + "/api/v1/cards/1/files", data=b"x",
                                  headers={"Authorization": "Bearer very-secret-token", "User-Agent": XSS}) as resp:
                assert resp.status == 403
            async with client.get(admin + "/", allow_redirects=False) as resp:
                assert resp.status == 302 and resp.headers["Location"] == "status"
            async with client.get(admin + "/") as resp:
                assert str(resp.url).endswith("/status") and resp.status == 200
            async with client.get(admin + "/status") as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                headers = resp.headers
                page = await resp.text()
            async with client.get(admin + "/status.json") as resp:
                data = await resp.json()
                raw_json = await resp.text()
            async with client.get(admin + "/config") as resp:
                config = await resp.json()
            for path in ("/status?since=yesterday", "/status.json?until=soon"):  # the page's window: /deprecations'
                async with client.get(admin + path) as resp:
                    assert resp.status == 400 and (await resp.json())["code"] == "BAD_QUERY", path
            async with client.get(admin + "/status.json?since=2h&until=1h") as resp:
                assert resp.status == 200 and (await resp.json())["usage"]["policies"] == []  # before the request
    finally:
        await runner.cleanup()
    # The client's text is text: escaped, never markup.
    assert "<script>window.pwned" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;\"&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert data["usage"]["policies"][0]["rows"][0]["user_agent"] == XSS  # the data keeps it as it came
    # Only the page's own script runs, and it is the one in the page.
    csp = headers["Content-Security-Policy"]
    scripts = re.findall(r"<script>(.*?)</script>", page, re.DOTALL)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "no external asset"
    # Nothing the admin endpoints do not already show: no token, no credentials, fingerprints only.
    for text in (page, raw_json):
        assert "very-secret-token" not in text and "hunter2" not in text and "Bearer" not in text
    assert token_fingerprint("Bearer very-secret-token") in page
    assert data["config"]["digest"] == config["digest"] and data["config"]["digest"][:19] in page


async def test_the_data_behind_the_page(upstream: RecordingUpstream, start_gateway: GatewayFactory,
                                        tmp_path: Path) -> None:
    gw = await start_gateway(_config(upstream), clock=FixedClock(parse_instant("2026-11-05T12:00:00Z")))
    history = ConfigHistory()
    runner, admin = await _admin(gw, history=history)
    try:
        async with aiohttp.ClientSession() as client:
            for host, token in (("127.0.0.1", "a"), ("127.0.0.1", "a"), ("old.test", "b")):
                async with client.put(gw.url + "/api/v1/cards/1/files", data=b"x",
                                      headers={"Host": host, "Authorization": f"Bearer {token}"}) as resp:
                    assert resp.status in (200, 403)
            bad = tmp_path / "bad.yaml"
            bad.write_text(yaml.safe_dump({"tenants": [{"name": "x"}]}))
            await Reloads(gw.gateway, str(bad), history).reload()
            async with client.get(admin + "/status.json") as resp:
                data = await resp.json()
            async with client.get(admin + "/status") as resp:
                page = await resp.text()
    finally:
        await runner.cleanup()
    tenants = {t["name"]: t for t in data["tenants"]}
    acme = {b["name"]: b for b in tenants["acme"]["behaviours"]}
    oldco = {b["name"]: b for b in tenants["oldco"]["behaviours"]}
    assert (acme["board_cards"]["phase"], oldco["board_cards"]["phase"]) == ("removed", "capped")
    assert acme["legacy_uploads"]["phase"] == "forbidden" and acme["legacy_uploads"]["kind"] == "setting"
    assert oldco["legacy_uploads"]["phase"] == "allowed"
    assert oldco["legacy_uploads"]["next"]["phase"] == "forbidden"
    assert oldco["legacy_uploads"]["next"]["when"] == "2027-01-15 00:00 UTC"
    # The brownout is the next change of oldco's board cards, and it is on its timeline.
    assert oldco["board_cards"]["next"]["phase"] == "removed"
    assert oldco["board_cards"]["next"]["when"] == "2026-11-10 10:00 UTC"
    assert [b["label"] for b in oldco["board_cards"]["brownouts"]] == [
        "brownout removed: 2026-11-10 10:00 UTC to 2026-11-10 12:00 UTC"]
    assert acme["board_cards"]["brownouts"] == []  # oldco's own list replaces the global (empty) one only for it
    events = [e["text"] for e in oldco["board_cards"]["events"]]
    assert events == ["full (default)", "Deprecation and Link headers: on every board response",
                      "board_cards_cap 2026-10-01 (default): capped",
                      "brownout: removed until 2026-11-10 12:00 UTC",
                      "board_cards_removal 2026-12-01 (tenant override): removed",
                      "exemption 'mobile-3x' ends (token fingerprint 3f9a1c0b2d4e kept at most full)"]
    assert [e["state"] for e in oldco["board_cards"]["events"]] == ["past", "past", "now", "ahead", "ahead", "ahead"]
    segments = oldco["board_cards"]["segments"]
    assert [s["phase"] for s in segments] == ["full", "capped", "removed"]
    assert segments[0]["from_pct"] == 0 and segments[-1]["to_pct"] == 100
    assert segments[0]["to_pct"] < data["timeline"]["now_pct"] < segments[1]["to_pct"]
    # Per company figures from the usage ledger, per behaviour, and the clients, most recently seen first.
    assert tenants["acme"]["usage"] == [{"behaviour": "legacy_uploads", "decisions": [["blocked", 2]]}]
    assert tenants["oldco"]["usage"] == [{"behaviour": "legacy_uploads", "decisions": [["allowed", 1]]}]
    policy = data["usage"]["policies"][0]
    assert policy["name"] == "legacy_uploads" and policy["requests"] == 3 and policy["clients"] == 2
    assert [(r["client"], r["tenant"], r["requests"], r["stopped"]) for r in policy["rows"]] == [
        (token_fingerprint("Bearer b"), "oldco", 1, False), (token_fingerprint("Bearer a"), "acme", 2, False)]
    assert data["usage"]["window"].startswith("since ") and data["usage"]["problem"] is None
    # Requests per day, on the timeline's axis (recorded at the real time, whatever the rollout clock says).
    chart = acme["legacy_uploads"]["chart"]
    assert chart["unit"] == "day" and chart["total"] == 2 and chart["peak"] == 2
    assert [b["requests"] for b in chart["bars"]] == [2] and 0 < chart["bars"][0]["from_pct"] < 100
    assert oldco["legacy_uploads"]["chart"]["total"] == 1 and acme["board_cards"]["chart"] is None
    # The configuration and the reload.
    assert data["now"] == {"iso": "2026-11-05T12:00:00+00:00", "label": "2026-11-05 12:00 UTC", "fixed": True}
    assert data["config"]["last_reload"]["result"] == "failure" and data["config"]["last_reload"]["problems"] >= 1
    assert data["config"]["reloads"] == {"success": 0, "failure": 1}
    assert "refused" in page and "problem(s), listed in the gateway's log" in page
    assert data["build"]["version"] and data["ledger"]["state"] == "ok" and data["ledger"]["database"] == "sqlite://"
