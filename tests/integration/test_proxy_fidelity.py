"""The proxy core through real sockets: what the client sends reaches the upstream, and back, unchanged."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os

import aiohttp
import pytest
from aiohttp import http_exceptions, web

from gateway.app import parser_error_text
from gateway.core.aiohttp_fast import FAST
from tests.gateway_testlib import (
    GatewayFactory,
    Received,
    RecordingUpstream,
    RunningGateway,
    chunked_responder,
    free_port,
    make_config,
    parse_responses,
    raw_exchange,
)


@pytest.fixture
async def client() -> aiohttp.ClientSession:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND"])
async def test_any_method_is_forwarded(gw: RunningGateway, upstream: RecordingUpstream, client, method: str) -> None:
    async with client.request(method, gw.url + "/some/where?x=1") as resp:
        assert resp.status == 200
        assert (await resp.json())["method"] == method
    assert upstream.received[-1].method == method
    assert upstream.received[-1].raw_path == "/some/where?x=1"


async def test_head_is_forwarded_and_answered_without_body(gw, upstream, client) -> None:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        return web.Response(body=b"x" * 1234, headers={"X-Kind": "head-test"})

    upstream.responder = responder
    data = await raw_exchange(gw.port, b"HEAD /thing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout=1)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Content-Length: 1234" in head
    assert rest == b""
    assert upstream.received[-1].method == "HEAD"


@pytest.mark.parametrize("status", [204, 304])
async def test_bodyless_statuses(gw, upstream, client, status: int) -> None:
    async def responder(request, received):
        return web.Response(status=status, headers={"ETag": '"abc"'})

    upstream.responder = responder
    async with client.get(gw.url + "/x", headers={"If-None-Match": '"abc"'}) as resp:
        assert resp.status == status
        assert resp.headers["ETag"] == '"abc"'
        assert await resp.read() == b""
    assert upstream.received[-1].header("If-None-Match") == '"abc"'


async def test_headers_pass_and_hop_by_hop_are_stripped(gw, upstream) -> None:
    request = (
        b"GET /h HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer secret-token\r\n"
        b"X-Custom: one\r\nX-Custom: two\r\n"
        b"Connection: keep-alive, X-Drop-Me\r\nX-Drop-Me: 1\r\nKeep-Alive: timeout=5\r\n"
        b"TE: trailers\r\nProxy-Authorization: Basic abc\r\nUpgrade: h2c\r\n"
        b"X-Forwarded-For: 10.0.0.9\r\nVia: 1.0 edge\r\n\r\n"
    )
    data = await raw_exchange(gw.port, request, timeout=1)
    assert data.startswith(b"HTTP/1.1 200")
    got = upstream.received[-1]
    assert got.header("Authorization") == "Bearer secret-token"
    assert got.headers_all("X-Custom") == ["one", "two"]
    for name in ("X-Drop-Me", "Keep-Alive", "TE", "Proxy-Authorization", "Upgrade"):
        assert got.header(name) is None, name
    assert got.header("Connection") in (None, "keep-alive")  # the client library's own, not the client's
    assert got.header("X-Forwarded-For") == "10.0.0.9, 127.0.0.1"
    assert got.header("X-Forwarded-Proto") == "http"
    assert got.header("X-Forwarded-Host") == "127.0.0.1"
    assert got.header("Via") == "1.0 edge, 1.1 deprecation-gateway"
    assert got.header("Host") == f"127.0.0.1:{upstream.port}"
    assert got.header("User-Agent") is None and got.header("Accept-Encoding") is None


ADMIN_COOKIE = "gateway_admin=1795900000.nonce-of-a-login.0123456789abcdef"  # the admin listener's (a session)


@pytest.mark.parametrize(("sent", "forwarded"), [
    (["a=1; gateway_admin=X; b=2"], ["a=1; b=2"]),
    (["gateway_admin=X"], []),
    (["gateway_admin=X; a=1"], ["a=1"]),
    (["a=1;gateway_admin=X"], ["a=1"]),
    (["a=1", "gateway_admin=X", "b=2;  c=3"], ["a=1", "b=2;  c=3"]),
    # Other cookies pass byte for byte, whatever they look like.
    *[([line], [line]) for line in ['gateway_admin2=x; xgateway_admin=y; q="gateway_admin=z"']],
], ids=["between", "alone", "first", "last", "own-line", "look-alikes"])
async def test_the_admin_cookie_never_reaches_the_upstream(gw, upstream, sent: list[str], forwarded: list[str]) -> None:
    """A browser sends a host's cookies to every port of it (RFC 6265 8.5): the admin listener's session cookie
    comes to the public listener too, which must not hand it to the service (and its logs)."""
    lines = "".join(f"Cookie: {line.replace('gateway_admin=X', ADMIN_COOKIE)}\r\n" for line in sent)
    data = await raw_exchange(gw.port, f"GET /c HTTP/1.1\r\nHost: 127.0.0.1\r\n{lines}Connection: close\r\n\r\n"
                              .encode())
    assert data.startswith(b"HTTP/1.1 200")
    assert upstream.received[-1].headers_all("Cookie") == forwarded
    assert ADMIN_COOKIE.partition("=")[2] not in repr(upstream.received[-1].raw_headers)


async def test_response_headers_pass_and_hop_by_hop_are_stripped(gw, upstream, client) -> None:
    async def responder(request, received):
        resp = web.Response(body=b"ok", headers={"Connection": "X-Secret-Hop", "X-Secret-Hop": "1", "X-Keep": "yes"})
        resp.headers.add("Set-Cookie", "a=1")
        resp.headers.add("Set-Cookie", "b=2")
        return resp

    upstream.responder = responder
    async with client.get(gw.url + "/r") as resp:
        assert resp.headers["X-Keep"] == "yes"
        assert "X-Secret-Hop" not in resp.headers
        assert resp.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert resp.headers["Via"] == "1.1 deprecation-gateway"
        assert len(resp.headers["X-Request-Id"]) == 32


async def test_request_id_kept_when_valid_and_replaced_when_not(gw, upstream, client) -> None:
    async with client.get(gw.url + "/", headers={"X-Request-Id": "abc-123"}) as resp:
        assert resp.headers["X-Request-Id"] == "abc-123"
    assert upstream.received[-1].header("X-Request-Id") == "abc-123"
    async with client.get(gw.url + "/", headers={"X-Request-Id": "bad id\twith spaces"}) as resp:
        replaced = resp.headers["X-Request-Id"]
    assert replaced != "bad id\twith spaces" and len(replaced) == 32
    assert upstream.received[-1].header("X-Request-Id") == replaced


@pytest.mark.parametrize("size", [0, 1, 65_537, 5 * 1024 * 1024 + 3])
async def test_request_bodies_arrive_byte_for_byte(gw, upstream, client, size: int) -> None:
    body = os.urandom(size)
    async with client.post(gw.url + "/upload", data=body, headers={"Content-Type": "application/octet-stream"}) as resp:
        assert resp.status == 200
    got = upstream.received[-1]
    assert got.body_size == size
    assert got.body_sha256 == hashlib.sha256(body).hexdigest()
    assert got.header("Content-Length") == str(size)
    assert got.header("Content-Type") == "application/octet-stream"


async def test_chunked_request_body_is_streamed(gw, upstream, client) -> None:
    parts = [os.urandom(1000) for _ in range(20)]

    async def gen():
        for part in parts:
            yield part
            await asyncio.sleep(0)

    async with client.put(gw.url + "/chunked", data=gen()) as resp:
        assert resp.status == 200
    got = upstream.received[-1]
    assert got.body_sha256 == hashlib.sha256(b"".join(parts)).hexdigest()
    assert got.header("Transfer-Encoding") == "chunked"
    assert got.header("Content-Length") is None


async def test_encoded_request_body_is_not_decoded(gw, upstream, client) -> None:
    body = gzip.compress(b'{"text": "hello"}')
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with client.post(gw.url + "/api/v1/cards/1/comments", data=body, headers=headers) as resp:
        assert resp.status == 200
    got = upstream.received[-1]
    assert got.header("Content-Encoding") == "gzip"
    assert got.body_sha256 == hashlib.sha256(body).hexdigest()


async def test_gzip_response_passes_untouched(gw, upstream, client) -> None:
    payload = gzip.compress(json.dumps({"cards": list(range(1000))}).encode())

    async def responder(request, received):
        return web.Response(body=payload, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    upstream.responder = responder
    async with client.get(gw.url + "/z", headers={"Accept-Encoding": "gzip"}) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Content-Length"] == str(len(payload))
        assert await resp.read() == payload
    assert upstream.received[-1].header("Accept-Encoding") == "gzip"


async def test_streamed_chunked_response(gw, upstream, client) -> None:
    body = os.urandom(300_000)
    upstream.responder = chunked_responder(body, 10_000)
    async with client.get(gw.url + "/stream") as resp:
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        assert await resp.read() == body


@pytest.mark.skipif(not FAST.reply_one_write, reason="reply_one_write is off: the head and the body leave in two writes")
async def test_a_response_that_has_fully_arrived_leaves_in_one_write(gw, upstream, monkeypatch) -> None:
    from aiohttp.http_writer import StreamWriter

    from gateway.server.listener import _Connection

    writes: list[int] = []
    write, writelines = StreamWriter._write, StreamWriter._writelines

    def counting_write(self, chunk):  # type: ignore[no-untyped-def]
        if isinstance(self._protocol, _Connection):
            writes.append(len(chunk))
        return write(self, chunk)

    def counting_writelines(self, chunks):  # type: ignore[no-untyped-def]
        if isinstance(self._protocol, _Connection):
            writes.append(sum(len(c) for c in chunks))
        return writelines(self, chunks)

    monkeypatch.setattr(StreamWriter, "_write", counting_write)
    monkeypatch.setattr(StreamWriter, "_writelines", counting_writelines)
    for method in ("GET", "HEAD"):
        writes.clear()
        request = f"{method} /small HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        data = await raw_exchange(gw.port, request.encode())
        assert data.startswith(b"HTTP/1.1 200")
        assert writes == [len(data)], method  # the head and the whole body in one write


async def test_a_response_still_arriving_sends_its_head_at_once(gw, upstream) -> None:
    go_on = asyncio.Event()

    async def responder(request, received):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await go_on.wait()
        await resp.write(b"late body")
        await resp.write_eof()
        return resp

    upstream.responder = responder
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(b"GET /slow-body HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
        go_on.set()
        assert b"late body" in await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 3)
    finally:
        writer.close()


async def test_redirect_is_passed_not_followed(gw, upstream, client) -> None:
    location = "http://files.example.test/signed/abc?expires=1&signature=deadbeef"

    async def responder(request, received):
        return web.Response(status=302, headers={"Location": location})

    upstream.responder = responder
    async with client.get(gw.url + "/api/v1/cards/u/files/f?redirect=true", allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == location
    assert len(upstream.received) == 1


async def test_query_is_forwarded_exactly(gw, upstream, client) -> None:
    query = "a=1&a=2&b=%20x+y&c=%E2%9C%93&d=&e"
    data = await raw_exchange(gw.port, f"GET /q?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    assert data.startswith(b"HTTP/1.1 200")
    assert upstream.received[-1].raw_path == f"/q?{query}"


@pytest.mark.parametrize(
    ("target", "forwarded"),
    [
        ("/api/v1//boards///1/", "/api/v1/boards/1"),
        ("/api/v1/./x/../boards/1", "/api/v1/boards/1"),
        ("/api/%76%31/boards/%31", "/api/v1/boards/1"),
        ("/files/a%2a%c3%a9", "/files/a%2A%C3%A9"),
        ("/API/Latest/Boards/7", "/API/Latest/Boards/7"),
    ],
)
async def test_upstream_receives_the_canonical_path(gw, upstream, target: str, forwarded: str) -> None:
    data = await raw_exchange(gw.port, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert upstream.received[-1].raw_path == forwarded


@pytest.mark.parametrize(
    ("target", "code"),
    [
        ("/a%2Fb", "BAD_PATH"),
        ("/a%5cb", "BAD_PATH"),
        ("/a\\b", "BAD_PATH"),
        ("/a%00b", "BAD_PATH"),
        ("/api/v1/cards/1/files;x=1", "BAD_PATH"),
        ("/a%zz", "BAD_PATH"),
        ("http://evil.test/api/v1/boards/1", "BAD_REQUEST_TARGET"),
        ("*", "BAD_REQUEST_TARGET"),
    ],
)
async def test_unclassifiable_targets_are_refused_and_never_forwarded(gw, upstream, target: str, code: str) -> None:
    data = await raw_exchange(gw.port, f"OPTIONS {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    ((status, headers, body),) = parse_responses(data)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["code"] == code
    assert upstream.received == []


async def test_absolute_form_for_the_same_host_is_accepted(gw, upstream) -> None:
    data = await raw_exchange(
        gw.port, b"GET http://127.0.0.1/abs?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert data.startswith(b"HTTP/1.1 200")
    assert upstream.received[-1].raw_path == "/abs?x=1"


async def test_unknown_host_is_refused(gw, upstream, client) -> None:
    async with client.get(gw.url + "/x", headers={"Host": "nobody.test"}) as resp:
        assert resp.status == 421
        assert (await resp.json())["code"] == "UNKNOWN_HOST"
    assert upstream.received == []


async def test_upstream_down_is_502_json(start_gateway: GatewayFactory, client) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{free_port()}"))
    async with client.get(gw.url + "/x", headers={"X-Request-Id": "rid-502"}) as resp:
        assert resp.status == 502
        body = await resp.json()
    assert body == {"code": "UPSTREAM_UNAVAILABLE", "message": "the upstream service cannot be reached", "request_id": "rid-502"}
    assert resp.headers["X-Request-Id"] == "rid-502"
    assert gw.metrics.registry.get_sample_value("gateway_upstream_errors_total", {"kind": "connect"}) == 1


async def test_upstream_timeout_is_504_json(upstream, start_gateway: GatewayFactory, client) -> None:
    async def responder(request, received):
        await asyncio.sleep(3)
        return web.Response(text="late")

    upstream.responder = responder
    config = make_config(upstream.url, upstream={"connect_timeout": 1, "read_timeout": 0.5})
    gw = await start_gateway(config)
    async with client.get(gw.url + "/slow") as resp:
        assert resp.status == 504
        body = await resp.json()
    assert body["code"] == "UPSTREAM_TIMEOUT"
    assert body["request_id"] == resp.headers["X-Request-Id"]


async def test_expect_100_continue(gw, upstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(
        b"PUT /e HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    await writer.drain()
    rest = await asyncio.wait_for(reader.read(), 3)
    writer.close()
    assert rest.startswith(b"HTTP/1.1 200")
    got = upstream.received[-1]
    assert got.body_sha256 == hashlib.sha256(b"hello").hexdigest()
    assert got.header("Expect") is None


async def test_client_disconnect_mid_upload_abandons_the_upstream_request(gw, upstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"PUT /big HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 100_000)
    await writer.drain()
    await asyncio.wait_for(upstream.body_started.wait(), 3)
    writer.transport.abort()
    for _ in range(100):
        if upstream.received:
            break
        await asyncio.sleep(0.05)
    got = upstream.received[-1]
    assert not got.body_complete
    assert got.body_size < 10_000_000
    # The pooled connection that carried the broken body is not reused.
    connector = gw.gateway.proxy.client.session.connector
    assert connector is not None
    for _ in range(50):
        if gw.gateway.metrics.registry.get_sample_value("gateway_requests_in_flight") == 0:
            break
        await asyncio.sleep(0.05)
    assert gw.gateway.metrics.registry.get_sample_value("gateway_requests_in_flight") == 0
    assert sum(len(v) for v in connector._conns.values()) == 0


async def test_keepalive_connection_serves_many_requests(gw, upstream) -> None:
    request = b"GET /k HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    data = await raw_exchange(gw.port, request * 3 + b"GET /k HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    responses = parse_responses(data)
    assert [r[0] for r in responses] == [200, 200, 200, 200]
    assert len(upstream.received) == 4


async def test_client_disconnect_while_waiting_cancels_the_upstream_request(gw, upstream) -> None:
    cancelled = asyncio.Event()

    async def responder(request, received):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response(text="too late")

    upstream.responder = responder
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    await asyncio.wait_for(upstream.started.wait(), 3)
    writer.transport.abort()
    await asyncio.wait_for(cancelled.wait(), 3)
    for _ in range(50):
        if gw.metrics.registry.get_sample_value("gateway_requests_in_flight") == 0:
            break
        await asyncio.sleep(0.02)
    assert gw.metrics.registry.get_sample_value("gateway_requests_in_flight") == 0
    assert gw.metrics.registry.get_sample_value(
        "gateway_requests_total", {"route": "catch_all", "method": "GET", "status_class": "4xx"}
    ) == 1  # logged as 499


async def test_broken_chunked_framing_mid_body_does_not_hang(upstream, start_gateway: GatewayFactory) -> None:
    """aiohttp stops feeding a body whose chunk framing breaks mid-way; the body timeout ends the request."""
    config = make_config(upstream.url, server={"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                                               "client_body_timeout": 0.5})
    gw = await start_gateway(config)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    await writer.drain()
    await asyncio.wait_for(upstream.body_started.wait(), 3)
    writer.write(b"ZZZ\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:100]
    assert b"CLIENT_BODY_TIMEOUT" in data
    for _ in range(50):
        if upstream.received:
            break
        await asyncio.sleep(0.05)
    assert upstream.received and not upstream.received[-1].body_complete
    assert gw.metrics.registry.get_sample_value("gateway_requests_in_flight") == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer parser-secret\nX-A: 1\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Folded: a\r\n b\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer parser-secret" + b"x" * 20000 + b"\r\n\r\n",
        # A signed query string in a request line the parser refuses.
        b"GET /x?sig=parser-secret HTTP/1.1 junk\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /x?sig=parser-secret\x01 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /x?sig=parser-secret" + b"x" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    ],
)
async def test_requests_the_http_parser_rejects_get_a_json_400(gw, upstream, raw: bytes, caplog) -> None:
    data = await raw_exchange(gw.port, raw, timeout=2)
    ((status, headers, body),) = parse_responses(data)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    answer = json.loads(body)
    assert answer["code"] == "MALFORMED_REQUEST" and answer["message"] and len(answer["request_id"]) == 32
    assert upstream.received == []
    assert gw.metrics.registry.get_sample_value("gateway_refused_requests_total", {"code": "MALFORMED_REQUEST"}) == 1
    assert "parser-secret" not in caplog.text and b"parser-secret" not in body


@pytest.mark.parametrize(
    "exc",
    [
        http_exceptions.InvalidURLError("/x?sig=parser-secret"),
        http_exceptions.BadStatusLine("GET /x?sig=parser-secret HTTP/1.1 junk"),
        http_exceptions.BadHttpMethod("parser-secret"),
        http_exceptions.InvalidHeader(b"Authorization: Bearer parser-secret"),
        http_exceptions.LineTooLong(b"parser-secret" * 100, "8190"),
        http_exceptions.TransferEncodingError("parser-secret"),
        ValueError("parser-secret"),
        None,
    ],
)
def test_parser_error_answers_never_quote_the_parser(exc: BaseException | None) -> None:
    """Whatever the parser (C or pure Python) puts in its error, the answer's text is fixed by the kind of error."""
    text = parser_error_text(exc)
    assert text and "parser-secret" not in text and "sig=" not in text


# Header lines as clients send them, odd ones included: repeated names, names that differ only in case, empty values,
# inner spaces, long values, obs-text. Each is sent on a request with and without a body.
HEADER_CORPUS: list[list[tuple[str, str]]] = [
    [("X-A", "1"), ("x-a", "2")],
    [("X-A", "1"), ("X-A", "2"), ("x-A", "3")],
    [("Accept", "text/html"), ("ACCEPT", "application/json"), ("accept", "*/*")],
    [("Cookie", "a=1"), ("cookie", "b=2")],
    [("X-Empty", ""), ("X-Spaces", "a  b   c"), ("X-Tab", "a\tb")],
    [("X-Long", "v" * 4000)],
    [("User-Agent", "old-sdk/1.2"), ("user-agent", "other/2")],
    [("X-Utf8", "caf\xc3\xa9")],
    [("X-Obs", "caf\xe9")],  # not UTF-8: refused (400 BAD_HEADER) rather than forwarded altered
    [("Authorization", "Bearer one"), ("authorization", "Bearer two")],
    [("X-Forwarded-Proto", "https"), ("Via", "1.0 other-proxy"), ("Accept-Encoding", "gzip"), ("Content-Type", "x/y")],
]


@pytest.mark.parametrize("lines", HEADER_CORPUS, ids=[",".join(k for k, _ in c) for c in HEADER_CORPUS])
async def test_headers_reach_the_upstream_alike_with_and_without_a_body(gw, upstream, lines) -> None:
    """One road: the upstream is sent the same header lines, in the same order and spelling, whether or not the
    request has a body (the framing headers aside); and every line the proxy core does not own arrives, in order,
    with its value byte for byte (aiohttp's parser spells the names of headers it knows its own way)."""
    seen = []
    answers = set()
    for method, body in (("GET", b""), ("POST", b"0123456789"), ("PUT", b"")):
        head = f"{method} /corpus HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Request-Id: corpus-1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in lines)
        if body or method == "PUT":
            head += f"Content-Length: {len(body)}\r\n"
        before = len(upstream.received)
        data = await raw_exchange(gw.port, head.encode("latin-1") + b"\r\n" + body)
        answers.add(data.split(b"\r\n", 1)[0])
        if len(upstream.received) == before:
            continue  # refused (a repeated Authorization, a value that is not UTF-8): alike for all three
        received = upstream.received[-1]
        # Each request is given a trace of its own (its traceparent's ids differ): compared by name only.
        assert received.header("traceparent") is not None
        seen.append([(k, v if k.lower() != b"traceparent" else b"") for k, v in received.raw_headers
                     if k.lower() not in (b"content-length", b"transfer-encoding")])
        sent = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in lines]
        owned = {b"x-forwarded-proto", b"via"}
        names = {k for k, _ in sent}
        forwarded = [(k.lower(), v) for k, v in seen[-1] if k.lower() in names and k.lower() not in owned]
        assert forwarded == [kv for kv in sent if kv[0] not in owned]
    assert len(answers) == 1, answers
    assert len(seen) in (0, 3) and all(s == seen[0] for s in seen)


async def test_a_header_value_that_is_not_utf8_is_refused_not_altered(gw, upstream) -> None:
    before = len(upstream.received)
    data = await raw_exchange(gw.port, b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Name: caf\xe9\r\nConnection: close\r\n\r\n")
    ((status, _, payload),) = parse_responses(data)
    assert status == 400 and json.loads(payload)["code"] == "BAD_HEADER"
    assert len(upstream.received) == before


@pytest.mark.parametrize("status_line", [b"HTTP/1.1 999 Odd", b"HTTP/1.1 099 Odd", b"HTTP/1.1 abc Odd", b"HTTP/1.1 2000 Odd"])
async def test_an_upstream_status_outside_100_to_599_or_malformed_is_a_502(start_gateway, status_line: bytes) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(status_line + b"\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gw = await start_gateway(make_config(f"http://127.0.0.1:{port}"))
        data = await raw_exchange(gw.port, b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        ((status, _, payload),) = parse_responses(data)
        assert status == 502 and json.loads(payload)["code"] == "UPSTREAM_ERROR"
    finally:
        server.close()
