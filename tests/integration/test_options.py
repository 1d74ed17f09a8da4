"""Options no other test sets, each set here and its effect seen through a real socket: the default tenant, a route's
prefixes, the form ``_method`` look-ahead, ``request_id``'s trust and length, and the upload guard's successor
method and lingering after an early answer, the usage ledger's bound on rows held while it cannot write."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDict

from tests.gateway_testlib import (
    GatewayFactory,
    RecordingUpstream,
    guarded_routes,
    make_config,
    parse_responses,
    read_answer,
)


async def _get(url: str, **kwargs: Any) -> tuple[int, CIMultiDict[str], Any]:
    async with aiohttp.ClientSession() as client, client.request(kwargs.pop("method", "GET"), url, **kwargs) as resp:
        body = await resp.json(content_type=None) if resp.content_type == "application/json" else await resp.read()
        return resp.status, resp.headers.copy(), body


async def test_default_tenant_serves_the_hosts_no_tenant_names(upstream: RecordingUpstream,
                                                               start_gateway: GatewayFactory) -> None:
    without = await start_gateway(make_config(upstream.url))
    assert (await _get(without.url + "/x", headers={"Host": "unknown.test"}))[0] == 421
    assert upstream.received == []
    gw = await start_gateway(make_config(upstream.url, default_tenant="oldco"))
    status, _, _ = await _get(gw.url + "/x", headers={"Host": "unknown.test"})
    assert status == 200 and [r.raw_path for r in upstream.received] == ["/x"]
    # oldco (created 2025) does not forbid legacy uploads: the unknown host is served as oldco, not as acme.
    gw = await start_gateway(make_config(upstream.url, default_tenant="oldco", routes=guarded_routes()))
    status, _, _ = await _get(gw.url + "/api/v1/cards/1/files", method="PUT", data=b"x",
                              headers={"Host": "unknown.test"})
    assert status == 200
    status, _, _ = await _get(gw.url + "/api/v1/cards/1/files", method="PUT", data=b"x")  # acme's own host
    assert status == 403


async def test_a_routes_prefixes_are_where_its_paths_are_matched(upstream: RecordingUpstream,
                                                                 start_gateway: GatewayFactory) -> None:
    routes = guarded_routes()
    for route in routes:
        if route["name"] == "legacy_card_file_upload":
            route["prefixes"] = ["/v2"]
    gw = await start_gateway(make_config(upstream.url, routes=routes))
    status, _, body = await _get(gw.url + "/v2/cards/1/files", method="PUT", data=b"x")
    assert status == 403 and body["replacement"] == "POST /api/v1/cards/1/files"
    status, _, _ = await _get(gw.url + "/api/v1/cards/1/files", method="PUT", data=b"x")  # no longer its path
    assert status == 200 and [r.raw_path for r in upstream.received] == ["/api/v1/cards/1/files"]


async def test_method_override_look_ahead_bounds_the_form_read_for_its_method(upstream: RecordingUpstream,
                                                                              start_gateway: GatewayFactory) -> None:
    form = b"note=" + b"n" * 6000 + b"&_method=PUT"
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    default = await start_gateway(make_config(upstream.url, routes=guarded_routes()))
    status, _, body = await _get(default.url + "/api/v1/cards/1/files", method="POST", data=form, headers=headers)
    assert status == 403  # the _method after 6,000 bytes is read: a PUT to the legacy route
    config = make_config(upstream.url, routes=guarded_routes())
    config["server"] = {**config["server"], "method_override_look_ahead": 4096}
    gw = await start_gateway(config)
    status, _, body = await _get(gw.url + "/api/v1/cards/1/files", method="POST", data=form, headers=headers)
    assert status == 413 and body["code"] == "METHOD_OVERRIDE_UNDECIDED"
    assert upstream.received == []


def _request_id(upstream: RecordingUpstream, **options: Any) -> dict[str, Any]:
    return make_config(upstream.url, global_chain=[{"request_id": options}])


async def test_request_id_trust_incoming_off_replaces_the_clients_id(upstream: RecordingUpstream,
                                                                     start_gateway: GatewayFactory) -> None:
    trusting = await start_gateway(_request_id(upstream))
    _, headers, _ = await _get(trusting.url + "/x", headers={"X-Request-Id": "client-id-1"})
    assert headers["X-Request-Id"] == "client-id-1" and upstream.received[-1].header("X-Request-Id") == "client-id-1"
    gw = await start_gateway(_request_id(upstream, trust_incoming=False))
    _, headers, _ = await _get(gw.url + "/x", headers={"X-Request-Id": "client-id-1"})
    sent = upstream.received[-1].header("X-Request-Id")
    assert headers["X-Request-Id"] == sent and sent not in (None, "client-id-1")


async def test_request_id_max_length_replaces_a_longer_id(upstream: RecordingUpstream,
                                                          start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(_request_id(upstream, max_length=12))
    _, headers, _ = await _get(gw.url + "/x", headers={"X-Request-Id": "a" * 12})
    assert headers["X-Request-Id"] == "a" * 12
    _, headers, _ = await _get(gw.url + "/x", headers={"X-Request-Id": "a" * 13})
    assert headers["X-Request-Id"] != "a" * 13 and upstream.received[-1].header("X-Request-Id") == headers["X-Request-Id"]


async def test_successor_method_is_the_replacement_the_403_names(upstream: RecordingUpstream,
                                                                 start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(make_config(upstream.url, routes=guarded_routes(successor_method="PUT")))
    status, headers, body = await _get(gw.url + "/api/v1/cards/7/files", method="PUT", data=b"x")
    assert status == 403 and body["replacement"] == "PUT /api/v1/cards/7/files"
    # Its own method and path now: the successor is another route, so a Link to it is sent.
    assert "Link" not in headers or "/api/v1/cards/7/files" in headers["Link"]


async def _blocked_upload(port: int) -> tuple[bytes, float]:
    """A legacy PUT declaring 8 MiB whose body keeps coming, 1,000 bytes every 50 ms, after the 403: the answer, and
    how long after it the gateway read on before closing (the client's writes fail from then on)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"PUT /api/v1/cards/1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 8388608\r\n"
                     b"Content-Type: application/octet-stream\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        answer = await read_answer(reader, 3)  # to its end: the gateway half-closes after the answer
        answered = time.monotonic()
        try:
            while time.monotonic() - answered < 5:
                await asyncio.sleep(0.05)
                writer.write(b"x" * 1000)
                await writer.drain()
        except ConnectionError:
            pass
        return answer, time.monotonic() - answered
    finally:
        writer.close()


async def test_linger_bounds_what_is_read_after_an_early_answer(upstream: RecordingUpstream,
                                                                start_gateway: GatewayFactory) -> None:
    """After a 403 sent before the body was read, the gateway reads on and drops the body for at most
    linger_seconds and linger_bytes (so that the client reads the answer before a reset), then closes."""
    short = await start_gateway(make_config(upstream.url, routes=guarded_routes(linger_seconds=0.6)))
    answer, after = await _blocked_upload(short.port)
    assert parse_responses(answer)[0][0] == 403 and 0.45 <= after < 1.5, after  # not the default 2 s
    few = await start_gateway(make_config(upstream.url, routes=guarded_routes(linger_seconds=30, linger_bytes=5000)))
    answer, after = await _blocked_upload(few.port)
    assert parse_responses(answer)[0][0] == 403 and after < 1.2, after
    assert upstream.received == []


async def test_max_pending_clients_bounds_the_client_rows_held_while_the_ledger_cannot_write(
        upstream: RecordingUpstream, start_gateway: GatewayFactory, tmp_path: Path) -> None:
    """The ledger's database cannot be opened (its directory does not exist): what the requests count is held in
    memory, at most max_pending_clients client rows; the rest is counted as untracked, in the totals only."""
    ledger = {"url": f"sqlite:///{tmp_path / 'missing' / 'ledger.sqlite3'}", "max_pending_clients": 100}
    gw = await start_gateway(make_config(upstream.url, routes=guarded_routes(),
                                         usage={"max_clients": 1000, "ledger": ledger}))
    async with aiohttp.ClientSession() as client:
        for i in range(150):
            async with client.put(gw.url + "/api/v1/cards/1/files", data=b"x",
                                  headers={"Authorization": f"Bearer token-{i:04d}"}) as resp:
                assert resp.status == 403
    assert gw.gateway.usage is not None
    held = gw.gateway.usage.take()
    assert held is not None and len(held.requests) == 100 and sum(held.untracked.values()) == 50
