"""The card backfill's page reader (``board_cards.backfill.fetch_cards``) through real sockets, against the sandbox:
boards of several sizes and page sizes, pages that shift while they are read, failing pages, a token without access,
and every bound. The policy around it (when it applies, how the board is answered) is tested in test_board_cards."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from gateway.core.chain import fold
from gateway.core.exchange import Exchange, Next, Reply
from gateway.policies.board_cards.backfill import BackfillFailed, BackfillOptions, fetch_cards
from sandbox.app import create_app
from sandbox.settings import SandboxSettings
from tests.gateway_testlib import GatewayFactory, make_config

TOKEN = {"Authorization": "Bearer sandbox-token"}
SIZES = (0, 1, 100, 101, 250, 10_000)  # boards 4.. in the sandbox (board 1 has 250 of its own)


@pytest.fixture
async def sandbox(aiohttp_server: Any) -> Any:
    return await aiohttp_server(create_app(SandboxSettings(extra_boards=SIZES)))


async def _through(gw: Any, options: BackfillOptions, want: int | None = None,
                   between: Any = None) -> tuple[int, dict[str, Any]]:
    """Runs fetch_cards for /x/{board} behind a real gateway; answers its result as JSON."""

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        board = exchange.path.rsplit("/", 1)[1]
        try:
            filled = await fetch_cards(exchange, board, want, options)
        except BackfillFailed as failed:
            return Reply.json(200, {"failed": failed.reason, "detail": failed.detail})
        return Reply.json(200, {"ids": [json.loads(raw)["id"] for raw in filled.cards], "pages": filled.pages,
                                "raw_ok": all(raw.startswith(b"{") and raw.endswith(b"}") for raw in filled.cards)})

    gw.gateway.state.handlers["catch_all"] = fold([bridge], gw.gateway.proxy)
    return gw


async def _get(gw: Any, board: int, headers: dict[str, str] = TOKEN) -> dict[str, Any]:
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/x/{board}", headers=headers) as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
        return result


async def _list(sandbox: Any, board: int) -> list[int]:
    async with aiohttp.ClientSession() as client:
        ids: list[int] = []
        while True:
            url = f"http://127.0.0.1:{sandbox.port}/api/latest/cards?board_id={board}&limit=100&offset={len(ids)}"
            async with client.get(url, headers=TOKEN) as resp:
                page = await resp.json()
            ids += [c["id"] for c in page]
            if len(page) < 100:
                return ids


def _size(board: int) -> int:
    return 250 if board == 1 else SIZES[board - 4]


# Page sizes that divide the boards' sizes and sizes that do not (2: the smallest, one new card a page; not on the
# 10,000-card board, 10,000 pages).
@pytest.mark.parametrize(("board", "page_size"), [(b, p) for b in (1, 4, 5, 6, 7, 8, 9) for p in (100, 37, 2)
                                                  if not (p == 2 and _size(b) > 300)])
async def test_every_card_in_the_lists_order(sandbox: Any, start_gateway: GatewayFactory, board: int,
                                             page_size: int) -> None:
    size = _size(board)
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    options = BackfillOptions(page_size=page_size, concurrency=3, max_pages=100_000, max_cards=100_000)
    result = await _get(await _through(gw, options), board)
    expected = await _list(sandbox, board)
    assert len(expected) == size
    assert result["ids"] == expected and result["raw_ok"]
    step = page_size - 1
    # Pages read: enough to reach the end, and at most one wave past it.
    assert -(-max(size - 1, 1) // step) <= result["pages"] <= -(-max(size - 1, 1) // step) + 3


async def test_overlap_is_what_each_page_shares_with_the_one_before(sandbox: Any, start_gateway: GatewayFactory) -> None:
    """overlap 25 of pages of 50: each page moves on 25 cards, so the 250 cards take 9 pages (overlap 1: 6)."""
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    result = await _get(await _through(gw, BackfillOptions(page_size=50, overlap=25, concurrency=1)), 1)
    assert result["ids"] == await _list(sandbox, 1)
    assert 9 <= result["pages"] <= 10


@pytest.mark.parametrize("want", [0, 1, 99, 100, 101, 250])
async def test_the_first_cards_only_when_that_is_all_the_phase_shows(sandbox: Any, start_gateway: GatewayFactory,
                                                                     want: int) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    result = await _get(await _through(gw, BackfillOptions(page_size=50, concurrency=8), want=want), 1)
    assert result["ids"] == (await _list(sandbox, 1))[:want]
    assert result["pages"] <= 1 + -(-max(want - 50, 0) // 49)  # no page beyond what the wanted cards need


@pytest.mark.parametrize("position", ["start", "end"])
async def test_pages_that_shift_by_inserts_lose_and_repeat_nothing(sandbox: Any, start_gateway: GatewayFactory,
                                                                   position: str) -> None:
    """Before every page but the first, two cards are inserted in the sandbox (in front: every later window moves
    right, so each next page repeats cards already read). Every card that was there throughout is read once, in
    order; the inserted ones appear at most once."""
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    before = await _list(sandbox, 1)
    sandbox_url = f"http://127.0.0.1:{sandbox.port}"
    inserted: list[int] = []

    async def insert(query: str) -> None:
        if "offset=0&" in query + "&":
            return
        async with aiohttp.ClientSession() as client, client.post(
                f"{sandbox_url}/_sandbox/boards/1/cards", json={"position": position, "count": 2}) as resp:
            inserted.extend((await resp.json())["ids"])

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        exchange.services = _Interleaved(gw.gateway.proxy, insert)
        filled = await fetch_cards(exchange, "1", None, BackfillOptions(page_size=50, concurrency=1))
        return Reply.json(200, {"ids": [json.loads(raw)["id"] for raw in filled.cards]})

    gw.gateway.state.handlers["catch_all"] = fold([bridge], gw.gateway.proxy)
    ids = (await _get(gw, 1))["ids"]
    assert inserted  # the list really moved while it was read
    assert len(ids) == len(set(ids))  # nothing twice
    assert [i for i in ids if i in before] == before  # every card that was there throughout, in order
    assert set(ids) - set(before) <= set(inserted)


class _Interleaved:
    """The proxy core's services, with something done before each fetch."""

    def __init__(self, services: Any, before: Any) -> None:
        self.services = services
        self.before = before

    async def fetch(self, exchange: Exchange, method: str, path: str, **kw: Any) -> Reply:
        await self.before(kw.get("query", ""))
        return await self.services.fetch(exchange, method, path, **kw)  # type: ignore[no-any-return]

    def client_body(self, exchange: Exchange, *, idle_timeout: float | None = None) -> Any:
        raise NotImplementedError


async def test_a_gap_is_detected_and_read_again_then_refused(sandbox: Any, start_gateway: GatewayFactory) -> None:
    """Cards removed in front between two reads move the window past the overlap: that is a gap."""
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    calls = 0

    # A policy between the bridge and the upstream cannot see fetches; a fake list that shifts left by 5 between
    # every two reads shows the detection instead.
    async def shifting(exchange: Exchange, next: Next) -> Reply:
        nonlocal calls
        query = dict(p.split("=") for p in exchange.query.split("&"))
        offset = int(query["offset"]) + 5 * calls
        calls += 1
        page = [{"id": i} for i in range(offset, min(offset + int(query["limit"]), 300))]
        return Reply.json(200, page)  # type: ignore[arg-type]

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        exchange.services = _Fake(shifting)
        try:
            await fetch_cards(exchange, "1", None, BackfillOptions(page_size=50, concurrency=1))
        except BackfillFailed as failed:
            return Reply.json(200, {"failed": failed.reason})
        return Reply.json(200, {"failed": None})

    gw.gateway.state.handlers["catch_all"] = fold([bridge], gw.gateway.proxy)
    result = await _get(gw, 1)
    assert result == {"failed": "inconsistent"}
    assert calls == 4  # pages 0 and 1 (link broken), then from the start again: 0 and 1, broken again


class _Fake:
    """Services whose fetch answers from a function (for list behaviours the sandbox cannot play)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def fetch(self, exchange: Exchange, method: str, path: str, *, query: str = "", headers: Any = None,
                    body: Any = None, purpose: str = "policy") -> Reply:
        saved = exchange.query
        exchange.query = query
        try:
            return await self.answer(exchange, None)  # type: ignore[no-any-return]
        finally:
            exchange.query = saved

    def client_body(self, exchange: Exchange, *, idle_timeout: float | None = None) -> Any:
        raise NotImplementedError


async def test_a_failing_page_fails_the_backfill(sandbox: Any, start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://127.0.0.1:{sandbox.port}/_sandbox/faults", json={
                "method": "GET", "path": "/api/latest/cards", "query": {"offset": "99"}, "status": 500,
                "times": 1}) as resp:
            assert resp.status in (200, 201)
    result = await _get(await _through(gw, BackfillOptions(concurrency=2)), 1)
    assert result["failed"] == "page_error" and "offset 99" in result["detail"] and "500" in result["detail"]


@pytest.mark.parametrize(("headers", "board"), [({"Authorization": "Bearer nope"}, 1), ({}, 1), (TOKEN, 3)],
                         ids=["bad-token", "no-token", "private-board"])
async def test_a_token_without_access_gets_no_cards(sandbox: Any, start_gateway: GatewayFactory,
                                                    headers: dict[str, str], board: int) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    result = await _get(await _through(gw, BackfillOptions()), board, headers)
    assert result["failed"] == "forbidden" and "ids" not in result


async def test_the_clients_token_is_the_only_credential_sent(upstream: Any, start_gateway: GatewayFactory) -> None:
    upstream_responder = upstream.responder

    async def empty_list(request: Any, received: Any) -> Any:
        from aiohttp import web
        return web.json_response([])

    upstream.responder = empty_list
    gw = await start_gateway(make_config(upstream.url))
    await _get(await _through(gw, BackfillOptions()), 1, {"Authorization": "Bearer client-own", "Cookie": "c=1"})
    (received,) = upstream.received
    assert received.headers_all("Authorization") == ["Bearer client-own"]
    assert received.headers_all("Cookie") == []
    assert received.raw_path == "/api/latest/cards?board_id=1&limit=100&offset=0"
    upstream.responder = upstream_responder


async def test_the_board_id_is_one_query_value(upstream: Any, start_gateway: GatewayFactory) -> None:
    """A path segment may hold '&' and '=': in the page request they stay inside board_id (a second limit would cut
    every page short, and the list would look whole)."""

    async def empty_list(request: Any, received: Any) -> Any:
        from aiohttp import web
        return web.json_response([])

    upstream.responder = empty_list
    gw = await _through(await start_gateway(make_config(upstream.url)), BackfillOptions())
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/x/1&limit=1", headers=TOKEN) as resp:
        assert resp.status == 200
    (received,) = upstream.received
    assert received.raw_path == "/api/latest/cards?board_id=1%26limit%3D1&limit=100&offset=0"


@pytest.mark.parametrize(("options", "reason"), [
    (BackfillOptions(page_size=50, max_pages=3), "too_many_pages"),
    (BackfillOptions(page_size=50, max_cards=120), "too_many_cards"),
    (BackfillOptions(page_size=100, max_bytes=20_000), "too_large"),
])
async def test_each_bound_fails_the_backfill(sandbox: Any, start_gateway: GatewayFactory, options: BackfillOptions,
                                            reason: str) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    result = await _get(await _through(gw, options), 1)
    assert result["failed"] == reason


async def test_the_time_bound_fails_the_backfill(sandbox: Any, start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{sandbox.port}"))
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://127.0.0.1:{sandbox.port}/_sandbox/faults", json={
                "method": "GET", "path": "/api/latest/cards", "delay": 2.0, "times": 10}) as resp:
            assert resp.status in (200, 201)
    started = asyncio.get_running_loop().time()
    result = await _get(await _through(gw, BackfillOptions(timeout=0.3)), 1)
    assert result["failed"] == "timeout"
    assert asyncio.get_running_loop().time() - started < 1.5


# Ids that are not numbers or strings: unhashable ones (which once ended the request in a 500), and ones that would
# make different cards look like one (two nulls: one card kept, the list presented as whole).
@pytest.mark.parametrize("page", [b'{"not": "a list"}', b"[1, 2]", b'[{"title": "no id"}]', b"[{]", b"<html>",
                                  b'[{"id": [1]}]', b'[{"id": {"n": 1}}]', b'[{"id": null}, {"id": null}]',
                                  b'[{"id": true}, {"id": 1}]'])
async def test_a_page_that_is_not_a_list_of_cards_fails_the_backfill(upstream: Any, start_gateway: GatewayFactory,
                                                                     page: bytes) -> None:
    async def answer(request: Any, received: Any) -> Any:
        from aiohttp import web
        return web.Response(body=page, content_type="application/json")

    upstream.responder = answer
    gw = await start_gateway(make_config(upstream.url))
    result = await _get(await _through(gw, BackfillOptions()), 1)
    assert result["failed"] == "not_json"
