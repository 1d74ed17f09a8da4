"""The body phases through real sockets: headers the chain adds arrive on every path (over a cap, refused, upstream
errors, HEAD, timeouts), and several body policies on one route compose in chain order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.core.chain import fold
from gateway.core.exchange import Exchange, Flow, Next, Policy, Refuse, Reply, RequestBodyFilter, ResponseBodyFilter
from gateway.rollout import FixedClock, parse_instant
from tests.board_fixtures import board_bytes
from tests.gateway_testlib import (
    CountingUpstream,
    GatewayFactory,
    Received,
    RecordingUpstream,
    Responder,
    chunked_responder,
    free_port,
    guarded_routes,
    make_config,
    multipart_body,
    parse_responses,
    raw_exchange,
)

RID = "client-chosen-id-1"
BOARD_ROUTE = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"]}
REMOVED = "2026-11-15T12:00:00Z"


def _chunked_board(body: bytes) -> Responder:
    return chunked_responder(body, 4096, {"Content-Type": "application/json", "ETag": '"b1"'})


# --- headers added by the chain arrive on every path ----------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_chunked_board_over_the_cap_keeps_every_header_the_chain_adds(
    upstream: RecordingUpstream, start_gateway: GatewayFactory, method: str
) -> None:
    body = board_bytes(200)
    assert len(body) > 4096
    upstream.responder = _chunked_board(body)
    route = {**BOARD_ROUTE, "chain": [{"board_cards": {"max_body_bytes": 4096}}]}
    gw = await start_gateway(make_config(upstream.url, routes=[route]), clock=FixedClock(parse_instant(REMOVED)))
    async with aiohttp.ClientSession() as client:
        async with client.request(method, gw.url + "/api/v1/boards/1", headers={"X-Request-Id": RID}) as resp:
            got = await resp.read()
            headers = resp.headers
    assert resp.status == 200
    assert headers["X-Request-Id"] == RID  # lost before: the policy prepared the response itself
    assert headers["Deprecation"].startswith("@") and "successor-version" in headers["Link"]
    assert got == (b"" if method == "HEAD" else body)  # over the cap: passed through whole, as it streamed


async def _answer(gw: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[
        int, dict[str, str], bytes]:  # fmt: skip
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"X-Request-Id: {RID}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    data = await raw_exchange(gw.port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body, timeout=10)
    ((status, got, payload),) = parse_responses(data)
    return status, got, payload


async def test_early_answers_of_the_guard_keep_the_request_id(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(counting_upstream.url, routes=guarded_routes()))
    # Blocked on the head alone (PUT .../files with a body), blocked on a file part, refused as ambiguous.
    status, headers, payload = await _answer(gw, "PUT", "/api/v1/cards/1/files", b"x" * 100)
    assert (status, headers["x-request-id"], json.loads(payload)["request_id"]) == (403, RID, RID)
    boundary = "b0undary"
    ct = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    file_part = (['Content-Disposition: form-data; name="files[]"; filename="a.txt"'], b"data")
    status, headers, _ = await _answer(gw, "POST", "/api/v1/cards/1/comments", multipart_body([file_part], boundary), ct)
    assert (status, headers["x-request-id"]) == (403, RID)
    bad = multipart_body([file_part], boundary).replace(b"\r\n", b"\n")
    status, headers, payload = await _answer(gw, "POST", "/api/v1/cards/1/comments", bad, ct)
    assert (status, headers["x-request-id"], json.loads(payload)["code"]) == (400, RID, "LEGACY_UPLOAD_AMBIGUOUS")
    assert counting_upstream.connections == 0


async def test_upstream_errors_and_timeouts_keep_the_request_id(start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{free_port()}"))
    status, headers, payload = await _answer(gw, "GET", "/api/v1/cards/1")
    assert (status, headers["x-request-id"], json.loads(payload)["code"]) == (502, RID, "UPSTREAM_UNAVAILABLE")
    status, headers, _ = await _answer(gw, "HEAD", "/api/v1/cards/1")
    assert (status, headers["x-request-id"]) == (502, RID)


async def test_a_stalled_body_is_answered_408_with_the_request_id(
    upstream: RecordingUpstream, start_gateway: GatewayFactory
) -> None:
    config = make_config(upstream.url, server={"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                                               "client_body_timeout": 0.3})
    gw = await start_gateway(config)
    head = (f"PUT /api/v1/x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: {RID}\r\nContent-Length: 100\r\n\r\n"
            "only part").encode()
    data = await raw_exchange(gw.port, head, timeout=5)
    ((status, headers, payload),) = parse_responses(data)
    assert (status, headers["x-request-id"], json.loads(payload)["code"]) == (408, RID, "CLIENT_BODY_TIMEOUT")


# --- several body policies compose in chain order -------------------------------------------------------------------


class _Replace(RequestBodyFilter):
    """A transform: one byte string replaced by another, in every chunk."""

    changes_length = True

    def __init__(self, old: bytes, new: bytes) -> None:
        self.old, self.new = old, new

    def on_data(self, chunk: bytes) -> bytes:
        return chunk.replace(self.old, self.new)


class _HoldAll(RequestBodyFilter):
    """Holds the whole body (up to ``hold_limit``), then lets it go at its end."""

    def __init__(self, limit: int) -> None:
        self.hold_limit = limit
        self.chunks = 0

    def on_data(self, chunk: bytes) -> Flow:
        self.chunks += 1
        return Flow.HOLD

    def on_end(self) -> Flow:
        return Flow.CONTINUE

    def on_hold_limit(self) -> Flow:
        raise Refuse(Reply.error(413, "TEST_HOLD_LIMIT", "held too much"))


class _Wrap(ResponseBodyFilter):
    """A response transform that is not idempotent under reordering: every ``old`` becomes ``new``, and a mark is
    added at the end."""

    def __init__(self, old: bytes, new: bytes, mark: bytes) -> None:
        self.old, self.new, self.mark = old, new, mark

    def on_data(self, chunk: bytes) -> bytes:
        return chunk.replace(self.old, self.new)

    def on_end(self) -> bytes:
        return self.mark


def _policy(name: str, request_filter: RequestBodyFilter | None, response_filter: ResponseBodyFilter | None) -> Policy:
    async def policy(exchange: Exchange, next: Next) -> Reply:
        if request_filter is not None:
            exchange.body.add_filter(request_filter)
        reply = await next(exchange)
        if response_filter is not None:
            reply.add_filter(response_filter)
        reply.headers.add("X-Order", name)
        return reply

    return policy


async def _route_through(gw: Any, policies: list[Policy]) -> None:
    """The catch-all route's handler, folded from ``policies`` around the gateway's own proxy core."""
    state = gw.gateway.state
    state.handlers["catch_all"] = fold(policies, gw.gateway.proxy)


def _echo(body: bytes) -> Responder:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        return web.Response(body=body, headers={"X-Upstream-Length": str(received.body_size)})

    return responder


@pytest.mark.parametrize("streamed", [False, True], ids=["arrived", "streamed"])
async def test_two_request_and_two_response_filters_compose_in_chain_order(
    upstream: RecordingUpstream, start_gateway: GatewayFactory, streamed: bool
) -> None:
    gw = await start_gateway(make_config(upstream.url))
    upstream.responder = _chunked_board(b"uv" * 5000) if streamed else _echo(b"uv" * 5)
    await _route_through(gw, [
        # Outermost: sees the request body first and the response body last.
        _policy("outer", _Replace(b"x", b"ab"), _Wrap(b"u", b"vw", b"[outer]")),
        _policy("inner", _Replace(b"a", b"c"), _Wrap(b"v", b"z", b"[inner]")),
    ])  # fmt: skip
    async with aiohttp.ClientSession() as client:
        async with client.post(gw.url + "/anything", data=b"x-x-x" * 1000) as resp:
            got = await resp.read()
            headers = resp.headers
    # Request: outer then inner ("x" -> "ab" -> "cb"); reversed it would be "x" -> "x" -> "ab".
    assert upstream.received[-1].body == (b"x-x-x" * 1000).replace(b"x", b"ab").replace(b"a", b"c")
    assert upstream.received[-1].header("Transfer-Encoding") == "chunked"  # a transform drops the client's length
    # Response: inner then outer ("uv" -> "uz" -> "vwz"); reversed it would be "uv" -> "vwv" -> "zwz".
    repeat = 5000 if streamed else 5
    assert got == b"vwz" * repeat + b"[inner][outer]"
    assert headers.getall("X-Order") == ["inner", "outer"]  # the response head unwinds innermost first
    assert headers.get("Transfer-Encoding") == "chunked" and "Content-Length" not in headers


async def test_a_holding_filter_sends_nothing_upstream_until_it_lets_go(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(counting_upstream.url))
    counting_upstream.responder = _echo(b"ok")
    hold = _HoldAll(limit=1 << 20)
    await _route_through(gw, [_policy("hold", hold, None), _policy("pass", _Replace(b"q", b"q"), None)])

    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(b"POST /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 20\r\n\r\n"
                     b"0123456789")
        await writer.drain()
        for _ in range(20):  # the first half has been read by the gateway, and held
            if hold.chunks:
                break
            await asyncio.sleep(0.05)
        assert hold.chunks == 1 and counting_upstream.connections == 0
        writer.write(b"abcdefghij")
        await writer.drain()
        ((status, headers, _),) = parse_responses(await asyncio.wait_for(reader.read(), 5))
    finally:
        writer.close()
    assert status == 200 and counting_upstream.connections == 1
    assert counting_upstream.received[-1].body == b"0123456789abcdefghij"


async def test_a_filter_over_its_hold_limit_refuses_and_nothing_reaches_the_upstream(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(counting_upstream.url))
    await _route_through(gw, [_policy("hold", _HoldAll(limit=1000), None)])
    async with aiohttp.ClientSession() as client:
        async with client.post(gw.url + "/big", data=b"z" * 100_000) as resp:
            assert resp.status == 413
            assert (await resp.json())["code"] == "TEST_HOLD_LIMIT"
            assert resp.headers["X-Order"] == "hold"  # the policy's own header, on its filter's refusal
    assert counting_upstream.connections == 0


async def test_a_response_filter_on_a_head_request_sends_no_body(
    upstream: RecordingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(upstream.url))
    upstream.responder = _echo(b"uv" * 5)
    await _route_through(gw, [_policy("outer", None, _Wrap(b"u", b"vw", b"[outer]"))])
    data = await raw_exchange(gw.port, b"HEAD /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"X-Order: outer" in head and rest == b""


@pytest.mark.parametrize("pieces", [False, True], ids=["read", "read_pieces"])
async def test_reading_the_whole_body_of_an_upstream_that_breaks_off_becomes_a_502(
    upstream: RecordingUpstream, start_gateway: GatewayFactory, pieces: bool
) -> None:
    gw = await start_gateway(make_config(upstream.url))

    async def broken(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "100000"})
        await resp.prepare(request)
        await resp.write(b"a" * 1000)
        request.transport.close()  # type: ignore[union-attr]
        return resp

    upstream.responder = broken
    seen: list[str] = []

    async def reader(exchange: Exchange, next: Next) -> Reply:
        reply = await next(exchange)
        try:
            await (reply.read_pieces(1 << 20, len) if pieces else reply.read(1 << 20))
        except Exception as err:  # noqa: BLE001 - the test records which kind
            seen.append(type(err).__name__)
        reply.headers["X-Seen"] = "yes"
        return reply

    await _route_through(gw, [reader])
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/x") as resp:
            assert resp.status == 502 and resp.headers["X-Seen"] == "yes"
            assert (await resp.json())["code"] == "UPSTREAM_RESET"
    assert seen == ["BodyUnavailable"]


# --- the whole body as the pieces it arrived in (Reply.read_pieces) ----------------------------------------------


async def test_read_pieces_hands_each_piece_over_as_it_arrives(
    upstream: RecordingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(upstream.url))
    body = [b"a" * 3000, b"b" * 70_000, b"c" * 7]
    whole = b"".join(body)
    first_seen = asyncio.Event()

    async def stepwise(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(len(whole)), "Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(body[0])
        # The rest only once the policy was handed the first piece: a reader given the pieces only at the end (or
        # joined) would wait here until the timeout.
        await asyncio.wait_for(first_seen.wait(), 5)
        for piece in body[1:]:
            await resp.write(piece)
        return resp

    upstream.responder = stepwise
    seen: list[bytes | bytearray] = []
    read: list[Sequence[bytes | bytearray]] = []

    def each(piece: bytes | bytearray) -> None:
        seen.append(piece)
        first_seen.set()

    async def reader(exchange: Exchange, next: Next) -> Reply:
        reply = await next(exchange)
        read.append(await reply.read_pieces(1 << 20, each))
        assert reply.length == len(whole) and not reply.streamed
        assert await reply.read_pieces(1 << 20) == read[0]  # in hand now: the same pieces, nothing read again
        reply.headers["X-Pieces"] = str(len(read[0]))
        return reply  # not replaced: the pieces go to the client as they came

    await _route_through(gw, [reader])
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/x") as resp:
            got = await resp.read()
            assert resp.status == 200 and resp.headers["Content-Length"] == str(len(whole))
    assert got == whole and b"".join(seen) == whole and seen == read[0] and len(seen) >= 2


async def test_read_pieces_over_the_cap_still_sends_the_whole_body(
    upstream: RecordingUpstream, start_gateway: GatewayFactory
) -> None:
    body = board_bytes(200)
    upstream.responder = _chunked_board(body)
    gw = await start_gateway(make_config(upstream.url))
    seen: list[bytes | bytearray] = []
    raised: list[str] = []

    async def reader(exchange: Exchange, next: Next) -> Reply:
        reply = await next(exchange)
        try:
            await reply.read_pieces(20_000, seen.append)
        except Exception as err:  # noqa: BLE001 - the test records which kind
            raised.append(type(err).__name__)
        return reply

    await _route_through(gw, [reader])
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/x") as resp:
            got = await resp.read()
    assert raised == ["BodyTooLarge"] and got == body
    assert 0 < sum(map(len, seen)) <= 20_000 and body.startswith(b"".join(seen))  # only pieces within the cap
