"""The proxy core's services to a policy, through real sockets: requests of a policy's own to the tenant's upstream
(``Exchange.fetch``) and the client's body read by the policy itself (``Exchange.client_body``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.core.chain import fold
from gateway.core.exchange import BodyBroken, Exchange, Next, Policy, Reply, UpstreamFailed
from tests.gateway_testlib import (
    GatewayFactory,
    RecordingUpstream,
    free_port,
    make_config,
    parse_responses,
    raw_exchange,
)


def _route_through(gw: Any, policies: list[Policy]) -> None:
    gw.gateway.state.handlers["catch_all"] = fold(policies, gw.gateway.proxy)


async def test_a_policy_fetches_with_only_the_headers_it_passes(
    upstream: RecordingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(upstream.url))

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        got = await exchange.fetch("GET", "/api/latest/cards", query="board_id=1&limit=2&offset=0",
                                   headers={"Authorization": exchange.headers["Authorization"]})
        data = await got.read(1 << 20)
        return Reply.json(200, {"status": got.status, "upstream": json.loads(data)})

    _route_through(gw, [bridge])
    async with aiohttp.ClientSession() as client:
        async with client.get(gw.url + "/bridge/boards/1", headers={
            "Authorization": "Bearer t-1", "Cookie": "session=secret", "X-Request-Id": "rid-1"}) as resp:
            answer = await resp.json()
    assert answer == {"status": 200, "upstream": {"method": "GET", "path": "/api/latest/cards?board_id=1&limit=2&offset=0",
                                                  "size": 0, "sha256": hashlib.sha256(b"").hexdigest()}}
    (received,) = upstream.received
    names = {k.decode().lower() for k, _ in received.raw_headers}
    assert received.header("Authorization") == "Bearer t-1"
    assert "cookie" not in names  # nothing of the client's but what the policy passed
    assert received.header("Via") == "1.1 deprecation-gateway"
    assert received.header("X-Forwarded-For") == "127.0.0.1"


async def test_a_fetched_body_streams_and_a_bytes_body_is_sent_whole(
    upstream: RecordingUpstream, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config(upstream.url))
    payload = b"z" * 300_000

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        async def parts() -> AsyncIterator[bytes]:
            for i in range(0, len(payload), 65536):
                yield payload[i : i + 65536]

        streamed = await exchange.fetch("POST", "/up/streamed", body=parts(),
                                        headers={"Content-Type": "application/octet-stream"})
        whole = await exchange.fetch("PUT", "/up/whole", body=b"hello")
        return Reply.json(200, {"a": json.loads(await streamed.read(4096)), "b": json.loads(await whole.read(4096))})

    _route_through(gw, [bridge])
    async with aiohttp.ClientSession() as client, client.get(gw.url + "/x") as resp:
        answer = await resp.json()
    assert answer["a"]["size"] == len(payload) and answer["a"]["sha256"] == hashlib.sha256(payload).hexdigest()
    assert answer["b"]["size"] == 5
    streamed, whole = upstream.received
    assert streamed.header("Transfer-Encoding") == "chunked" and whole.header("Content-Length") == "5"


async def test_a_fetch_to_an_unreachable_upstream_raises_with_the_core_answer(start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config(f"http://127.0.0.1:{free_port()}"))
    seen: list[str] = []

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        try:
            await exchange.fetch("GET", "/cards")
        except UpstreamFailed as failed:
            seen.append(failed.kind)
            return failed.reply
        raise AssertionError("no failure")

    _route_through(gw, [bridge])
    async with aiohttp.ClientSession() as client, client.get(gw.url + "/x") as resp:
        body = await resp.json()
    assert seen == ["connect"] and resp.status == 502 and body["code"] == "UPSTREAM_UNAVAILABLE"


@pytest.mark.parametrize("target", [("/no spaces", ""), ("relative", ""), ("/ok", "a=1 2"), ("/\u00e9", "")])
async def test_a_fetch_target_must_be_on_the_wire_already(
    upstream: RecordingUpstream, start_gateway: GatewayFactory, target: tuple[str, str]
) -> None:
    gw = await start_gateway(make_config(upstream.url))
    errors: list[str] = []

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        try:
            await exchange.fetch("GET", target[0], query=target[1])
        except ValueError as err:
            errors.append(str(err))
        return Reply.json(200, {})

    _route_through(gw, [bridge])
    async with aiohttp.ClientSession() as client, client.get(gw.url + "/x") as resp:
        assert resp.status == 200
    assert errors and upstream.received == []


async def test_a_fetch_whose_body_breaks_off_does_not_mark_the_clients_request(start_gateway: GatewayFactory) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gw = await start_gateway(make_config(f"http://127.0.0.1:{port}"))
    errors: list[Any] = []

    async def bridge(exchange: Exchange, next: Next) -> Reply:
        got = await exchange.fetch("GET", "/page")
        try:
            await got.read(1 << 20)
        except Exception as err:  # BodyUnavailable: the reply became the core's 502
            errors.append((type(err).__name__, got.status, exchange.record.upstream_error))
        return Reply.json(200, {"fallback": True})

    _route_through(gw, [bridge])
    async with aiohttp.ClientSession() as client, client.get(gw.url + "/x") as resp:
        assert resp.status == 200 and await resp.json() == {"fallback": True}
    assert errors == [("BodyUnavailable", 502, None)]
    server.close()


async def test_a_policy_reads_the_clients_body_itself(upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config(upstream.url))

    async def consume(exchange: Exchange, next: Next) -> Reply:
        digest = hashlib.sha256()
        size = 0
        try:
            async for chunk in exchange.body.take_over():
                digest.update(chunk)
                size += len(chunk)
        except BodyBroken as broken:
            return broken.reply
        return Reply.json(200, {"size": size, "sha256": digest.hexdigest()})

    _route_through(gw, [consume])
    body = b"b" * 1_000_000
    async with aiohttp.ClientSession() as client:
        async with client.post(gw.url + "/x", data=body, headers={"Expect": "100-continue"}) as resp:
            assert await resp.json() == {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    assert upstream.received == []


async def test_a_body_that_stops_arriving_is_the_core_408(start_gateway: GatewayFactory, upstream: RecordingUpstream) -> None:
    config = make_config(upstream.url)
    config["server"] = {**config["server"], "client_body_timeout": 0.5}
    gw = await start_gateway(config)
    broken: list[str | None] = []

    async def consume(exchange: Exchange, next: Next) -> Reply:
        try:
            async for _ in exchange.body.take_over():
                pass
        except BodyBroken as err:
            broken.append(exchange.body_error)
            return err.reply
        return Reply.json(200, {})

    _route_through(gw, [consume])
    raw = b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nonly ten.."
    ((status, headers, payload),) = parse_responses(await raw_exchange(gw.port, raw, timeout=5))
    assert status == 408 and json.loads(payload)["code"] == "CLIENT_BODY_TIMEOUT" and headers["connection"] == "close"
    assert broken == ["timeout"]
