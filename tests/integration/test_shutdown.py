"""SIGTERM through a real gateway process: every exchange in flight finishes (uploads still being sent, downloads
still being received, bodies a policy holds), only what still runs at shutdown_timeout is cut, and it is logged as
such; the process exits as soon as nothing is in flight."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.gateway_testlib import Received, RecordingUpstream, guarded_routes, multipart_body
from tests.process_testlib import Proc, start, wait_for

SIZE = 2 * 1024 * 1024
PIECE = 64 * 1024
B = "shutd0wn-b0undary"


def _config(upstream: str, **server: Any) -> dict[str, Any]:
    return {
        "server": {"shutdown_timeout": 10, **server},
        "tenants": [
            {"name": "acme", "hosts": ["127.0.0.1"], "upstream": upstream, "created": "2026-06-01"},
            # Before 2026-05-21: the forbid setting is off, so legacy uploads pass (and are watched).
            {"name": "legacy", "hosts": ["legacy.test"], "upstream": upstream, "created": "2025-01-01"},
        ],
        "routes": guarded_routes(),
    }


@pytest.fixture
async def gateway(upstream: RecordingUpstream, tmp_path: Path) -> AsyncIterator[Proc]:
    proc = await start(_config(upstream.url), tmp_path)
    yield proc
    proc.stop()


async def _exited(proc: Proc, timeout: float) -> int:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, proc.proc.wait, timeout)


def _upload(kind: str) -> tuple[str, str, str | None, bytes]:
    """(method, path, host, body) of an upload of about SIZE bytes."""
    payload = os.urandom(SIZE)
    if kind == "restricted":
        part = (['Content-Disposition: form-data; name="file"; filename="big.bin"'], payload)
        return "POST", "/api/v1/cards/0b9a6a4e-5c1d-4e7f-9a2b-3c4d5e6f7a8b/files", None, multipart_body([part], B)
    if kind == "legacy_put":
        return "PUT", "/api/v1/cards/7/files", "legacy.test", payload
    part = (['Content-Disposition: form-data; name="files[]"; filename="big.bin"'], payload)
    return "POST", "/api/v1/cards/7/comments", "legacy.test", multipart_body([part], B)


@pytest.mark.parametrize("expect", [False, True], ids=["plain", "expect-100"])
@pytest.mark.parametrize("kind", ["restricted", "legacy_put", "legacy_comment"])
async def test_sigterm_lets_an_upload_in_progress_finish(
    gateway: Proc, upstream: RecordingUpstream, kind: str, expect: bool
) -> None:
    method, path, host, body = _upload(kind)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or '127.0.0.1'}", f"Content-Length: {len(body)}",
             "X-Request-Id: upload-1"]
    if body.startswith(b"--"):
        lines.append(f"Content-Type: multipart/form-data; boundary={B}")
    if expect:
        lines.append("Expect: 100-continue")
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    if expect:
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100")
    started = time.monotonic()
    for i in range(0, len(body), PIECE):
        writer.write(body[i : i + PIECE])
        await writer.drain()
        if i == 4 * PIECE:
            gateway.proc.send_signal(signal.SIGTERM)  # mid-upload: about 1/8 of the body sent
        await asyncio.sleep(0.02)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"Connection: close" in head  # the gateway is stopping: no further request on this connection
    got = upstream.received[-1]
    assert got.body_complete and got.body_size == len(body)
    assert got.body_sha256 == hashlib.sha256(body).hexdigest()
    # It exits once nothing is in flight, long before shutdown_timeout (10 s) would have run out.
    assert await _exited(gateway, 8) == 0
    assert time.monotonic() - started < 8
    (line,) = [entry for entry in gateway.access_lines() if entry["request_id"] == "upload-1"]
    assert line["status"] == 200 and "notes" not in line


async def test_sigterm_lets_a_download_in_progress_finish(gateway: Proc, upstream: RecordingUpstream) -> None:
    payload = os.urandom(SIZE)

    async def slow(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(len(payload))})
        await resp.prepare(request)
        for i in range(0, len(payload), PIECE):
            await resp.write(payload[i : i + PIECE])
            await asyncio.sleep(0.02)
        return resp

    upstream.responder = slow
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"GET /api/v1/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    gateway.proc.send_signal(signal.SIGTERM)
    got = await asyncio.wait_for(reader.readexactly(len(payload)), 15)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert await _exited(gateway, 8) == 0


async def test_what_still_runs_at_the_deadline_is_cut_and_logged(upstream: RecordingUpstream, tmp_path: Path) -> None:
    gw = await start(_config(upstream.url, shutdown_timeout=1), tmp_path)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"PUT /api/v1/slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: too-slow\r\n"
                     b"Content-Length: 1000000\r\n\r\n" + b"x" * 1000)
        await writer.drain()

        async def upstream_reading() -> bool:
            return upstream.body_started.is_set()

        await wait_for(upstream_reading)
        sent_at = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        assert await _exited(gw, 10) == 0
        assert time.monotonic() - sent_at < 5  # the 1 s deadline, then the cut
        (line,) = [entry for entry in gw.access_lines() if entry["request_id"] == "too-slow"]
        assert line["notes"] == {"cut": "shutdown"} and line["status"] == 503
        assert "cutting 1 request(s) still in flight" in gw.log.read_text()
        writer.close()
    finally:
        gw.stop()
