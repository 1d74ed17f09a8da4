"""The upstream client's one road: the same bytes on the wire as ClientSession.request, its retry policy (a request
that never left is sent again; otherwise only a bodyless GET/HEAD/OPTIONS/TRACE, at most once), and its errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

from gateway.config.upstream import UpstreamConfig
from gateway.core.aiohttp_fast import FAST, BodylessResponse
from gateway.proxy.upstream import Response, UpstreamClient
from tests.gateway_testlib import free_port


@dataclass
class RawUpstream:
    """An HTTP/1.1 server on raw sockets: records every request head, answers as its ``answer`` says."""

    port: int = 0
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    # (connection number, request head) -> response bytes, or None to close the connection without answering
    answer: Callable[[int, bytes], Awaitable[bytes | None]] | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                await _skip_body(reader, head)
                reply = await self.answer(number, head) if self.answer else _ok()
                if reply is None:
                    break
                if head.startswith(b"HEAD "):
                    reply = reply.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _skip_body(reader: asyncio.StreamReader, head: bytes) -> None:
    lines = head.lower().split(b"\r\n")
    if b"transfer-encoding: chunked" in lines:
        while size := int((await reader.readline()).strip(), 16):
            await reader.readexactly(size + 2)
        await reader.readline()
    for line in lines:
        if line.startswith(b"content-length:"):
            await reader.readexactly(int(line.partition(b":")[2]))


def _ok(body: bytes = b"ok") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Up: 1\r\n\r\n%s" % (len(body), body)


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    recorder = RawUpstream()
    server = await asyncio.start_server(recorder.serve, "127.0.0.1", 0)
    recorder.port = server.sockets[0].getsockname()[1]
    yield recorder
    server.close()
    await server.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    upstream = UpstreamClient.open(UpstreamConfig(connect_timeout=2, read_timeout=2), max_field_size=8190)
    yield upstream
    await upstream.close()


async def _read(response: Response) -> bytes:
    """The whole body, as both kinds of upstream response read it (the core's protocol has no ``read``)."""
    assert isinstance(response, (aiohttp.ClientResponse, BodylessResponse))
    return await response.read()


def _headers(port: int) -> CIMultiDict[str]:
    # As ProxyCore.upstream_headers makes them: Host first.
    return CIMultiDict(
        [("Host", f"127.0.0.1:{port}"), ("Accept", "text/plain"), ("X-Forwarded-For", "10.0.0.1"), ("Via", "1.1 x"),
         ("X-Many", "1"), ("X-Many", "2")]
    )  # fmt: skip


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "OPTIONS", "POST", "PATCH", "PROPFIND"])
async def test_short_road_sends_what_client_session_sends(
    client: UpstreamClient, raw_upstream: RawUpstream, method: str
) -> None:
    url = URL(f"http://127.0.0.1:{raw_upstream.port}/a/b%2Fc?q=1&r", encoded=True)
    short = await client.request(method, url, _headers(raw_upstream.port), None)
    short_body = await _read(short)
    short.release()
    session_road = await client.session.request(
        method, url, headers=_headers(raw_upstream.port), data=None, allow_redirects=False, auto_decompress=False
    )
    session_body = await session_road.read()
    session_road.release()
    assert raw_upstream.heads[0] == raw_upstream.heads[1]
    assert raw_upstream.heads[0].startswith(f"{method} /a/b%2Fc?q=1&r HTTP/1.1\r\nHost: ".encode())
    assert (short.status, short.headers, short_body) == (session_road.status, session_road.headers, session_body)
    assert raw_upstream.connections == 1  # both went over the same pooled connection


async def test_short_road_keeps_repeated_headers_that_differ_in_case(
    client: UpstreamClient, raw_upstream: RawUpstream
) -> None:
    # ClientSession.request keeps only the last of "X-Many: 1" and "x-many: 2" (its merge compares names with
    # their case); the short road forwards both lines, as the client sent them.
    headers = _headers(raw_upstream.port)
    headers.popall("X-Many")
    headers.extend([("X-Many", "1"), ("x-many", "2")])
    (await client.request("GET", URL(f"http://127.0.0.1:{raw_upstream.port}/"), headers, None)).release()
    assert raw_upstream.heads[0].endswith(b"X-Many: 1\r\nx-many: 2\r\n\r\n")


async def test_an_idempotent_request_is_sent_again_once_when_its_connection_drops(
    client: UpstreamClient, raw_upstream: RawUpstream
) -> None:
    async def answer(connection: int, head: bytes) -> bytes | None:
        return None if connection == 1 else _ok()  # the first connection closes without answering

    raw_upstream.answer = answer
    url = URL(f"http://127.0.0.1:{raw_upstream.port}/x")
    response = await client.request("GET", url, _headers(raw_upstream.port), None)
    assert response.status == 200 and await _read(response) == b"ok"
    assert len(raw_upstream.heads) == 2 and raw_upstream.connections == 2


@pytest.mark.parametrize(
    ("method", "heads"),
    # Only safe methods are sent again once the request has left (a DELETE or PUT the upstream may have handled
    # must not run twice); a second drop is final.
    [("POST", 1), ("PUT", 1), ("DELETE", 1), ("PATCH", 1), ("GET", 2), ("HEAD", 2), ("OPTIONS", 2)],
)
async def test_drops_before_the_head(
    client: UpstreamClient, raw_upstream: RawUpstream, method: str, heads: int
) -> None:
    async def answer(connection: int, head: bytes) -> bytes | None:
        return None

    raw_upstream.answer = answer
    url = URL(f"http://127.0.0.1:{raw_upstream.port}/x")
    retried: list[str] = []
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.request(method, url, _headers(raw_upstream.port), None, retried)
    assert len(raw_upstream.heads) == heads
    assert retried == ["safe_method"] * (heads - 1)


async def test_safe_methods_are_not_sent_again_when_the_config_says_so(raw_upstream: RawUpstream) -> None:
    async def answer(connection: int, head: bytes) -> bytes | None:
        return None

    raw_upstream.answer = answer
    upstream = UpstreamClient.open(UpstreamConfig(retry_safe_methods=False), max_field_size=8190)
    try:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await upstream.request("GET", URL(f"http://127.0.0.1:{raw_upstream.port}/x"), _headers(raw_upstream.port),
                                   None)
    finally:
        await upstream.close()
    assert len(raw_upstream.heads) == 1


async def test_a_request_that_never_left_is_sent_again_whatever_its_method(
    client: UpstreamClient, raw_upstream: RawUpstream
) -> None:
    """Writing the head to a pooled connection the upstream had already closed fails at once: nothing left the
    gateway, so even a POST is sent again (on a new connection), and the upstream sees it once."""
    url = URL(f"http://127.0.0.1:{raw_upstream.port}/x")
    (await client.request("GET", url, _headers(raw_upstream.port), None)).release()
    connector = client.session.connector
    assert connector is not None
    (pooled,) = [protocol for kept in connector._conns.values() for protocol, _ in kept]

    def closing(data: bytes) -> None:  # the write aiohttp (or the gateway's own road) makes to a closing transport
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    pooled.transport.write = closing  # type: ignore[method-assign,union-attr]
    retried: list[str] = []
    response = await client.request("POST", url, _headers(raw_upstream.port), None, retried)
    assert response.status == 200
    response.release()
    assert retried == ["unsent"] and raw_upstream.connections == 2
    assert [head.split(b" ")[0] for head in raw_upstream.heads] == [b"GET", b"POST"]


async def test_a_request_whose_body_was_never_read_is_sent_again(
    client: UpstreamClient, raw_upstream: RawUpstream
) -> None:
    """A request with a body writes its head with its first body bytes: failing before the body was first read, it
    never left, and is sent again with its body whole."""
    attempts: list[int] = []

    async def answer(connection: int, head: bytes) -> bytes | None:
        return _ok()

    raw_upstream.answer = answer
    original = aiohttp.ClientRequest.send

    async def first_send_fails(self, conn):  # type: ignore[no-untyped-def]
        attempts.append(1)
        if len(attempts) == 1:
            raise aiohttp.ServerDisconnectedError()
        return await original(self, conn)

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"def"

    with pytest.MonkeyPatch.context() as m:
        m.setattr(aiohttp.ClientRequest, "send", first_send_fails)
        retried: list[str] = []
        response = await client.request("PUT", URL(f"http://127.0.0.1:{raw_upstream.port}/x"),
                                        _headers(raw_upstream.port), body(), retried)
    assert response.status == 200 and retried == ["unsent"]
    response.release()
    assert len(raw_upstream.heads) == 1 and b"Transfer-Encoding: chunked" in raw_upstream.heads[0]


async def test_an_unreachable_upstream_is_a_connector_error_and_not_retried(client: UpstreamClient) -> None:
    port = free_port()
    with pytest.raises(aiohttp.ClientConnectorError):
        await client.request("GET", URL(f"http://127.0.0.1:{port}/x"), _headers(port), None)


async def test_a_silent_upstream_is_a_read_timeout(raw_upstream: RawUpstream) -> None:
    async def answer(connection: int, head: bytes) -> bytes | None:
        await asyncio.sleep(5)
        return _ok()

    raw_upstream.answer = answer
    upstream = UpstreamClient.open(UpstreamConfig(connect_timeout=2, read_timeout=0.2), max_field_size=8190)
    try:
        with pytest.raises(aiohttp.ServerTimeoutError):
            url = URL(f"http://127.0.0.1:{raw_upstream.port}/x")
            await upstream.request("GET", url, _headers(raw_upstream.port), None)
    finally:
        await upstream.close()


@pytest.mark.skipif(not (FAST.upstream_request and FAST.upstream_bodyless),
                    reason="the fast roads are off: ClientSession.request is the road (test_fast_paths.py)")
async def test_every_request_takes_one_road_with_or_without_a_body(
    raw_upstream: RawUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ClientSession.request (its header merging, its retries) is never used: bodies and bodyless requests alike go
    through UpstreamClient's own road."""
    calls: list[str] = []
    request = aiohttp.ClientSession.request

    def counting(self: aiohttp.ClientSession, method: str, url: URL, **kwargs: object) -> object:
        calls.append(method)
        return request(self, method, url, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(aiohttp.ClientSession, "request", counting)

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"

    url = URL(f"http://127.0.0.1:{raw_upstream.port}/x")
    own = UpstreamClient.open(UpstreamConfig(), max_field_size=8190)
    injected = UpstreamClient(aiohttp.ClientSession(), max_field_size=8190)
    try:
        for upstream in (own, injected):
            (await upstream.request("PUT", url, _headers(raw_upstream.port), body())).release()
            (await upstream.request("GET", url, _headers(raw_upstream.port), None)).release()
    finally:
        await own.close()
        await injected.close()
    assert calls == []
    assert len(raw_upstream.heads) == 4
