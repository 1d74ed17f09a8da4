"""The signals a client reads from the gateway's answers, read the way a client library reads them: ``Deprecation``
as an RFC 9651 structured field (http-sf, RFC 9745), ``Sunset`` as an HTTP-date (RFC 8594), ``Link`` with aiohttp's
own parser (RFC 8288); and every ``Link`` target followed through the gateway to show it is a real URL.

The gateway runs in front of the sandbox, with its clock fixed: board cards capped (2026-10-15) and removed
(2026-11-15); legacy uploads forbidden (the company was created after 2026-05-21), one client bridged."""

from __future__ import annotations

import datetime as dt
import email.utils
from typing import Any

import aiohttp
import http_sf
import pytest
from yarl import URL

from gateway.core.http import token_fingerprint
from gateway.rollout import FixedClock, parse_instant
from sandbox.app import create_app
from sandbox.settings import SandboxSettings
from tests.gateway_testlib import GatewayFactory, guarded_routes, make_config

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


def _url(value: str | URL) -> URL:
    """A Link's target, as aiohttp's ``links`` gives it (a URL; the type says str or URL)."""
    assert isinstance(value, URL)
    return value


def _deprecation(value: str) -> dt.datetime:
    item = http_sf.parse(value.encode(), tltype="item")
    assert isinstance(item, tuple), f"Deprecation is not an item with parameters: {value!r}"
    parsed, params = item
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
            target = resp.url.join(_url(successor["url"]))
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
            # None configured: no documentation link is made up. The one deprecation link is the client's own view
            # of its usage (issue 36: on every answer to a deprecated call of a client with a token).
            assert [str(link["url"]) for link in resp.links.getall("deprecation")] == [
                f"{gw.url}/_gateway/deprecations"]
            successor = resp.links.get("successor-version")
            assert successor is not None
            target = resp.url.join(_url(successor["url"]))
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


# --- The legacy upload guard: a blocked upload, and one the upload upgrade bridge performs -------------------------

GUIDE = "https://docs.example.test/migrate-uploads"
SINCE = dt.datetime(2026, 5, 21, tzinfo=dt.UTC)  # the spec's date: restricted access by default
READONLY = "Bearer sandbox-readonly"  # a client of the same company without the bridge


def _upload(name: str, content: bytes) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("file", content, filename=name, content_type="text/plain")
    return form


@pytest.fixture
async def guarded(sandbox: Any, start_gateway: GatewayFactory) -> Any:
    """The shipped successors (the restricted routes' {card_uid}), a migration guide, and the bridge for TOKEN."""
    routes = guarded_routes(deprecation_link=GUIDE)
    for route in routes:
        for policy in route.get("chain", ()):
            guard = policy["legacy_upload_guard"]
            guard["successor"] = guard["successor"].replace("{card_id}", "{card_uid}")
    exemption = {"name": "bridged", "behaviour": "legacy_uploads", "phase": "forbidden", "until": "2027-01-01",
                 "token_fingerprint": token_fingerprint(TOKEN), "bridge": True}
    config = make_config(f"http://127.0.0.1:{sandbox.port}", routes=routes, rollout={"exemptions": [exemption]})
    return await start_gateway(config, clock=FixedClock(parse_instant("2026-11-24T12:00:00Z")))


async def test_a_blocked_upload_links_to_the_guide_and_to_no_url_it_cannot_fill(guarded: Any) -> None:
    async with aiohttp.ClientSession() as client:
        async with client.put(f"{guarded.url}/api/v1/cards/1/files", data=_upload("a.txt", b"a"),
                              headers={"Authorization": READONLY}) as resp:
            assert resp.status == 403
            answer = await resp.json()
            assert _deprecation(resp.headers["Deprecation"]) == SINCE
            assert str(resp.links["deprecation"]["url"]) == GUIDE
            # The replacement needs the card's uid, which a legacy request does not carry: named, not linked.
            assert "successor-version" not in resp.links
    assert answer["replacement"] == "POST /api/v1/cards/{card_uid}/files"


async def test_an_upgraded_upload_links_to_the_cards_real_upload_route(guarded: Any) -> None:
    async with aiohttp.ClientSession() as client:
        async with client.put(f"{guarded.url}/api/v1/cards/1/files", data=_upload("a.txt", b"first"),
                              headers={"Authorization": TOKEN}) as resp:
            assert resp.status == 200
            first = await resp.json()
            assert _deprecation(resp.headers["Deprecation"]) == SINCE
            assert str(resp.links["deprecation"]["url"]) == GUIDE
            successor = resp.url.join(_url(resp.links["successor-version"]["url"]))
        assert successor.path == f"/api/v1/cards/{first['card_uid']}/files"
        # Followed with the spec's method, the link is the restricted upload of the same card.
        async with client.post(successor, data=_upload("b.txt", b"second"), headers={"Authorization": TOKEN}) as resp:
            assert resp.status in (200, 201), await resp.text()
            second = await resp.json()
    assert second["card_uid"] == first["card_uid"] and second["name"] == "b.txt"


async def test_a_body_override_onto_a_bridged_route_is_blocked_not_translated(guarded: Any) -> None:
    """The edge reads ``_method=PATCH`` and keeps watching the rest of the body, so the bridge does not take the
    request over: the bridged client gets the 403 and nothing is created."""
    form = aiohttp.FormData()
    form.add_field("_method", "PATCH")
    form.add_field("text", "edited")
    form.add_field("files[]", b"x" * 1000, filename="x.txt", content_type="text/plain")
    async with aiohttp.ClientSession() as client:
        async with client.post(f"{guarded.url}/api/v1/cards/1/comments/1", data=form,
                               headers={"Authorization": TOKEN}) as resp:
            assert resp.status == 403
            assert (await resp.json())["code"] == "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
            assert "X-Gateway-Upload-Upgrade" not in resp.headers
