"""One honest record per request, on every path, through a real gateway process: a few hundred each of downloads the
client abandons, downloads the upstream breaks off, and requests refused before routing. The access log and the
metrics are compared with what the clients saw."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.gateway_testlib import Received, RecordingUpstream
from tests.process_testlib import Proc, start, wait_for

BODY = os.urandom(256 * 1024)
# What an abandoned download is offered: more than loopback's socket buffers take, and sent slowly (about a second),
# so that the gateway cannot have written all of it before the client leaves, however late the client is scheduled.
DOWNLOAD = os.urandom(8 * 1024 * 1024)
N = 200


@pytest.fixture
async def gateway(upstream: RecordingUpstream, tmp_path: Path) -> AsyncIterator[Proc]:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        body = DOWNLOAD if received.raw_path.startswith("/download/") else BODY
        resp = web.StreamResponse(headers={"Content-Length": str(len(body))})
        await resp.prepare(request)
        if received.raw_path.startswith("/broken/"):
            await resp.write(BODY[:10_000])
            await asyncio.sleep(0.01)
            assert request.transport is not None
            request.transport.abort()  # the upstream breaks off after 10,000 bytes of the body
            return resp
        for i in range(0, len(body), 16_384):
            await resp.write(body[i : i + 16_384])
            await asyncio.sleep(0.002)
        return resp

    upstream.responder = responder
    data = {"tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": upstream.url}]}
    proc = await start(data, tmp_path)
    yield proc
    proc.stop()


async def _exchange(gw: Proc, path: str, rid: str, *, read: int | None) -> int:
    """Send a GET and read at most ``read`` bytes of the answer (all of it, until the gateway closes, when None);
    then go away. Returns the bytes received."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: {rid}\r\nConnection: close\r\n\r\n".encode())
    got = 0
    try:
        while read is None or got < read:
            chunk = await reader.read(4096 if read is None else min(4096, read - got))
            if not chunk:
                break
            got += len(chunk)
    except ConnectionError:
        pass
    writer.transport.abort()
    return got


async def test_every_request_leaves_one_record_that_matches_what_the_client_saw(gateway: Proc) -> None:
    gw = gateway
    received: dict[str, int] = {}

    async def batch(kind: str, path: str, read: int | None) -> None:
        for first in range(0, N, 50):
            rids = [f"{kind}-{i}" for i in range(first, first + 50)]
            counts = await asyncio.gather(*(_exchange(gw, f"{path}/{rid}", rid, read=read) for rid in rids))
            received.update(zip(rids, counts, strict=True))

    await batch("abandoned", "/download", 20_000)  # the client reads the head and some body, then leaves
    await batch("broken", "/broken", None)  # the upstream breaks off; the client reads until the gateway closes
    await batch("refused", "/bad%2Fpath", None)  # refused before routing

    async def all_recorded() -> bool:
        return len(gw.access_lines()) >= 3 * N

    await wait_for(all_recorded, 20)

    async def settled() -> bool:
        return (await gw.metrics()).get(("gateway_requests_in_flight", ())) == 0.0

    await wait_for(settled, 10)
    lines = gw.access_lines()
    assert len(lines) == 3 * N  # exactly one line per request, no other line
    refused = [line for line in lines if "refused" in line]
    routed = [line for line in lines if "refused" not in line]
    assert len(refused) == N and Counter(line["request_id"] for line in routed) == Counter(
        rid for rid in received if not rid.startswith("refused"))  # fmt: skip
    # Refused before routing, no policy ran: the gateway made the request id; the answers are all the same size.
    refused_sizes = {received[rid] for rid in received if rid.startswith("refused")}
    for line in refused:
        assert line["status"] == 400 and line["refused"] == "BAD_PATH", line
        assert {line["bytes_out"]} == refused_sizes
    for line in routed:
        kind = line["request_id"].split("-")[0]
        got = received[line["request_id"]]
        if kind == "abandoned":
            assert line["status"] == 499, line
            assert line["bytes_out"] >= got  # what it wrote, at least what the client read before leaving
        elif kind == "broken":
            assert line["status"] == 200 and line["upstream_error"] == "body_reset", line
            assert line["bytes_out"] == got  # the client read all the gateway wrote, head and 10,000 body bytes
            assert got < len(BODY)
    metrics = await gw.metrics()

    def requests(status_class: str, route: str = "catch_all") -> float:
        labels = (("method", "GET"), ("route", route), ("status_class", status_class))
        return metrics.get(("gateway_requests_total", labels), 0.0)

    assert requests("4xx") == N  # the 499s
    assert requests("2xx") == N  # the 200s the upstream broke off
    assert requests("4xx", route="none") == N  # refused before routing
    assert metrics[("gateway_upstream_errors_total", (("kind", "reset"),))] == N
    assert metrics[("gateway_refused_requests_total", (("code", "BAD_PATH"),))] == N
