"""A form body's ``_method`` as the body streams (gateway/edge/method.py): what the corpus cannot show with
one write. A file part that starts streaming upstream before a later ``_method`` part arrives; large uploads that
carry no override pass whole; clients that stop while the edge reads the override reach no upstream.
Tenant ``acme`` (Host 127.0.0.1) has the forbid setting on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

from tests.gateway_testlib import CountingUpstream, RunningGateway, parse_responses, read_answer

B = "stream-B0undary"
FILE_HEAD = (f"--{B}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n"
             "Content-Type: application/octet-stream\r\n\r\n").encode()  # fmt: skip
CLOSE = f"\r\n--{B}--\r\n".encode()


def head(length: int, target: str = "/api/v1/cards/0d6c1a5e-3b7f-4c2a-9e8d-1f2a3b4c5d6e/files", ct: str = f"multipart/form-data; boundary={B}") -> bytes:
    return (f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ct}\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n").encode()  # fmt: skip


def method_part(value: bytes) -> bytes:
    return f"\r\n--{B}\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\n".encode() + value


async def _late_override(port: int, value: bytes, upstream: CountingUpstream) -> tuple[bytes, bytes]:
    """A file part, sent and on its way upstream, then a ``_method`` part naming ``value``: (the answer, the body)."""
    first = FILE_HEAD + b"f" * (256 << 10)
    tail = method_part(value) + CLOSE
    body = first + tail
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head(len(body)) + first)
        await writer.drain()
        # The file part is on its way upstream before the rest is sent.
        await asyncio.wait_for(upstream.body_started.wait(), 5)
        writer.write(tail)
        await writer.drain()
        return await read_answer(reader, 5), body
    finally:
        writer.close()


async def test_a_late_override_breaks_the_streaming_upload_off(
    guarded_gw: RunningGateway, counting_upstream: CountingUpstream
) -> None:
    data, body = await _late_override(guarded_gw.port, b"PUT", counting_upstream)
    ((status, headers, answer),) = parse_responses(data)
    assert status == 400
    assert json.loads(answer)["code"] == "AMBIGUOUS_METHOD"
    assert json.loads(answer)["rule"] == "late_override"
    # The upstream saw the upload begin and never saw it end: no complete request reached it.
    await asyncio.sleep(0.2)
    assert [r.body_complete for r in counting_upstream.received] in ([], [False])
    assert all(r.body_size < len(body) for r in counting_upstream.received)


async def test_a_late_override_that_agrees_passes_whole(
    guarded_gw: RunningGateway, counting_upstream: CountingUpstream
) -> None:
    data, body = await _late_override(guarded_gw.port, b"POST", counting_upstream)
    ((status, _, _),) = parse_responses(data)
    assert status == 200
    (received,) = counting_upstream.received
    assert (received.method, received.body_complete) == ("POST", True)
    assert received.body_sha256 == hashlib.sha256(body).hexdigest()


async def test_a_large_upload_without_override_streams_whole(
    guarded_gw: RunningGateway, counting_upstream: CountingUpstream
) -> None:
    body = FILE_HEAD + bytes(range(256)) * (64 << 12) + CLOSE  # 64 MiB
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded_gw.port)
    try:
        writer.write(head(len(body)))
        for i in range(0, len(body), 1 << 20):
            writer.write(body[i : i + (1 << 20)])
            await writer.drain()
        ((status, _, _),) = parse_responses(await read_answer(reader, 30))
    finally:
        writer.close()
    assert status == 200
    (received,) = counting_upstream.received
    assert received.body_size == len(body)
    assert received.body_sha256 == hashlib.sha256(body).hexdigest()


async def test_a_client_that_stops_while_the_override_is_read_reaches_no_upstream(
    guarded_gw: RunningGateway, counting_upstream: CountingUpstream
) -> None:
    form = "application/x-www-form-urlencoded"
    for partial in (b"note=abc&_meth", b"note=" + b"x" * 100_000):
        reader, writer = await asyncio.open_connection("127.0.0.1", guarded_gw.port)
        writer.write(head(len(partial) + 50, "/api/v1/cards/1/files", form) + partial)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
    # The gateway still serves, and no request (not even a connection) went upstream for the stopped ones.
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded_gw.port)
    try:
        writer.write(head(11, "/api/v1/cards/1/files", form) + b"_method=PUT")
        await writer.drain()
        ((status, _, answer),) = parse_responses(await read_answer(reader, 5))
    finally:
        writer.close()
    assert status == 403
    assert json.loads(answer)["code"] == "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
    assert counting_upstream.connections == 0
