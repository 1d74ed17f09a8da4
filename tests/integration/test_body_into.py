"""A board read straight into the gateway's buffers (core/aiohttp_fast.py, ``read_body_into``) through real sockets:
the rewritten board is the one the parser's road gives, the upstream connection is used again for the next request,
and an upstream that breaks off, stalls or outlives its client gets the answers of the parser's road; under uvloop,
a body that arrives faster than it is read is handed on one piece a turn of the event loop."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from gateway.core import aiohttp_fast
from gateway.policies.board_cards import json_splice
from gateway.rollout import FixedClock, parse_instant
from tests.board_fixtures import realistic_board_bytes
from tests.gateway_testlib import GatewayFactory, make_config, serve_gateway
from tests.integration.board_testlib import BOARD_ROUTE

CAPPED = "2026-10-15T12:00:00Z"
BODY = realistic_board_bytes(700)  # about 1.5 MB: several of the road's buffers
assert len(BODY) > 4 * aiohttp_fast.BODY_PIECE


class _Upstream:
    """Answers each board request with ``BODY`` (Content-Length) in writes of ``write`` bytes; ``cut``: the number of
    bytes after which the connection is closed (``close``) or left open and silent; records the connections."""

    def __init__(self) -> None:
        self.port = 0
        self.connections = 0
        self.requests = 0
        self.write = 100_000
        self.cut: int | None = None
        self.close = True
        self.closed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                self.requests += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % len(BODY))
                end = len(BODY) if self.cut is None else self.cut
                for at in range(0, end, self.write):
                    writer.write(BODY[at : min(at + self.write, end)])
                    await writer.drain()
                if self.cut is not None:
                    if not self.close:
                        await reader.read()  # silent until the gateway gives up on the connection
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()


@pytest.fixture
async def raw() -> AsyncIterator[_Upstream]:
    upstream = _Upstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    yield upstream
    server.close()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bodies ``read_body_into`` read (their pieces' count; -1 for one it failed to read to its end, -2 for one
    whose read was cancelled); nothing for one it declined."""
    seen: list[int] = []
    real = aiohttp_fast.read_body_into

    async def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            pieces = await real(*args, **kwargs)
        except asyncio.CancelledError:
            seen.append(-2)
            raise
        except Exception:
            seen.append(-1)
            raise
        if pieces is not None:
            seen.append(len(pieces))
        return pieces

    monkeypatch.setattr(aiohttp_fast, "read_body_into", spy)
    return seen


async def _gateway(start_gateway: GatewayFactory, port: int, read_timeout: float = 5) -> Any:
    route = {**BOARD_ROUTE, "chain": [{"board_cards": {"memo_bytes": 0}}]}
    config = make_config(f"http://127.0.0.1:{port}", routes=[route], upstream={"read_timeout": read_timeout})
    return await start_gateway(config, clock=FixedClock(parse_instant(CAPPED)))


def _capped(body: bytes) -> Callable[[bytes], None]:
    original = json.loads(body)

    def check(got: bytes) -> None:
        doc = json.loads(got)
        assert doc["cards"] == original["cards"][:100] and f"first 100 of {len(original['cards'])} cards" in doc[
            "cards_deprecation_message"]
        assert got.startswith(body[: body.index(b'{"id":101,') - 1])  # the upstream's bytes up to the cut, as sent

    return check


needs_the_road = pytest.mark.skipif(not aiohttp_fast.FAST.upstream_body_into, reason="upstream_body_into is off")


@needs_the_road
@pytest.mark.parametrize("write", [100_000, 1 << 20])
async def test_a_board_read_into_buffers_is_cut_as_the_parser_road_cuts_it_and_the_connection_is_used_again(
    raw: _Upstream, start_gateway: GatewayFactory, taken: list[int], write: int
) -> None:
    raw.write = write
    gw = await _gateway(start_gateway, raw.port)
    check = _capped(BODY)
    async with aiohttp.ClientSession() as client:
        for _ in range(3):
            async with client.get(gw.url + "/api/latest/boards/1") as resp:
                assert resp.status == 200
                check(await resp.read())
    assert len(taken) == 3 and all(n >= 2 for n in taken)
    assert raw.requests == 3 and raw.connections == 1  # one kept-alive upstream connection read all three


@needs_the_road
async def test_an_upstream_that_closes_part_way_through_the_board_gets_a_502_and_the_next_request_a_new_connection(
    raw: _Upstream, start_gateway: GatewayFactory, taken: list[int]
) -> None:
    gw = await _gateway(start_gateway, raw.port)
    raw.cut = 3 * aiohttp_fast.BODY_PIECE + 1000
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            assert resp.status == 502 and (await resp.json())["code"] == "UPSTREAM_RESET"
        raw.cut = None
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            assert resp.status == 200
            _capped(BODY)(await resp.read())
    assert raw.connections == 2 and taken[0] == -1 and taken[1] >= 2


@needs_the_road
async def test_an_upstream_that_stalls_part_way_through_the_board_gets_a_504_and_its_connection_is_closed(
    raw: _Upstream, start_gateway: GatewayFactory, taken: list[int]
) -> None:
    gw = await _gateway(start_gateway, raw.port, read_timeout=0.5)
    raw.cut, raw.close = 2 * aiohttp_fast.BODY_PIECE + 10, False
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            assert resp.status == 504 and (await resp.json())["code"] == "UPSTREAM_TIMEOUT"
    await asyncio.wait_for(raw.closed.wait(), 5)  # the gateway closed the stalled connection
    assert taken == [-1]


@needs_the_road
async def test_a_reader_of_the_pieces_that_fails_ends_the_read_with_a_500_not_a_hang(
    raw: _Upstream, start_gateway: GatewayFactory, taken: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader of the pieces that raises (a bug) is the gateway's failure, not the upstream's: a 500 with the
    gateway's own error, nothing of the exception to the client, and nothing left behind for the next request."""
    real = json_splice.Reader.feed
    fed = [0]

    def failing_feed(self: json_splice.Reader, piece: bytes | bytearray) -> None:
        fed[0] += 1
        if fed[0] == 3:
            raise RuntimeError("a bug in the reader")
        real(self, piece)

    monkeypatch.setattr(json_splice.Reader, "feed", failing_feed)
    gw = await _gateway(start_gateway, raw.port)
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            body = await asyncio.wait_for(resp.json(), 5)
            assert resp.status == 500 and body["code"] == "INTERNAL_ERROR"
            assert "a bug" not in json.dumps(body)
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            assert resp.status == 200
            _capped(BODY)(await resp.read())
    assert taken[0] == -1 and taken[1] >= 2


@needs_the_road
async def test_a_client_that_leaves_while_the_board_is_read_closes_the_upstream_connection(
    raw: _Upstream, start_gateway: GatewayFactory, taken: list[int]
) -> None:
    gw = await _gateway(start_gateway, raw.port)
    raw.cut, raw.close = 2 * aiohttp_fast.BODY_PIECE + 10, False
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET /api/latest/boards/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    while raw.requests == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the gateway is in the body's middle, waiting for the rest
    writer.close()
    await asyncio.wait_for(raw.closed.wait(), 5)  # the upstream connection was not kept for another request
    assert taken == [-2]
    raw.cut = None
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/api/latest/boards/1") as resp:
            assert resp.status == 200
            _capped(BODY)(await resp.read())


def _upstream_all_at_once(body: bytes) -> tuple[socket.socket, threading.Thread]:
    """A listening socket whose one connection gets ``body``'s response at once (``sendall``: as fast as the kernel
    takes it), for each request on it, until the gateway closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while conn.recv(65536):
                conn.sendall(head + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@needs_the_road
def test_under_uvloop_a_board_arriving_faster_than_it_is_read_is_handed_on_one_piece_a_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libuv reads on while each read fills its buffer (up to 32 reads in one callback): without a pause after each
    piece, a board already in the kernel's buffer would be read and scanned in one turn of the loop, and every other
    connection would wait milliseconds for it. Here each piece costs 1 ms more to hand on, so the upstream is always
    ahead: the pieces must still come one a turn, and the board must be the one the parser's road gives."""
    uvloop = pytest.importorskip("uvloop")
    body = realistic_board_bytes(2000)  # about 4 MB: 16 of the road's pieces
    turn = [0]
    full_pieces_at: list[int] = []
    real = aiohttp_fast._BodyInto.buffer_updated

    def slow_buffer_updated(self: Any, nbytes: int) -> None:
        before = self._buffer
        real(self, nbytes)
        if self._buffer is None and before is not None:  # a piece was handed on
            full_pieces_at.append(turn[0])
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass

    monkeypatch.setattr(aiohttp_fast._BodyInto, "buffer_updated", slow_buffer_updated)
    listener, thread = _upstream_all_at_once(body)

    async def scenario() -> bytes:
        loop = asyncio.get_running_loop()
        stop = False

        def tick() -> None:
            turn[0] += 1
            if not stop:
                loop.call_soon(tick)

        route = {**BOARD_ROUTE, "chain": [{"board_cards": {"memo_bytes": 0}}]}
        config = make_config(f"http://127.0.0.1:{listener.getsockname()[1]}", routes=[route])
        gw = await serve_gateway(config, clock=FixedClock(parse_instant(CAPPED)))
        try:
            loop.call_soon(tick)
            async with aiohttp.ClientSession() as client:
                async with client.get(gw.url + "/api/latest/boards/1") as resp:
                    assert resp.status == 200
                    return await resp.read()
        finally:
            stop = True
            await gw.stop()

    got = uvloop.run(scenario())
    listener.close()
    thread.join(5)
    _capped(body)(got)
    assert len(full_pieces_at) >= 10
    assert len(set(full_pieces_at)) == len(full_pieces_at), f"pieces handed on in the same turn: {full_pieces_at}"
