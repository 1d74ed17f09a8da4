"""Fixtures of the adversarial corpora: the guarded gateway in front of an upstream that counts connections."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import CountingUpstream, GatewayFactory, RunningGateway, guarded_routes, make_config, read_answer

__all__ = ("send_raw",)


@pytest.fixture
async def guarded_gw(counting_upstream: CountingUpstream, start_gateway: GatewayFactory) -> RunningGateway:
    """Tenant ``acme`` (Host 127.0.0.1) has the forbid setting on; ``oldco`` (Host old.test) has it off."""
    return await start_gateway(make_config(counting_upstream.url, routes=guarded_routes()))


async def send_raw(port: int, data: bytes, *, wait_for_continue: bool = False, timeout: float = 5.0) -> bytes:
    """Send ``data`` and return everything answered until the gateway closes the connection.

    With ``wait_for_continue`` only the head is sent first; the body follows once ``100 Continue`` arrives (or is
    never sent if a final answer comes instead).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()
    try:
        if wait_for_continue:
            head, sep, body = data.partition(b"\r\n\r\n")
            writer.write(head + sep)
            await writer.drain()
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            received += first
            if first.startswith(b"HTTP/1.1 100 "):
                writer.write(body)
                await writer.drain()
        else:
            writer.write(data)
            await writer.drain()
        received += await read_answer(reader, timeout)
    finally:
        writer.close()
    return bytes(received)
