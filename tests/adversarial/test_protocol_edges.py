"""Protocol edges through a real gateway process, each sent as raw bytes on a socket: what the client is answered,
and what a recording upstream parsed (nothing at all for a refused request).

- a path segment ending in a dot or a space is refused (BAD_PATH): upstreams that trim them would route it elsewhere;
- an unsolicited 101 from the upstream is a 502 UPSTREAM_UPGRADE, and the client's connection stays usable;
- a request asking for an upgrade is answered as a plain one and its connection closed: a pipelined request behind
  it never hangs;
- a transfer coding other than chunked alone is refused (BAD_TRANSFER_ENCODING) on every route; a Content-Length
  with leading zeros reaches the upstream normalised;
- forwarding headers: every X-Forwarded-For line combined then appended to; Forwarded, X-Real-IP and X-Client-IP
  from an untrusted client removed; an RFC 7239 Forwarded element emitted when configured.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_testlib import RecordingUpstream, guarded_routes, make_config, multipart_body, parse_responses
from tests.process_testlib import Proc, start, wait_for

B = "edge-boundary"
FILE_BODY = multipart_body([(['Content-Disposition: form-data; name="file"; filename="a.pdf"'], b"%PDF-1.4")], B)


def request(method: str, target: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"", *,
            close: bool = True, length: bool = True) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers or []]
    if length and body and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers or []):
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Send ``data``; everything answered, and whether the gateway closed the connection within ``timeout``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()
    closed = False
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                received += chunk
            closed = True
    except TimeoutError:
        pass
    finally:
        writer.close()
    return bytes(received), closed


def code(payload: bytes) -> str:
    return str(json.loads(payload)["code"])


@pytest.fixture
async def gateway(upstream: RecordingUpstream, tmp_path: Path) -> AsyncIterator[Proc]:
    """A gateway process with the guard on the deprecated routes (tenant acme forbids uploads)."""
    gw = await start(make_config(upstream.url, routes=guarded_routes()), tmp_path)
    yield gw
    gw.stop()


# --- 1. Trailing dots and spaces on a segment -------------------------------------------------------------------

TRAILING = [
    "/api/v1/cards/42/files.", "/api/v1/cards/42/files..", "/api/v1/cards/42/files...", "/api/v1/cards/42/files%2e",
    "/api/v1/cards/42/files%2E", "/api/v1/cards/42/files%2e%2e", "/api/v1/cards/42/files%20",
    "/api/v1/cards/42/files%20%20", "/api/v1/cards/42/files.%20", "/api/v1/cards/42/files%20.",
    "/api/v1/cards/42./files", "/api/v1/cards/42%20/files", "/api/v1/cards./42/files", "/api/v1%2e/cards/42/files",
    "/api/v1/cards%20/42/files", "/api/v1/cards/42/files./", "/api/v1/cards/42/files%2e/",
    "/api/v1/cards/42/comments./7", "/api/v1/cards/42/comments%20/7", "/api/v1/cards/42/comments.",
    "/api/v1/cards/42/comments%20", "/api/v1/cards/42/comments%2e",
]


@pytest.mark.parametrize("target", TRAILING)
async def test_a_segment_ending_in_a_dot_or_a_space_is_refused(
    gateway: Proc, upstream: RecordingUpstream, target: str
) -> None:
    method = "PATCH" if "comments" in target and target.rstrip("/").split("/")[-1] == "7" else (
        "POST" if "comments" in target else "PUT")
    data, closed = await exchange(gateway.port, request(
        method, target, [("Content-Type", f"multipart/form-data; boundary={B}")], FILE_BODY))
    ((status, headers, payload),) = parse_responses(data)
    assert (status, code(payload)) == (400, "BAD_PATH")
    assert "dot or a space" in json.loads(payload)["message"]
    assert headers["content-type"].startswith("application/json")
    assert upstream.received == []


@pytest.mark.parametrize("target", ["/api/v1/files/report.pdf", "/api/v1/a.b/c", "/.well-known/x",
                                    "/api/v1/cards/42/files/..", "/api/v1/cards/42/files/./x"])
async def test_dots_inside_segments_and_dot_segments_still_pass(
    gateway: Proc, upstream: RecordingUpstream, target: str
) -> None:
    data, _ = await exchange(gateway.port, request("GET", target))
    ((status, _, _),) = parse_responses(data)
    assert status == 200
    assert len(upstream.received) == 1


async def test_a_trailing_dot_is_refused_on_every_route_not_only_the_guarded_ones(
    gateway: Proc, upstream: RecordingUpstream
) -> None:
    data, _ = await exchange(gateway.port, request("GET", "/api/v1/boards/1."))
    ((status, _, payload),) = parse_responses(data)
    assert (status, code(payload)) == (400, "BAD_PATH")
    assert upstream.received == []


# --- 2. An unsolicited 101 ----------------------------------------------------------------------------------------


class SwitchingUpstream:
    """A raw upstream: answers 101 to /switch (then writes bytes that are not HTTP), 200 to anything else."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.port = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                if head.split(b" ", 2)[1] == b"/switch":
                    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: nonsense\r\nConnection: Upgrade\r\n\r\n"
                                 b"\x00\x01binary protocol bytes\r\n\r\n")
                    await writer.drain()
                    await reader.read()  # until the gateway lets the connection go
                    break
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def switching() -> AsyncIterator[SwitchingUpstream]:
    upstream = SwitchingUpstream()
    upstream.server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    upstream.port = upstream.server.sockets[0].getsockname()[1]
    yield upstream
    upstream.server.close()


async def test_an_unsolicited_101_is_a_502_and_the_connection_stays_usable(
    switching: SwitchingUpstream, tmp_path: Path
) -> None:
    gw = await start(make_config(f"http://127.0.0.1:{switching.port}", access_log={"enabled": True}), tmp_path)
    try:
        data, closed = await exchange(gw.port, request("GET", "/switch", close=False)
                                      + request("GET", "/after"), timeout=5)
        first, second = parse_responses(data)
        assert (first[0], code(first[2])) == (502, "UPSTREAM_UPGRADE")
        assert "upgrade" not in first[1] and first[1].get("connection") != "Upgrade"
        assert second[0] == 200 and second[2] == b"ok"  # the next request on the client's connection is served
        assert closed
        assert [h.split(b" ", 2)[1] for h in switching.heads] == [b"/switch", b"/after"]
        assert all(b"upgrade" not in h.lower() for h in switching.heads)  # the gateway asked for no upgrade

        async def logged() -> bool:
            return any(line.get("path") == "/switch" for line in gw.access_lines())

        await wait_for(logged)
        (record,) = [line for line in gw.access_lines() if line.get("path") == "/switch"]
        assert record["status"] == 502 and record["upstream_error"] == "other: unsolicited 101"
    finally:
        gw.stop()


# --- 3. Upgrade requests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("upgrade", ["h2c", "websocket", "TLS/1.2", "anything"])
async def test_an_upgrade_request_is_answered_plainly_and_a_pipelined_request_does_not_hang(
    gateway: Proc, upstream: RecordingUpstream, upgrade: str
) -> None:
    first = request("GET", "/api/v1/boards/1", [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", upgrade),
                                                ("HTTP2-Settings", "AAMAAABkAAQAAP__")], close=False)
    data, closed = await exchange(gateway.port, first + request("GET", "/api/v1/boards/2"), timeout=5)
    assert closed  # no hang: the gateway closes once it has answered
    responses = parse_responses(data)
    assert responses[0][0] == 200 and responses[0][1]["connection"] == "close"
    assert len(responses) == 1  # the pipelined request is not answered: its client sends it again on a new connection
    (received,) = upstream.received
    assert received.raw_path == "/api/v1/boards/1"
    assert received.header("Upgrade") is None and received.header("HTTP2-Settings") is None


async def test_an_upgrade_request_with_a_body_is_forwarded_whole(gateway: Proc, upstream: RecordingUpstream) -> None:
    body = b'{"text": "x"}' * 1000
    data, closed = await exchange(gateway.port, request("POST", "/api/v1/cards/1/comments",
                                                        [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                                         ("Content-Type", "application/json")], body, close=False))
    ((status, _, _),) = parse_responses(data)
    assert status == 200 and closed
    (received,) = upstream.received
    assert received.body == body and received.header("Upgrade") is None


# --- 4. Transfer codings and Content-Length ------------------------------------------------------------------------


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize(("coding", "expected"), [
    ("gzip, chunked", "BAD_TRANSFER_ENCODING"), ("deflate, chunked", "BAD_TRANSFER_ENCODING"),
    ("identity, chunked", "BAD_TRANSFER_ENCODING"), ("x-custom, chunked", "BAD_TRANSFER_ENCODING"),
    ("GZIP,chunked", "BAD_TRANSFER_ENCODING"),
    ("chunked, chunked", "MALFORMED_REQUEST"),  # already refused by the HTTP parser (RFC 9112 6.1)
])
@pytest.mark.parametrize("target", ["/api/v1/cards/1/comments", "/api/v1/cards", "/anything/else"])
async def test_transfer_codings_other_than_chunked_alone_are_refused_on_every_route(
    gateway: Proc, upstream: RecordingUpstream, coding: str, expected: str, target: str
) -> None:
    data, closed = await exchange(gateway.port, request("POST", target, [("Transfer-Encoding", coding),
                                                                         ("Content-Type", "application/json")])
                                  + chunked(b'{"a": 1}'))
    ((status, _, payload),) = parse_responses(data)
    assert (status, code(payload)) == (400, expected)
    assert closed
    assert upstream.received == []


async def test_gzip_chunked_is_refused_by_the_edge_with_its_own_code(gateway: Proc, upstream: RecordingUpstream) -> None:
    data, _ = await exchange(gateway.port, request("POST", "/api/v1/cards", [("Transfer-Encoding", "gzip, chunked")])
                             + chunked(b"\x1f\x8b\x08\x00"))
    ((status, _, payload),) = parse_responses(data)
    assert (status, code(payload)) == (400, "BAD_TRANSFER_ENCODING")
    assert upstream.received == []


async def test_chunked_alone_still_passes(gateway: Proc, upstream: RecordingUpstream) -> None:
    data, _ = await exchange(gateway.port, request("POST", "/api/v1/cards", [("Transfer-Encoding", "Chunked")])
                             + chunked(b'{"title": "x"}'))
    ((status, _, _),) = parse_responses(data)
    assert status == 200
    assert upstream.received[0].body == b'{"title": "x"}'


@pytest.mark.parametrize("spelled", ["05", "0005", "+5"])
async def test_content_length_reaches_the_upstream_normalised(
    gateway: Proc, upstream: RecordingUpstream, spelled: str
) -> None:
    data, _ = await exchange(gateway.port, request("POST", "/api/v1/cards", [("Content-Length", spelled)], b"hello"))
    ((status, _, payload),) = parse_responses(data)
    if spelled.startswith("+"):  # not a valid Content-Length (RFC 9110 8.6: 1*DIGIT): refused by the HTTP parser
        assert status == 400 and upstream.received == []
        return
    assert status == 200
    (received,) = upstream.received
    assert received.headers_all("Content-Length") == ["5"] and received.body == b"hello"


# --- 5. Forwarding headers ----------------------------------------------------------------------------------------

CLAIMS = [("X-Forwarded-For", "1.1.1.1"), ("X-Forwarded-For", "2.2.2.2, 3.3.3.3"), ("Forwarded", "for=6.6.6.6"),
          ("X-Real-IP", "7.7.7.7"), ("X-Client-IP", "8.8.8.8"), ("X-Forwarded-Proto", "https"),
          ("X-Forwarded-Host", "evil.test")]


async def _forwarded(upstream: RecordingUpstream, tmp_path: Path, **server: Any) -> RecordingUpstream:
    gw = await start({**make_config(upstream.url), "server": server}, tmp_path)
    try:
        data, _ = await exchange(gw.port, request("GET", "/api/v1/boards/1", CLAIMS))
        assert parse_responses(data)[0][0] == 200
    finally:
        gw.stop()
    return upstream


async def test_an_untrusted_client_cannot_claim_an_address(upstream: RecordingUpstream, tmp_path: Path) -> None:
    (received,) = (await _forwarded(upstream, tmp_path)).received
    assert received.headers_all("X-Forwarded-For") == ["1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"]
    assert received.headers_all("Forwarded") == []
    assert received.headers_all("X-Real-IP") == [] and received.headers_all("X-Client-IP") == []
    assert received.headers_all("X-Forwarded-Proto") == ["http"]
    assert received.headers_all("X-Forwarded-Host") == ["127.0.0.1"]


async def test_the_gateway_emits_its_own_forwarded_element_when_configured(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    (received,) = (await _forwarded(upstream, tmp_path, forwarded_header=True)).received
    assert received.headers_all("Forwarded") == ['for=127.0.0.1;proto=http;host="127.0.0.1"']
    assert received.headers_all("X-Real-IP") == []


async def test_a_trusted_hop_keeps_the_claims_and_appends_to_them(upstream: RecordingUpstream, tmp_path: Path) -> None:
    (received,) = (await _forwarded(upstream, tmp_path, trust_forwarded_headers=True, forwarded_header=True)).received
    assert received.headers_all("X-Forwarded-For") == ["1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"]
    assert received.headers_all("Forwarded") == ['for=6.6.6.6, for=127.0.0.1;proto=http;host="127.0.0.1"']
    assert received.headers_all("X-Real-IP") == ["7.7.7.7"] and received.headers_all("X-Client-IP") == ["8.8.8.8"]
    assert received.headers_all("X-Forwarded-Proto") == ["https"]
    assert received.headers_all("X-Forwarded-Host") == ["evil.test"]
