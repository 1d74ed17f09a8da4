"""One road to the upstream (issue 27, "Must have" 1): the same client request sent through the plain road and through
each bridge's requests of its own (the card lookup, the upload, the comment, the backfill's pages); the recording
upstream sees the same forwarding headers, Host and request id on every one of them. Behind a TLS load balancer
(``trust_forwarded_headers``, ``forwarded_header``), with a request id header of another name, and a company whose
Host is preserved."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client import generate_latest

from gateway.rollout import FixedClock, parse_instant
from tests.adversarial_upstream import AdversarialUpstream, Board, adversarial  # noqa: F401 - fixture
from tests.gateway_testlib import GatewayFactory, bridged_routes, multipart_body, until
from tests.process_testlib import samples

B = "one-road-boundary"
# What the load balancer in front of the gateway says about the client, and the client's own headers.
CLIENT = {
    "Host": "api.example.com",
    "X-Forwarded-For": "203.0.113.7",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "api.example.com",
    "X-Forwarded-Port": "443",
    "Forwarded": 'for=203.0.113.7;proto=https;host="api.example.com"',
    "X-Real-IP": "203.0.113.7",
    "Via": "1.1 lb.example",
    "X-Correlation-Id": "corr-27",
    "Authorization": "Bearer road-token",
    "User-Agent": "legacy-app/1.0",
}
# The headers an upstream request carries of the gateway's making: the same on every road.
FORWARDING = ("host", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port", "forwarded",
              "x-real-ip", "x-client-ip", "via", "x-correlation-id", "x-request-id")


def _config(url: str, **upstream: Any) -> dict[str, Any]:
    return {
        "server": {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "trust_forwarded_headers": True,
                   "forwarded_header": True},
        "upstream": {"connect_timeout": 2, "read_timeout": 5, **upstream},
        "access_log": {"enabled": False},
        "usage": {"ledger": {"url": "sqlite://"}},  # in memory, not the default file in the working directory
        "tenants": [{"name": "acme", "hosts": ["api.example.com"], "upstream": url, "created": "2026-06-01",
                     "preserve_host": True, "bridges": {"upload_upgrade": True, "card_backfill": True}}],
        "global_chain": [{"request_id": {"header": "X-Correlation-Id"}}],
        "rollout": {"exemptions": [{"name": "legacy", "phase": "full", "until": "2099-01-01",
                                    "header": {"name": "User-Agent", "prefix": "legacy-app/"}, "bridge": True}]},
        "routes": bridged_routes(),
    }


def _forwarding(received: Any) -> list[tuple[str, str]]:
    return sorted((k.decode().lower(), v.decode()) for k, v in received.raw_headers
                  if k.decode().lower() in FORWARDING)


async def _send(gw: Any, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as client:
        async with client.request(method, f"{gw.url}{path}", data=body, headers={**CLIENT, **headers}) as resp:
            return resp.status, await resp.read()


async def test_every_upstream_request_carries_what_the_clients_own_carries(
    adversarial: AdversarialUpstream, start_gateway: GatewayFactory  # noqa: F811
) -> None:
    gw = await start_gateway(_config(adversarial.url), clock=FixedClock(parse_instant("2026-11-24T12:00:00Z")))
    adversarial.board("api.example.com", 5, Board(cards=250))
    # The plain road: a request no policy touches.
    status, _ = await _send(gw, "GET", "/api/v1/cards/7")
    assert status == 200
    (plain,) = adversarial.received
    expected = _forwarding(plain)
    assert dict(expected) == {
        "host": "api.example.com", "x-forwarded-for": "203.0.113.7, 127.0.0.1", "x-forwarded-proto": "https",
        "x-forwarded-host": "api.example.com", "x-forwarded-port": "443",
        "forwarded": 'for=203.0.113.7;proto=https;host="api.example.com", for=127.0.0.1;proto=http;'
                     'host="api.example.com"',
        "x-real-ip": "203.0.113.7", "via": "1.1 lb.example, 1.1 deprecation-gateway", "x-correlation-id": "corr-27",
    }
    # The upload upgrade (card): a card lookup and an upload of the bridge's own.
    put = multipart_body([(['Content-Disposition: form-data; name="file"; filename="a.txt"'], b"data")], B)
    status, answer = await _send(gw, "PUT", "/api/v1/cards/7/files", put,
                                 **{"Content-Type": f"multipart/form-data; boundary={B}"})
    assert status == 200, answer
    # The upload upgrade (comment): the comment and its upload.
    comment = multipart_body([(['Content-Disposition: form-data; name="text"'], b"hello"),
                              (['Content-Disposition: form-data; name="files[]"; filename="b.txt"'], b"more")], B)
    status, answer = await _send(gw, "POST", "/api/v1/cards/8/comments", comment,
                                 **{"Content-Type": f"multipart/form-data; boundary={B}"})
    assert status == 200, answer
    # The card backfill: the board (the client's own request), then the pages of the bridge's own (the first alone,
    # then four at a time).
    status, answer = await _send(gw, "GET", "/api/latest/boards/5")
    assert status == 200 and answer.count(b'"board_id": 5') == 250
    roads = [(r.method, r.raw_path.split("?")[0]) for r in adversarial.received[1:]]
    pages = len(roads) - 6
    assert roads == [("GET", "/api/v1/cards/7"), ("POST", "/api/v1/cards/uid-api-7/files"),
                     ("GET", "/api/v1/cards/8"), ("POST", "/api/v1/cards/8/comments"),
                     ("POST", "/api/v1/cards/uid-api-8/comments/comment-1000/files"),
                     ("GET", "/api/latest/boards/5")] + [("GET", "/api/latest/cards")] * pages
    assert pages >= 3
    for received in adversarial.received[1:]:
        assert _forwarding(received) == expected, (received.method, received.raw_path)
    # Counted by what the bridges named them, in the same registry as the client's own.

    def counts() -> dict[str, float | None]:
        values = samples(generate_latest(gw.metrics.registry).decode())
        return {purpose: values.get(("gateway_subrequests_total", (("purpose", purpose), ("result", "2xx"))))
                for purpose in ("card_lookup", "upload", "comment", "backfill_page")}

    await until(lambda: counts()["backfill_page"] is not None)
    assert counts() == {"card_lookup": 2, "upload": 2, "comment": 1, "backfill_page": pages}


async def test_the_tenants_bound_and_its_metrics_apply_to_a_bridges_requests(
    adversarial: AdversarialUpstream, start_gateway: GatewayFactory  # noqa: F811
) -> None:
    """max_concurrent_per_tenant: a bridge's card lookup waits for the company's turn like any request, and an
    answer it does not get is a busy one, counted where the client's are (gateway_upstream_busy_total)."""
    gw = await start_gateway(_config(adversarial.url, max_concurrent_per_tenant=1, queue_timeout=0.2))
    adversarial.comment_faults = ["slow"]
    adversarial.slow_seconds = 1.0
    headers = {"Content-Type": f"multipart/form-data; boundary={B}"}
    # A text-only comment passes through (the plain road) and holds the company's one turn for a second.
    comment = multipart_body([(['Content-Disposition: form-data; name="text"'], b"hold the turn")], B)
    holding = asyncio.ensure_future(_send(gw, "POST", "/api/v1/cards/9/comments", comment, **headers))
    await until(lambda: bool(adversarial.received))
    put = multipart_body([(['Content-Disposition: form-data; name="file"; filename="a.txt"'], b"data")], B)
    status, answer = await _send(gw, "PUT", "/api/v1/cards/9/files", put, **headers)
    assert (await holding)[0] == 200
    assert status == 503 and b"UPSTREAM_BUSY" in answer
    assert [r.method for r in adversarial.received] == ["POST"]  # the lookup never left

    def busy() -> tuple[float | None, float | None]:
        values = samples(generate_latest(gw.metrics.registry).decode())
        return (values.get(("gateway_upstream_busy_total", ())),
                values.get(("gateway_subrequests_total", (("purpose", "card_lookup"), ("result", "busy")))))

    await until(lambda: busy()[1] is not None)
    assert busy() == (1.0, 1.0)

