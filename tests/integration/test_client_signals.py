"""The signals a client reads from the gateway's answers, read the way a client library reads them: ``Deprecation``
as an RFC 9651 structured field (http-sf, RFC 9745), ``Sunset`` as an HTTP-date (RFC 8594), ``Link`` with aiohttp's
own parser (RFC 8288); and every ``Link`` target followed through the gateway to show it is a real URL.

The gateway runs in front of the sandbox, with its clock fixed: board cards capped (2026-10-15) and removed
(2026-11-15)."""

from __future__ import annotations

import datetime as dt
import email.utils
from typing import Any

import aiohttp
import http_sf
import pytest

from gateway.rollout import FixedClock, parse_instant
from sandbox.app import create_app
from sandbox.settings import SandboxSettings
from tests.conftest import GatewayFactory, make_config

TOKEN = "Bearer sandbox-token"
DOCS = "https://docs.example.test/deprecations/board-cards"
BOARD_ROUTE = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"]}
CAP = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
REMOVAL = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


@pytest.fixture
async def sandbox(aiohttp_server: Any) -> Any:
    return await aiohttp_server(create_app(SandboxSettings()))


async def _gateway(start_gateway: GatewayFactory, sandbox: Any, at: str, options: dict[str, Any],
                   rollout: dict[str, Any] | None = None) -> Any:
    route = {**BOARD_ROUTE, "chain": [{"board_cards": options}]}
    config = make_config(f"http://127.0.0.1:{sandbox.port}", routes=[route], rollout=rollout or {})
    return await start_gateway(config, clock=FixedClock(parse_instant(at)))


def _deprecation(value: str) -> dt.datetime:
    parsed, params = http_sf.parse(value.encode(), tltype="item")
    assert params == {}
    assert isinstance(parsed, dt.datetime), f"Deprecation is not an RFC 9651 Date: {value!r}"
    return parsed


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_capped_board_says_when_and_where_in_parsable_headers(
    sandbox: Any, start_gateway: GatewayFactory, method: str
) -> None:
    gw = await _gateway(start_gateway, sandbox, "2026-10-15T12:00:00Z", {"cap": 100, "deprecation_link": DOCS})
    async with aiohttp.ClientSession() as client:
        async with client.request(method, f"{gw.url}/api/latest/boards/1", headers={"Authorization": TOKEN}) as resp:
            assert resp.status == 200
            assert _deprecation(resp.headers["Deprecation"]) == CAP
            assert email.utils.parsedate_to_datetime(resp.headers["Sunset"]) == REMOVAL
            links = resp.links
            successor = links.get("successor-version")
            documentation = links.get("deprecation")
            assert successor is not None and documentation is not None, resp.headers.getall("Link")
            assert str(documentation["url"]) == DOCS
            assert documentation["type"] == "text/html"
            target = resp.url.join(successor["url"])
        # The successor is a URL the client can follow, with this request's board filled in: the paginated card
        # list of the same board, through the same gateway, with the same token.
        assert target.path == "/api/latest/cards" and target.query["board_id"] == "1"
        async with client.get(target, headers={"Authorization": TOKEN}) as listed:
            assert listed.status == 200
            cards = await listed.json()
    assert cards and all(card["board_id"] == 1 for card in cards)


async def test_after_the_removal_date_there_is_no_sunset_but_still_a_deprecation(
    sandbox: Any, start_gateway: GatewayFactory
) -> None:
    gw = await _gateway(start_gateway, sandbox, "2026-11-15T12:00:00Z", {"cap": 100})
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{gw.url}/api/v1/boards/1", headers={"Authorization": TOKEN}) as resp:
            assert resp.status == 200
            assert "cards" not in await resp.json()
            assert _deprecation(resp.headers["Deprecation"]) == CAP
            assert "Sunset" not in resp.headers
            assert resp.links.get("deprecation") is None  # none configured: no documentation link is made up
            successor = resp.links.get("successor-version")
            assert successor is not None
            target = resp.url.join(successor["url"])
        assert target.path == "/api/latest/cards" and target.query["board_id"] == "1"
        async with client.get(target, headers={"Authorization": TOKEN}) as listed:
            assert listed.status == 200


async def test_before_the_cap_the_dates_are_announced_ahead(sandbox: Any, start_gateway: GatewayFactory) -> None:
    gw = await _gateway(start_gateway, sandbox, "2026-09-15T12:00:00Z", {"cap": 100, "deprecation_link": DOCS})
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{gw.url}/api/latest/boards/1", headers={"Authorization": TOKEN}) as resp:
            assert resp.status == 200
            assert len((await resp.json())["cards"]) > 100
            # RFC 9745 3: a Deprecation date in the future announces it; the Sunset date lies further ahead.
            assert _deprecation(resp.headers["Deprecation"]) == CAP
            assert email.utils.parsedate_to_datetime(resp.headers["Sunset"]) == REMOVAL
            assert {"successor-version", "deprecation"} <= set(resp.links.keys())


async def test_before_the_announcement_date_no_signal_is_sent(sandbox: Any, start_gateway: GatewayFactory) -> None:
    gw = await _gateway(start_gateway, sandbox, "2026-09-15T12:00:00Z", {"cap": 100, "deprecation_link": DOCS},
                        rollout={"board_cards_announcement": "2026-09-20"})
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{gw.url}/api/latest/boards/1", headers={"Authorization": TOKEN}) as resp:
            assert resp.status == 200
            assert not {"Deprecation", "Sunset", "Link"} & set(resp.headers.keys())
