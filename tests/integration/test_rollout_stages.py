"""The staged rollout through real sockets: a shadow window leaves traffic untouched and records what the next phase
would have done (a legacy upload byte for byte upstream and `would_block` in the ledger, the metrics and the access
log; a board untouched and `would_cap`); a ramp's clients are the same on two gateway processes and after a restart;
a preview gives a client the later phase it asks for and says so; the request's one decision in the access log."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.ops.ledger import Query, window
from gateway.rollout import FixedClock, parse_instant
from tests.board_fixtures import board_bytes
from tests.gateway_testlib import (
    GatewayFactory, LineCollector, RecordingUpstream, Received, guarded_routes, make_config, multipart_body,
)
from tests.process_testlib import start

BOUNDARY = "stages-boundary"
SHADOW = {"behaviour": "legacy_uploads", "start": "2026-12-01T00:00:00Z", "end": "2026-12-15T00:00:00Z"}
STAGED = {"name": "staged", "hosts": ["staged.test"], "upstream": "", "created": "2025-01-01",
          "restricted_file_access": True, "forbid_legacy_uploads": False,
          "rollout": {"forbid_legacy_uploads": "2027-01-01"}}
BOARD_ROUTE = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"], "chain": [{"board_cards": {}}]}


def _upload_config(upstream: RecordingUpstream, rollout: dict[str, Any]) -> dict[str, Any]:
    config = make_config(upstream.url, routes=guarded_routes(), rollout=rollout)
    config["tenants"].append({**STAGED, "upstream": upstream.url})
    return config


def _upload() -> tuple[bytes, dict[str, str]]:
    body = multipart_body([(['Content-Disposition: form-data; name="file"; filename="a.txt"',
                             "Content-Type: text/plain"], b"x" * 5000)], BOUNDARY)
    return body, {"Host": "staged.test", "Authorization": "Bearer uploader",
                  "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


async def _ledger_decisions(gw: Any, behaviour: str) -> dict[str, int]:
    ledger = gw.gateway.ledger
    await ledger.flush()
    now = time.time()
    report = await ledger.report(Query(*window(now - 86400 * 400, now + 86400 * 400), behaviour=behaviour))
    return dict(report["behaviours"][behaviour]["by_decision"])


async def test_a_legacy_upload_in_a_shadow_window_reaches_the_upstream_and_is_recorded_as_would_block(
        upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    sink = LineCollector()
    config = _upload_config(upstream, {"shadows": [SHADOW]})
    config["access_log"] = {"enabled": True}
    inside = await start_gateway(config, clock=FixedClock(parse_instant("2026-12-05T00:00:00Z")), access_log=sink)
    body, headers = _upload()
    async with aiohttp.ClientSession() as client:
        async with client.put(inside.url + "/api/v1/cards/7/files", data=body, headers=headers) as resp:
            assert resp.status == 200  # the upstream's answer: traffic untouched
            assert resp.headers["Deprecation"].startswith("@")
    (received,) = upstream.received
    assert (received.method, received.body_size, received.body_sha256, received.body_complete) == (
        "PUT", len(body), hashlib.sha256(body).hexdigest(), True)
    labels = {"tenant": "staged", "route": "legacy_card_file_upload", "decision": "would_block"}
    assert inside.metrics.registry.get_sample_value("gateway_legacy_uploads_total", labels) == 1
    (line,) = [json.loads(line) for line in sink.lines]
    assert line["decisions"] == {"legacy_upload_guard": "would_block"}
    assert await _ledger_decisions(inside, "legacy_uploads") == {"would_block": 1}
    # After the window, at the phase's own date: refused, and nothing reaches the upstream.
    after = await start_gateway(_upload_config(upstream, {"shadows": [SHADOW]}),
                                clock=FixedClock(parse_instant("2027-01-02T00:00:00Z")))
    async with aiohttp.ClientSession() as client:
        async with client.put(after.url + "/api/v1/cards/7/files", data=body, headers=headers) as resp:
            assert resp.status == 403 and (await resp.json())["code"] == "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
    assert len(upstream.received) == 1


async def test_a_board_in_a_shadow_window_goes_as_it_came_and_is_recorded_as_would_cap(
        upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    board = board_bytes(150)

    async def respond(request: Any, received: Received) -> Any:
        from aiohttp import web
        return web.Response(body=board, content_type="application/json")

    upstream.responder = respond
    shadow = {"behaviour": "board_cards", "start": "2026-09-01T00:00:00Z", "end": "2026-09-30T00:00:00Z"}
    gw = await start_gateway(make_config(upstream.url, routes=[BOARD_ROUTE], rollout={"shadows": [shadow]}),
                             clock=FixedClock(parse_instant("2026-09-10T00:00:00Z")))
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/api/v1/boards/1", headers={"Authorization": "Bearer reader"}) as resp:
            assert resp.status == 200 and await resp.read() == board  # every card, the upstream's bytes
    labels = {"tenant": "acme", "phase": "full", "action": "would_cap"}
    assert gw.metrics.registry.get_sample_value("gateway_board_responses_total", labels) == 1
    assert await _ledger_decisions(gw, "board_cards") == {"full:would_cap": 1}
    # A board the cap would not touch is recorded as untouched, not as would_cap.
    board = board_bytes(20)
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/api/v1/boards/2", headers={"Authorization": "Bearer reader"}) as resp:
            assert await resp.read() == board
    assert (await _ledger_decisions(gw, "board_cards")).get("full:untouched") == 1


async def test_a_preview_gives_the_later_phase_and_says_so(upstream: RecordingUpstream,
                                                          start_gateway: GatewayFactory) -> None:
    async def respond(request: Any, received: Received) -> Any:
        from aiohttp import web
        return web.Response(body=board_bytes(150), content_type="application/json")

    upstream.responder = respond
    sink = LineCollector()
    config = make_config(upstream.url, routes=[BOARD_ROUTE], rollout={"preview": {"enabled": True}})
    config["access_log"] = {"enabled": True}
    gw = await start_gateway(config, clock=FixedClock(parse_instant("2026-09-10T00:00:00Z")), access_log=sink)
    async with aiohttp.ClientSession() as client:
        headers = {"Authorization": "Bearer tester", "Gateway-Preview": "board_cards"}
        async with client.get(gw.url + "/api/v1/boards/1", headers=headers) as resp:
            board = json.loads(await resp.read())
            assert "cards" not in board and "no longer returned" in board["cards_deprecation_message"]
            assert resp.headers["Gateway-Preview"] == "board_cards=removed"
            assert "Gateway-Preview" in resp.headers["Vary"]
        async with client.get(gw.url + "/api/v1/boards/1", headers={"Authorization": "Bearer other"}) as resp:
            assert len(json.loads(await resp.read())["cards"]) == 150  # no preview asked: the full phase
            assert "Gateway-Preview" not in resp.headers and "Gateway-Preview" in resp.headers["Vary"]
    first, second = (json.loads(line) for line in sink.lines)
    assert first["decisions"] == {"board_cards": "removed(preview):removed"}
    assert second["decisions"] == {"board_cards": "full:untouched"}
    assert await _ledger_decisions(gw, "board_cards") == {"removed(preview):removed": 1, "full:untouched": 1}


def _ramp_config(upstream: str) -> dict[str, Any]:
    return {
        "tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": upstream, "created": "2026-06-01"}],
        "routes": [BOARD_ROUTE],
        "rollout": {"now": "2026-09-20T00:00:00Z", "ramp_key": "stages-test",
                    "ramps": [{"behaviour": "board_cards", "phase": "removed",
                               "steps": [{"share": 30, "from": "2026-09-01"}]}]},
    }


async def _ramped(url: str, tokens: list[str]) -> set[str]:
    """The tokens whose board came without cards."""
    out = set()
    async with aiohttp.ClientSession() as client:
        for token in tokens:
            async with client.get(url + "/api/v1/boards/1", headers={"Authorization": f"Bearer {token}"}) as resp:
                if "cards" not in json.loads(await resp.read()):
                    out.add(token)
    return out


async def test_a_ramps_clients_are_the_same_on_two_processes_and_after_a_restart(
        upstream: RecordingUpstream, tmp_path: Path) -> None:
    async def respond(request: Any, received: Received) -> Any:
        from aiohttp import web
        return web.Response(body=board_bytes(3), content_type="application/json")

    upstream.responder = respond
    tokens = [f"token-{i}" for i in range(200)]
    a = await start(_ramp_config(upstream.url), tmp_path, name="a")
    b = await start(_ramp_config(upstream.url), tmp_path, name="b")
    try:
        on_a, on_b = await asyncio.gather(_ramped(a.url, tokens), _ramped(b.url, tokens))
    finally:
        a.stop()
    try:
        again = await start(_ramp_config(upstream.url), tmp_path, name="a-again")
        try:
            after_restart = await _ramped(again.url, tokens)
        finally:
            again.stop()
    finally:
        b.stop()
    assert on_a == on_b == after_restart
    assert 40 <= len(on_a) <= 80, len(on_a)  # about 30% of 200


@pytest.mark.parametrize("at", ["2026-12-05T00:00:00Z"])
async def test_gateway_rollout_says_where_one_client_stands(at: str, tmp_path: Path) -> None:
    config = make_config("http://127.0.0.1:1", routes=guarded_routes(), rollout={"shadows": [SHADOW]})
    config["tenants"].append({**STAGED, "upstream": "http://127.0.0.1:1"})
    path = tmp_path / "gateway.yaml"
    import yaml
    path.write_text(yaml.safe_dump(config))
    fingerprint = hashlib.sha256(b"Bearer uploader").hexdigest()[:12]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "rollout", "--config", str(path), "--at", at, "--host", "staged.test",
        "--client", fingerprint, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    text = out.decode()
    assert f"client fingerprint {fingerprint} of tenant staged" in text
    assert "legacy_uploads: allowed [setting]" in text and "shadow: forbidden decided, not applied" in text
    assert dt.datetime.fromisoformat(at.replace("Z", "+00:00")).isoformat() in text
