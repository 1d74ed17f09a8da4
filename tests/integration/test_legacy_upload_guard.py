"""The legacy upload guard through real sockets: real clients, large bodies, metrics, the access log and the sandbox."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.policies.legacy_upload_guard import DISABLED_CODE
from sandbox.app import create_app
from sandbox.settings import DEFAULT_TOKEN
from sandbox.state import STORE
from tests.gateway_testlib import (
    CountingUpstream,
    GatewayFactory,
    LineCollector,
    RunningGateway,
    guarded_routes,
    make_config,
    multipart_body,
)

B = "int-B0undary"
MP = f"multipart/form-data; boundary={B}"
TEXT = (['Content-Disposition: form-data; name="text"'], b"hello")
FILE = (['Content-Disposition: form-data; name="files[]"; filename="a.bin"', "Content-Type: application/octet-stream"],
        b"\x00\x01binary")  # fmt: skip
MiB = 1 << 20


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


@pytest.fixture
async def ggw(counting_upstream: CountingUpstream, start_gateway: GatewayFactory) -> RunningGateway:
    return await start_gateway(make_config(counting_upstream.url, routes=guarded_routes()))


def _counter(gw: RunningGateway, route: str, decision: str) -> float:
    """Over every tenant (each request's tenant is its Host's)."""
    return sum(gw.metrics.registry.get_sample_value("gateway_legacy_uploads_total",
                                                    {"tenant": tenant, "route": route, "decision": decision}) or 0.0
               for tenant in ("acme", "oldco"))


async def test_blocked_put_gets_the_spec_403(
    ggw: RunningGateway, counting_upstream: CountingUpstream, client: aiohttp.ClientSession
) -> None:
    form = aiohttp.FormData()
    form.add_field("file", io.BytesIO(b"content"), filename="a.txt", content_type="text/plain")
    async with client.put(ggw.url + "/api/v1/cards/42/files", data=form, headers={"X-Request-Id": "rid-7"}) as resp:
        assert resp.status == 403
        assert resp.content_type == "application/json"
        assert await resp.json() == {
            "code": DISABLED_CODE,
            "message": "Uploading files outside restricted file access is disabled for the public API by company "
            "settings.",
            "request_id": "rid-7",
            "replacement": "POST /api/v1/cards/42/files",
        }
        assert resp.headers["X-Request-Id"] == "rid-7"
        assert resp.headers["Deprecation"] == "@1779321600"
        # The successor is the request's own URL (it differs by method only): no Link a client could follow.
        assert "Link" not in resp.headers
    assert counting_upstream.received == [] and counting_upstream.connections == 0
    assert _counter(ggw, "legacy_card_file_upload", "blocked") == 1


async def test_comment_routes_with_real_clients(
    ggw: RunningGateway, counting_upstream: CountingUpstream, client: aiohttp.ClientSession
) -> None:
    text_only = aiohttp.FormData(default_to_multipart=True)
    text_only.add_field("text", "just words")
    async with client.post(ggw.url + "/api/v1/cards/1/comments", data=text_only) as resp:
        assert resp.status == 200
        echoed = await resp.json()
    sent = counting_upstream.received[-1]
    assert echoed["size"] == sent.body_size and sent.method == "POST"
    assert b"just words" in sent.body

    with_file = aiohttp.FormData()
    with_file.add_field("text", "see attachment")
    with_file.add_field("files[]", io.BytesIO(b"x" * 10_000), filename="x.bin")
    async with client.patch(ggw.url + "/api/latest/cards/1/comments/5", data=with_file) as resp:
        assert resp.status == 403
        body = await resp.json()
    assert body["code"] == DISABLED_CODE
    assert body["replacement"] == "POST /api/v1/cards/1/comments/5/files"
    assert resp.headers["Link"] == '</api/v1/cards/1/comments/5/files>; rel="successor-version"'
    async with client.post(ggw.url + "/api/v1/cards/1/comments", data=with_file) as resp:
        assert resp.status == 403
        body = await resp.json()
    # The comment to upload to does not exist yet: the placeholder stays.
    assert body["replacement"] == "POST /api/v1/cards/1/comments/{comment_uid}/files"
    # ... and so no successor Link: it would not be a URL a client can follow.
    assert "Link" not in resp.headers
    assert len(counting_upstream.received) == 1
    assert _counter(ggw, "legacy_comment_update", "blocked") == 1
    assert _counter(ggw, "legacy_comment_create", "blocked") == 1


async def test_forbid_off_streams_uploads_through_and_marks_them(
    ggw: RunningGateway, counting_upstream: CountingUpstream, client: aiohttp.ClientSession
) -> None:
    payload = os.urandom(8 * MiB)

    async def body() -> AsyncIterator[bytes]:
        yield f'--{B}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n'.encode()
        for i in range(0, len(payload), MiB):
            yield payload[i : i + MiB]
        yield f"\r\n--{B}--\r\n".encode()

    expected = hashlib.sha256(
        f'--{B}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n'.encode()
        + payload + f"\r\n--{B}--\r\n".encode()
    ).hexdigest()  # fmt: skip
    headers = {"Host": "old.test", "Content-Type": MP}
    async with client.put(ggw.url + "/api/v1/cards/3/files", data=body(), headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Deprecation"] == "@1779321600"
        assert "Link" not in resp.headers
    got = counting_upstream.received[-1]
    assert got.body_sha256 == expected and got.method == "PUT"
    async with client.post(ggw.url + "/api/v1/cards/3/comments", data=body(), headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Deprecation"] == "@1779321600"
    assert counting_upstream.received[-1].body_sha256 == expected
    assert _counter(ggw, "legacy_card_file_upload", "allowed") == 1
    assert _counter(ggw, "legacy_comment_create", "allowed") == 1


async def test_expect_continue_put_is_answered_without_continue(
    ggw: RunningGateway, counting_upstream: CountingUpstream, client: aiohttp.ClientSession
) -> None:
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(64):
            sent += MiB
            yield b"x" * MiB

    headers = {"Content-Type": MP, "Content-Length": str(64 * MiB)}
    async with client.put(ggw.url + "/api/v1/cards/1/files", data=body(), headers=headers, expect100=True) as resp:
        assert resp.status == 403
        assert (await resp.json())["code"] == DISABLED_CODE
    assert sent == 0  # the client was never invited to send the body
    assert counting_upstream.connections == 0


async def test_refusals_are_counted_and_logged(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory, client: aiohttp.ClientSession
) -> None:
    collect = LineCollector()
    config = make_config(counting_upstream.url, routes=guarded_routes(), access_log={"enabled": True})
    gw = await start_gateway(config, access_log=collect)
    body = multipart_body([TEXT], B).replace(b"\r\n", b"\n")
    async with client.post(gw.url + "/api/v1/cards/1/comments", data=body, headers={"Content-Type": MP}) as resp:
        assert resp.status == 400
        answer = await resp.json()
    async with client.post(gw.url + "/api/v1/cards/1/comments", data=b"{}",
                           headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
        assert resp.status == 200
    records: list[dict[str, Any]] = [json.loads(line) for line in collect.lines]
    assert answer["code"] == "LEGACY_UPLOAD_AMBIGUOUS" and answer["rule"] == "line_endings"
    assert _counter(gw, "legacy_comment_create", "refused") == 1
    assert len(counting_upstream.received) == 1
    decisions = [r.get("decisions") for r in records if r["route"] == "legacy_comment_create"]
    assert decisions == [{"legacy_upload_guard": "refused"}, {"legacy_upload_guard": "passed"}]


# --- large bodies through a raw socket ----------------------------------------------------------------------------


@dataclass
class UploadResult:
    seconds_to_answer: float | None  # from the end of the request head to the whole answer
    answer: bytes
    acked: int  # body bytes the gateway's TCP stack accepted: an upper bound of what the gateway read
    error: str | None


def _acked(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("<Q", info, 120)[0])  # tcpi_bytes_acked (Linux)


def upload(port: int, head: bytes, total: int, *, read_while_sending: bool = True) -> UploadResult:
    """Send ``head`` then ``total`` body bytes as fast as possible, like curl: stop once a whole answer is in."""
    import select

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(head)
    start = time.monotonic()
    head_acked = _acked(sock)
    block = memoryview(b"\0" * (256 << 10))
    answer = b""
    sent = 0
    error = None
    seconds = None
    sock.setblocking(False)
    try:
        while True:
            want_write = sent < total
            readable, writable, _ = select.select([sock] if read_while_sending or not want_write else [],
                                                  [sock] if want_write else [], [], 10)  # fmt: skip
            if not readable and not writable:
                error = "stalled"
                break
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
                head_end = answer.find(b"\r\n\r\n")
                if head_end != -1 and seconds is None:
                    length = int(answer.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    if len(answer) >= head_end + 4 + length:
                        seconds = time.monotonic() - start
                        break
            if writable:
                try:
                    sent += sock.send(block[: min(len(block), total - sent)])
                except OSError as err:
                    error = type(err).__name__
                    read_while_sending = True
    finally:
        acked = _acked(sock) - head_acked
        if seconds is None:
            sock.setblocking(True)
            sock.settimeout(2)
            try:
                while data := sock.recv(65536):
                    answer += data
            except OSError as err:
                error = f"{error} then {type(err).__name__}"
        sock.close()
    return UploadResult(seconds, answer, acked, error)


def _put_head(total: int, target: str = "/api/v1/cards/1/files") -> bytes:
    return (f"PUT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {MP}\r\n"
            f"Content-Length: {total}\r\n\r\n").encode()  # fmt: skip


def _comment_head(total: int) -> bytes:
    first = multipart_body([TEXT, FILE], B, close=b"")[: -len(f"--{B}")]
    return (f"POST /api/v1/cards/1/comments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {MP}\r\n"
            f"Content-Length: {total + len(first)}\r\n\r\n").encode() + first  # fmt: skip


def _assert_full_403(result: UploadResult) -> None:
    head, _, body = result.answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 "), result
    assert b"Connection: close" in head
    assert json.loads(body)["code"] == DISABLED_CODE


@pytest.mark.parametrize("head", [_put_head, _comment_head], ids=["put", "comment"])
async def test_client_reads_the_403_while_sending_64_mib(
    ggw: RunningGateway, counting_upstream: CountingUpstream, head: Callable[[int], bytes]
) -> None:
    result = await asyncio.to_thread(upload, ggw.port, head(64 * MiB), 64 * MiB)
    _assert_full_403(result)
    assert result.seconds_to_answer is not None and result.seconds_to_answer < 1
    assert result.acked < 32 * MiB
    assert counting_upstream.connections == 0


async def test_client_that_only_reads_after_sending_still_gets_the_403(
    ggw: RunningGateway, counting_upstream: CountingUpstream
) -> None:
    # It keeps writing after the answer: the gateway drops a bounded amount, then resets the connection. The
    # answer was sent (and half-closed) before that, so the client's kernel still holds it.
    result = await asyncio.to_thread(upload, ggw.port, _put_head(256 * MiB), 256 * MiB, read_while_sending=False)
    _assert_full_403(result)
    assert result.error is not None  # the write side was cut short...
    assert result.acked < 64 * MiB  # ...long before the end of the upload
    assert counting_upstream.connections == 0


@pytest.mark.slow
@pytest.mark.parametrize("reads", [True, False], ids=["reading-client", "blind-client"])
@pytest.mark.parametrize("head", [_put_head, _comment_head], ids=["put", "comment"])
async def test_blocked_1_gib_upload_costs_what_a_64_mib_one_costs(
    ggw: RunningGateway, counting_upstream: CountingUpstream, head: Callable[[int], bytes], reads: bool
) -> None:
    small = await asyncio.to_thread(upload, ggw.port, head(64 * MiB), 64 * MiB, read_while_sending=reads)
    large = await asyncio.to_thread(upload, ggw.port, head(1 << 30), 1 << 30, read_while_sending=reads)
    for result in (small, large):
        _assert_full_403(result)
        assert result.acked < 32 * MiB
        if reads:
            assert result.seconds_to_answer is not None and result.seconds_to_answer < 1
    assert abs(large.acked - small.acked) < 8 * MiB
    assert counting_upstream.connections == 0


# --- end to end, in front of the sandbox service ------------------------------------------------------------------


@pytest.fixture
async def sandbox_gw(aiohttp_server: Any, start_gateway: GatewayFactory) -> tuple[RunningGateway, web.Application]:
    app = create_app()
    server = await aiohttp_server(app)
    return await start_gateway(make_config(f"http://127.0.0.1:{server.port}", routes=guarded_routes())), app


async def test_sandbox_end_to_end(
    sandbox_gw: tuple[RunningGateway, web.Application], client: aiohttp.ClientSession
) -> None:
    gw, app = sandbox_gw
    store = app[STORE]
    card = next(c for c in store.all_cards() if not store.boards[c.board_id].private)
    auth = {"Authorization": f"Bearer {DEFAULT_TOKEN}"}
    before = len(store.legacy_files)

    def form(*fields: tuple[str, str | None]) -> aiohttp.FormData:
        data = aiohttp.FormData(default_to_multipart=True)
        for name, filename in fields:
            if filename is None:
                data.add_field(name, "some text")
            else:
                data.add_field(name, io.BytesIO(b"file body"), filename=filename)
        return data

    # The sandbox reads any part named files[] as a file, even without a filename: so does the guard.
    for fields in ([("file", "a.txt")], [("text", None), ("files[]", "b.txt")], [("text", None), ("files[]", None)]):
        method = "PUT" if fields[0][0] == "file" else "POST"
        path = "files" if method == "PUT" else "comments"
        async with client.request(method, f"{gw.url}/api/v1/cards/{card.id}/{path}", data=form(*fields),
                                  headers=auth) as resp:  # fmt: skip
            assert resp.status == 403, fields
    assert len(store.legacy_files) == before
    async with client.post(f"{gw.url}/api/v1/cards/{card.id}/comments", data=form(("text", None)), headers=auth) as resp:
        assert resp.status == 200
        assert (await resp.json())["text"] == "some text"
    # A company with the setting off keeps the deprecated routes, and is told they are deprecated.
    old = {**auth, "Host": "old.test"}
    async with client.put(f"{gw.url}/api/v1/cards/{card.id}/files", data=form(("file", "c.txt")), headers=old) as resp:
        assert resp.status == 200
        assert resp.headers["Deprecation"] == "@1779321600"
    assert len(store.legacy_files) == before + 1


async def test_stalled_upload_on_a_watched_route_times_out(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory
) -> None:
    """Setting off (old.test): the body streams through the proxy core, whose body timeout still ends a stall."""
    config = make_config(counting_upstream.url, routes=guarded_routes(),
                         server={"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "client_body_timeout": 0.5})
    gw = await start_gateway(config)
    body = multipart_body([TEXT], B)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"PATCH /api/v1/cards/1/comments/2 HTTP/1.1\r\nHost: old.test\r\nContent-Type: {MP}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:20])  # fmt: skip
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "CLIENT_BODY_TIMEOUT"


async def test_framing_broken_mid_body_is_never_forwarded(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory
) -> None:
    # aiohttp's parser drops a request body whose chunked framing breaks after its handler started, without telling
    # the reader: the guard's read timeout ends the wait.
    gw = await start_gateway(make_config(counting_upstream.url, routes=guarded_routes(body_read_timeout=0.3)))
    body = multipart_body([TEXT], B)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"POST /api/v1/cards/1/comments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {MP}\r\n"
                 f"Transfer-Encoding: chunked\r\n\r\n{20:x}\r\n".encode() + body[:20] + b"\r\n")  # fmt: skip
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.write(b"zz\r\n" + body[20:] + b"\r\n0\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["rule"] == "body_timeout"
    assert counting_upstream.connections == 0


@pytest.mark.parametrize(("now", "blocked"), [("2026-11-30T23:59:59+00:00", False), ("2026-12-01T00:00:01+00:00", True)])
async def test_staged_forbid_date_turns_the_guard_on(
    counting_upstream: CountingUpstream, start_gateway: GatewayFactory, client: aiohttp.ClientSession,
    now: str, blocked: bool,
) -> None:
    from gateway.rollout import FixedClock, parse_instant

    config = make_config(counting_upstream.url, routes=guarded_routes())
    config["tenants"][1].update(restricted_file_access=True, rollout={"forbid_legacy_uploads": "2026-12-01"})
    gw = await start_gateway(config, clock=FixedClock(parse_instant(now)))
    body = multipart_body([FILE], B)
    async with client.put(gw.url + "/api/v1/cards/1/files", data=body,
                          headers={"Host": "old.test", "Content-Type": MP}) as resp:
        assert resp.status == (403 if blocked else 200)
        if blocked:
            assert (await resp.json())["code"] == DISABLED_CODE
    assert _counter(gw, "legacy_card_file_upload", "blocked" if blocked else "allowed") == 1
