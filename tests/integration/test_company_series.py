"""Issue 38: the metric series of many companies. An idle company costs no series; a company's series appear with its
first deprecation decision; at most ``metrics.max_companies`` companies get their own, the others are counted under
``tenant="_other"`` so that every total stays whole; ``gateway_rollout_phase`` follows the companies counted, and
``gateway_rollout_companies`` counts them all. Through real sockets: the gateway's public listener and its admin
``/metrics``."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from gateway.rollout import FixedClock, parse_instant
from tests.gateway_testlib import (
    AdminFactory, GatewayFactory, Received, RecordingUpstream, guarded_routes, make_config,
)
from tests.process_testlib import samples

BOARD = json.dumps({"id": 1, "cards": [{"id": i} for i in range(3)]}).encode()
# After the removal date: board responses are rewritten, legacy uploads of new companies blocked.
LATE = "2026-11-15T12:00:00Z"


def companies_config(upstream: str, count: int, **metrics: Any) -> dict[str, Any]:
    config = make_config(upstream, routes=guarded_routes(), metrics=metrics)
    for route in config["routes"]:
        if route["name"] == "board":
            route["chain"] = [{"board_cards": {}}]
    config["tenants"] = [
        {"name": f"c{i:05d}", "hosts": [f"c{i:05d}.test"], "upstream": upstream,
         "created": "2026-06-01" if i % 2 else "2025-01-01"}
        for i in range(count)
    ]
    return config


async def scrape(admin: str) -> str:
    async with aiohttp.ClientSession() as client, client.get(admin + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


async def board(gateway_url: str, company: str) -> None:
    async with aiohttp.ClientSession() as client:
        async with client.get(gateway_url + "/api/v1/boards/1", headers={"Host": f"{company}.test"}) as resp:
            assert resp.status == 200
            await resp.read()


async def serve_boards(upstream: RecordingUpstream) -> None:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        return web.Response(body=BOARD, content_type="application/json")

    upstream.responder = responder


async def test_idle_companies_cost_no_series(upstream: RecordingUpstream, start_gateway: GatewayFactory,
                                             start_admin: AdminFactory) -> None:
    """The same series with 2 companies and with 2,000; none names a company; no _created twin."""
    clock = FixedClock(parse_instant(LATE))
    counted = []
    for count in (2, 2000):
        gw = await start_gateway(companies_config(upstream.url, count), clock=clock)
        text = await scrape(await start_admin(gw))
        counted.append(len(series(text)))
        assert "_created" not in text
        assert not [line for line in series(text) if "tenant=" in line]
        census = samples(text)
        board_cards = [v for (name, labels), v in census.items()
                       if name == "gateway_rollout_companies" and ("behaviour", "board_cards") in labels]
        assert sorted(board_cards) == [0, 0, count]  # every company in the removed phase
    assert counted[0] == counted[1] < 400


async def test_a_company_s_series_appear_with_its_traffic_within_the_bound(
        upstream: RecordingUpstream, start_gateway: GatewayFactory, start_admin: AdminFactory) -> None:
    await serve_boards(upstream)
    gw = await start_gateway(companies_config(upstream.url, 50, max_companies=2), clock=FixedClock(parse_instant(LATE)))
    admin = await start_admin(gw)
    for company in ("c00003", "c00007", "c00003", "c00011", "c00020"):
        await board(gw.url, company)
    found = samples(await scrape(admin))
    responses = {dict(labels)["tenant"]: value for (name, labels), value in found.items()
                 if name == "gateway_board_responses_total"}
    # The first two companies counted have their own; the third and fourth are counted together, not dropped.
    assert responses == {"c00003": 2, "c00007": 1, "_other": 2}
    withheld = {dict(labels)["tenant"]: value for (name, labels), value in found.items()
                if name == "gateway_board_cards_removed_total"}
    assert withheld == {"c00003": 6, "c00007": 3, "_other": 6}
    phased = {dict(labels)["tenant"] for (name, labels), _ in found.items() if name == "gateway_rollout_phase"}
    assert phased == {"c00003", "c00007"}
    removed = ("gateway_rollout_phase", (("behaviour", "board_cards"), ("phase", "removed"), ("tenant", "c00007")))
    assert found[removed] == 1
    requests = sum(value for (name, labels), value in found.items() if name == "gateway_requests_total"
                   and ("route", "board") in labels)
    assert requests == 5
