"""Large blocked uploads through a real gateway process: however the client behaves after the early 403 (reads it
and closes, closes before reading it, or keeps sending), each request leaves exactly one access-log line, one count
in the usage report, and the in-flight gauge comes back to 0. Nothing reaches the upstream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_testlib import CountingUpstream, guarded_routes, multipart_body
from tests.process_testlib import Proc, start, wait_for

MiB = 1 << 20
SIZE = 20 * MiB
CHUNK = b"\0" * (256 * 1024)
B = "bl0cked-b0undary"


@pytest.fixture
async def gateway(counting_upstream: CountingUpstream, tmp_path: Path) -> AsyncIterator[Proc]:
    data = {
        "tenants": [{"name": "acme", "hosts": ["127.0.0.1"], "upstream": counting_upstream.url, "created": "2026-06-01"}],
        "routes": guarded_routes(),
    }
    proc = await start(data, tmp_path)
    yield proc
    proc.stop()


def _head(method: str, path: str, rid: str, token: str, length: int, content_type: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"X-Request-Id: {rid}",
             f"Authorization: Bearer {token}", "User-Agent: legacy-uploader/1.0", f"Content-Length: {length}"]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _send_body(writer: asyncio.StreamWriter, prefix: bytes, size: int) -> None:
    """Send ``prefix`` then zeros up to ``size`` bytes; stop quietly when the gateway closes the connection."""
    with contextlib.suppress(ConnectionError):
        writer.write(prefix)
        sent = len(prefix)
        while sent < size:
            piece = CHUNK[: min(len(CHUNK), size - sent)]
            writer.write(piece)
            await writer.drain()
            sent += len(piece)


async def _read_status(reader: asyncio.StreamReader, timeout: float = 10) -> int | None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        return None
    return int(head.split(b" ", 2)[1])


Client = Callable[[Any, bytes, bytes], Awaitable[int | None]]


async def reads_then_closes(gw: Proc, head: bytes, prefix: bytes) -> int | None:
    """As curl does: sends while reading; on the answer, reads it and closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(head)
    sending = asyncio.create_task(_send_body(writer, prefix, SIZE))
    status = await _read_status(reader)
    sending.cancel()
    writer.transport.abort()
    with contextlib.suppress(asyncio.CancelledError):
        await sending
    return status


async def closes_before_reading(gw: Proc, head: bytes, prefix: bytes) -> int | None:
    """Sends the head and the start of the body, then goes away without reading anything."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(head + prefix + CHUNK * 4)
    await writer.drain()
    writer.transport.abort()
    return None


async def keeps_sending(gw: Proc, head: bytes, prefix: bytes) -> int | None:
    """Sends the whole body whatever happens, then reads what the gateway answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(head)
    await _send_body(writer, prefix, SIZE)
    status = await _read_status(reader)
    writer.close()
    return status


CLIENTS = {"reads_then_closes": reads_then_closes, "closes_before_reading": closes_before_reading,
           "keeps_sending": keeps_sending}


def _request(route: str, rid: str, token: str) -> tuple[bytes, bytes]:
    if route == "card":
        return _head("PUT", "/api/v1/cards/1/files", rid, token, SIZE, "application/octet-stream"), b""
    file_part = multipart_body([(['Content-Disposition: form-data; name="files[]"; filename="big.bin"'], b"")],
                               B, close=b"")  # the part's headers only: the file's bytes follow
    prefix = file_part[: file_part.index(b"\r\n\r\n") + 4]
    return _head("POST", "/api/v1/cards/1/comments", rid, token, SIZE,
                 f"multipart/form-data; boundary={B}"), prefix


@pytest.mark.parametrize("route", ["card", "comment"])
async def test_every_blocked_upload_is_recorded_once_however_the_client_behaves(
    gateway: Proc, counting_upstream: CountingUpstream, route: str
) -> None:
    gw = gateway
    done: list[str] = []
    for batch, (name, client) in enumerate(CLIENTS.items()):
        token = f"uploader-{name}"
        rids = [f"{route}-{name}-{i}" for i in range(5)]
        statuses = await asyncio.gather(*(client(gw, *_request(route, rid, token)) for rid in rids))
        if name == "reads_then_closes":
            assert statuses == [403] * 5, (name, statuses)  # each client got the spec's 403
        elif name == "keeps_sending":
            # The gateway stops reading after linger_bytes and closes: asyncio's reader then raises the reset before
            # handing over the 403 it had received (a client that reads while it sends, as above, gets it).
            assert set(statuses) <= {403, None}, statuses
        done += rids

        async def all_recorded() -> bool:
            return {line.get("request_id") for line in gw.access_lines()} >= set(done)

        await wait_for(all_recorded, 15)

        async def settled() -> bool:
            return (await gw.metrics()).get(("gateway_requests_in_flight", ())) == 0.0

        await wait_for(settled, 10)
        lines = [line for line in gw.access_lines() if line.get("request_id") in rids]
        assert sorted(line["request_id"] for line in lines) == sorted(rids), name  # exactly one line each
        for line in lines:
            assert line["decisions"] == {"legacy_upload_guard": "blocked"}
            assert line["bytes_out"] > 0 or line["status"] == 499
            assert line["status"] == 403 or (name == "closes_before_reading" and line["status"] == 499), line
        report = await gw.get_json("/deprecations?top=20")
        guard = report["behaviours"]["legacy_uploads"]
        assert guard["requests"] == len(done) and guard["by_decision"] == {"blocked": len(done)}
        rows = {row["client"]: row for row in guard["top_clients"]}
        assert sum(row["requests"] for row in rows.values()) == len(done)
        assert len(rows) == batch + 1 and all(row["requests"] == 5 for row in rows.values())
        assert all(row["user_agent"] == "legacy-uploader/1.0" for row in rows.values())
    # Every line the gateway wrote is one of these requests, once.
    assert sorted(line["request_id"] for line in gw.access_lines()) == sorted(done)
    assert counting_upstream.connections == 0
