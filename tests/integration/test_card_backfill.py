"""The card backfill bridge of board_cards through real sockets, in front of the sandbox playing the service after
it withdrew cards itself (cap from 2026-10-01, removal from 2026-11-01; its clock and the gateway's fixed).

A client exempted with ``bridge: true`` keeps the phase it was given (all cards, or the first 100) although the
service sends none: the gateway rebuilds ``cards`` from the paginated card list with the client's own token; every
other byte of the board is the service's. Everything else sees the spec's behaviour unchanged."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from gateway.core.http import token_fingerprint
from gateway.policies.board_cards.json_splice import scan
from gateway.rollout import FixedClock, parse_instant
from sandbox.app import create_app
from sandbox.settings import SandboxSettings
from tests.gateway_testlib import GatewayFactory, make_config

NOW = "2026-11-24T12:00:00Z"
TOKEN = "Bearer sandbox-token"  # the bridged client (the exemptions name its fingerprint)
OTHER = "Bearer sandbox-readonly"  # another client of the same company: no exemption
SIZES = (0, 1, 100, 101, 10_000)  # extra boards 4..8; board 1 has 250 cards, board 2 none
MESSAGE = "cards_deprecation_message"
BOARD_ROUTE = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}",
                                                                      "/spaces/{space_id}/boards/{board_id}"]}


@pytest.fixture
async def sandbox(aiohttp_server: Any) -> Any:
    settings = SandboxSettings(
        extra_boards=SIZES, gzip_boards=True, now=datetime(2026, 11, 24, 12, tzinfo=UTC),
        cards_cap_from=datetime(2026, 10, 1, tzinfo=UTC), cards_removal_from=datetime(2026, 11, 1, tzinfo=UTC),
        public_base_url="http://files.test",
    )
    return await aiohttp_server(create_app(settings))


def _config(url: str, *, phase: str = "full", bridge: bool | None = True, tenant_bridge: bool = False,
            options: dict[str, Any] | None = None, tenant_rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    exemption: dict[str, Any] = {"name": "old-mobile", "phase": phase, "until": "2027-01-01",
                                 "token_fingerprint": token_fingerprint(TOKEN)}
    if bridge is not None:
        exemption["bridge"] = bridge
    route = {**BOARD_ROUTE, "chain": [{"board_cards": options or {}}]}
    config = make_config(url, routes=[route], rollout={"exemptions": [exemption]})
    config["tenants"][0]["bridges"] = {"card_backfill": tenant_bridge}
    if tenant_rollout is not None:
        config["tenants"][0]["rollout"] = tenant_rollout
    return config


async def _start(start_gateway: GatewayFactory, sandbox: Any, **kw: Any) -> Any:
    return await start_gateway(_config(f"http://127.0.0.1:{sandbox.port}", **kw), clock=FixedClock(parse_instant(NOW)))


async def _get(url: str, auth: str = TOKEN, method: str = "GET", **headers: str) -> tuple[int, Any, bytes]:
    async with aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding",)) as client:
        async with client.request(method, url, headers={"Authorization": auth, **headers}) as resp:
            return resp.status, resp.headers, await resp.read()


async def _list(sandbox: Any, board: int) -> list[bytes]:
    """The card list's cards, as raw JSON of each, read directly from the sandbox."""
    out: list[bytes] = []
    async with aiohttp.ClientSession() as client:
        while True:
            url = f"http://127.0.0.1:{sandbox.port}/api/latest/cards?board_id={board}&limit=100&offset={len(out)}"
            async with client.get(url, headers={"Authorization": TOKEN}) as resp:
                page = await resp.json()
            out += [json.dumps(card).encode() for card in page]
            if len(page) < 100:
                return out


def _members(body: bytes) -> dict[str, bytes]:
    layout = scan(body, "cards")
    return {m.key: body[m.value_start : m.end] for m in layout.members}


@pytest.mark.parametrize("board", [1, 2, 4, 5, 6, 7, 8])
async def test_a_bridged_client_gets_every_card_and_the_boards_other_bytes(
    sandbox: Any, start_gateway: GatewayFactory, board: int
) -> None:
    gw = await _start(start_gateway, sandbox)
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/{board}")
    _, _, upstream = await _get(f"http://127.0.0.1:{sandbox.port}/api/latest/boards/{board}")
    assert status == 200
    expected_cards = await _list(sandbox, board)
    doc = json.loads(body)
    assert [json.dumps(c).encode() for c in doc["cards"]] == expected_cards
    assert MESSAGE not in doc  # the client sees the board as before the withdrawal
    # Every other member is the service's, byte for byte, in the service's order (cards where the message was).
    mine, theirs = _members(body), _members(upstream)
    assert "cards" not in theirs and MESSAGE in theirs
    assert {k: v for k, v in mine.items() if k != "cards"} == {k: v for k, v in theirs.items() if k != MESSAGE}
    assert list(mine) == [k if k != MESSAGE else "cards" for k in theirs]
    assert headers[("X-Gateway-Backfill")] == f"done; cards={len(expected_cards)}; pages={headers['X-Gateway-Backfill'].split('pages=')[1]}"
    assert re.fullmatch(r'W/"bf-[0-9a-f]{20}"', headers["ETag"])
    assert headers["Deprecation"].startswith("@") and "successor-version" in headers["Link"]
    assert "Authorization" in ", ".join(headers.getall("Vary"))


async def test_another_client_of_the_company_gets_the_spec_behaviour(sandbox: Any,
                                                                     start_gateway: GatewayFactory) -> None:
    gw = await _start(start_gateway, sandbox)
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/1", auth=OTHER)
    _, _, upstream = await _get(f"http://127.0.0.1:{sandbox.port}/api/latest/boards/1", auth=OTHER)
    assert status == 200 and "X-Gateway-Backfill" not in headers
    assert "cards" not in json.loads(body) and body == upstream


async def test_a_bridged_client_in_the_capped_phase_gets_the_first_100_and_the_message(
    sandbox: Any, start_gateway: GatewayFactory
) -> None:
    gw = await _start(start_gateway, sandbox, phase="capped")
    for board, total in ((1, 250), (7, 101), (6, 100), (5, 1)):
        status, headers, body = await _get(f"{gw.url}/api/latest/boards/{board}")
        doc = json.loads(body)
        cards = await _list(sandbox, board)
        assert [json.dumps(c).encode() for c in doc["cards"]] == cards[:100]
        if total > 100:
            assert "the first 100 cards" in doc[MESSAGE] and f"board_id={board}&limit=100&offset=100" in doc[MESSAGE]
            assert list(doc)[-2:] == ["cards", MESSAGE]
        else:
            assert MESSAGE not in doc
        assert headers["X-Gateway-Backfill"].startswith(f"done; cards={min(total, 100)};")


async def test_gzip_head_and_the_gateways_own_validator(sandbox: Any, start_gateway: GatewayFactory) -> None:
    # (Not kept for the next reader: the card inserted below must show at once.)
    gw = await _start(start_gateway, sandbox, options={"backfill": {"share_seconds": 0}})
    url = f"{gw.url}/api/latest/boards/1"
    _, plain_headers, plain = await _get(url)
    status, headers, zipped = await _get(url, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == plain
    status, head_headers, nothing = await _get(url, method="HEAD")
    assert status == 200 and nothing == b""
    assert head_headers["Content-Length"] == str(len(plain)) and head_headers["ETag"] == plain_headers["ETag"]
    status, headers, body = await _get(url, **{"If-None-Match": plain_headers["ETag"]})
    assert status == 304 and body == b"" and headers["ETag"] == plain_headers["ETag"]
    # The ETag follows the content: a card inserted in the list changes it.
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://127.0.0.1:{sandbox.port}/_sandbox/boards/1/cards",
                               json={"position": "end", "count": 1}) as resp:
            assert resp.status == 201
    status, headers, body = await _get(url, **{"If-None-Match": plain_headers["ETag"]})
    assert status == 200 and len(json.loads(body)["cards"]) == 251 and headers["ETag"] != plain_headers["ETag"]


@pytest.mark.parametrize(("fault", "reason"), [({"status": 500, "query": {"offset": "99"}}, "page_error"),
                                               ({"status": 403}, "forbidden"), ({"status": 401}, "forbidden")])
async def test_a_failed_backfill_answers_the_upstreams_board_unchanged(
    sandbox: Any, start_gateway: GatewayFactory, fault: dict[str, Any], reason: str
) -> None:
    gw = await _start(start_gateway, sandbox)
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://127.0.0.1:{sandbox.port}/_sandbox/faults",
                               json={"method": "GET", "path": "/api/latest/cards", "times": 5, **fault}) as resp:
            assert resp.status in (200, 201)
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/1")
    _, up_headers, upstream = await _get(f"http://127.0.0.1:{sandbox.port}/api/latest/boards/1")
    assert status == 200 and body == upstream  # never a partial array presented as whole
    assert headers["X-Gateway-Backfill"] == f"failed; reason={reason}"
    assert gw.metrics.registry.get_sample_value(
        "gateway_board_backfills_total", {"tenant": "acme", "outcome": reason}) == 1
    assert gw.metrics.registry.get_sample_value(
        "gateway_board_responses_total", {"tenant": "acme", "phase": "full", "action": "backfill_failed"}) == 1


async def test_the_tenant_setting_applies_to_every_client_whose_phase_shows_cards(
    sandbox: Any, start_gateway: GatewayFactory
) -> None:
    # The company's own removal date is later than the service's: the gateway's phase is "capped" for every client,
    # and the tenant's bridge refills what the service no longer sends. The exempted client has bridge: false.
    gw = await _start(start_gateway, sandbox, phase="capped", bridge=False, tenant_bridge=True,
                      tenant_rollout={"board_cards_removal": "2027-03-01"})
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/1", auth=OTHER)
    assert status == 200 and len(json.loads(body)["cards"]) == 100
    assert headers["X-Gateway-Backfill"].startswith("done; cards=100;")
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/1", auth=TOKEN)
    assert "X-Gateway-Backfill" not in headers and "cards" not in json.loads(body)


async def test_no_bridge_no_page_request(sandbox: Any, start_gateway: GatewayFactory) -> None:
    gw = await _start(start_gateway, sandbox, bridge=None)  # the exemption keeps "full", but no bridge
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/1")
    assert status == 200 and "X-Gateway-Backfill" not in headers and "cards" not in json.loads(body)
    assert [e["path"] for e in await _journal(sandbox)] == ["/api/latest/boards/1"]  # no page was asked for


async def _journal(sandbox: Any) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{sandbox.port}/_sandbox/journal") as resp:
            assert resp.status == 200
            entries: list[dict[str, Any]] = await resp.json()
            return entries


@pytest.mark.parametrize(("options", "reason"), [({"max_pages": 2, "page_size": 50}, "too_many_pages"),
                                                 ({"max_cards": 200}, "too_many_cards"),
                                                 ({"max_bytes": 10_000}, "too_large")])
async def test_bounds_fail_the_backfill_cleanly(sandbox: Any, start_gateway: GatewayFactory, options: dict[str, Any],
                                                reason: str) -> None:
    gw = await _start(start_gateway, sandbox, options={"backfill": options})
    status, headers, body = await _get(f"{gw.url}/api/latest/boards/1")
    assert status == 200 and headers["X-Gateway-Backfill"] == f"failed; reason={reason}"
    assert "cards" not in json.loads(body)


async def test_the_access_log_and_the_usage_report_show_the_bridge(sandbox: Any, start_gateway: GatewayFactory) -> None:
    from tests.gateway_testlib import LineCollector

    lines = LineCollector()
    config = _config(f"http://127.0.0.1:{sandbox.port}")
    config["access_log"] = {"enabled": True}
    gw = await start_gateway(config, clock=FixedClock(parse_instant(NOW)), access_log=lines)
    await _get(f"{gw.url}/api/latest/boards/1")
    (record,) = [json.loads(line) for line in lines.lines]
    assert record["decisions"]["board_cards"] == "full(exemption):backfilled"
    assert record["notes"]["board_cards.backfill"].startswith("done cards=250 pages=")
    assert hashlib.sha256(TOKEN.encode()).hexdigest()[:12] == record["client"]
