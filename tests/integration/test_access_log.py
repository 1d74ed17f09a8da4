"""The access log and request metrics: one JSON line per request, nothing secret in it."""

from __future__ import annotations

import io
import json

import aiohttp

from gateway.ops.access_log import AccessLogWriter
from tests.gateway_testlib import GatewayFactory, LineCollector, RecordingUpstream, make_config, raw_exchange


async def test_access_log_lines_and_redaction(upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    collect = LineCollector()
    gw = await start_gateway(make_config(upstream.url, access_log={"enabled": True}), access_log=collect)
    async with aiohttp.ClientSession() as client:
        headers = {"Authorization": "Bearer very-secret-token", "Cookie": "session=cookie-secret"}
        url = gw.url + "/api/v1/cards/abc/files/f1?redirect=true&signature=sig-secret&expires=99"
        async with client.get(url, headers=headers) as resp:
            assert resp.status == 200
        async with client.post(gw.url + "/api/latest/boards/1", headers={"X-HTTP-Method-Override": "GET"}) as resp:
            assert resp.status == 200
    data = await raw_exchange(gw.port, b"GET /a%2fb?token=q-secret HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout=1)
    assert data.startswith(b"HTTP/1.1 400")
    records = [json.loads(line) for line in collect.lines]
    assert len(records) == 3
    first, second, refused = records
    assert first["path"] == "/api/v1/cards/abc/files/f1"
    assert first["status"] == 200 and first["tenant"] == "acme" and first["route"] == "catch_all"
    assert len(first["client"]) == 12 and len(first["request_id"]) == 32
    assert first["upstream_duration"] is not None and first["duration"] >= first["upstream_duration"]
    assert second["route"] == "board" and second["method"] == "POST" and second["effective_method"] == "GET"
    assert refused["refused"] == "BAD_PATH" and refused["status"] == 400 and refused["route"] == "none"
    text = "\n".join(collect.lines)
    for secret in ("very-secret-token", "Bearer", "cookie-secret", "sig-secret", "signature", "q-secret"):
        assert secret not in text
    assert gw.metrics.registry.get_sample_value(
        "gateway_requests_total", {"route": "board", "method": "GET", "status_class": "2xx"}
    ) == 1  # the effective method
    assert gw.metrics.registry.get_sample_value("gateway_refused_requests_total", {"code": "BAD_PATH"}) == 1
    assert gw.metrics.registry.get_sample_value("gateway_requests_in_flight") == 0


async def test_writer_batches_lines_and_flushes_on_time_and_size() -> None:
    import asyncio

    stream = io.StringIO()
    writer = AccessLogWriter(stream, interval=0.05, limit=100)
    writer.write('{"a":1}')
    writer.write('{"b":2}')
    assert stream.getvalue() == ""
    loop = asyncio.get_running_loop()
    waited = loop.time()
    while not stream.getvalue() and loop.time() - waited < 5:  # the timer flushes the lines after its interval
        await asyncio.sleep(0.01)
    assert stream.getvalue() == '{"a":1}\n{"b":2}\n'
    assert loop.time() - waited >= 0.04  # and not before it
    writer.write("x" * 150)
    assert stream.getvalue().endswith("x" * 150 + "\n")
    writer.write("tail")
    writer.flush()
    assert stream.getvalue().endswith("tail\n")
