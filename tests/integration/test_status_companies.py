"""Issue 38: the status page of thousands of companies. Every company is counted per phase, those that need attention
come first, a filter and pages choose the ones shown, and a read is built off the event loop: through a gateway's
admin listener, in front of a real upstream (the browser tests, test_status_page.py, drive the page itself)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.ops.admin import make_admin_app
from gateway.rollout import FixedClock, parse_instant
from tests.bench_testlib import load
from tests.gateway_testlib import ADMIN_TOKEN, GatewayFactory, RecordingUpstream, admin_url, guarded_routes, make_config
from tests.process_testlib import LivezProbe, start

tenants = load("tenants")
COMPANIES = 2000
# Between the cap and the removal: odd companies (created in 2026) forbid legacy uploads, even ones allow them.
NOW = "2026-10-20T12:00:00Z"


def _config(upstream: str, count: int = COMPANIES) -> dict[str, Any]:
    config = make_config(upstream, routes=guarded_routes())
    config["tenants"] = [tenants.company(i, upstream) for i in range(count)]
    return config


async def _admin(gw: Any) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(make_admin_app(gw.gateway), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, admin_url(runner.addresses[0][1])


async def _json(client: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with client.get(url) as resp:
        return resp.status, await resp.json()


async def test_every_company_counted_those_that_need_attention_first_a_filter_and_pages(
        upstream: RecordingUpstream, start_gateway: GatewayFactory) -> None:
    gw = await start_gateway(_config(upstream.url), clock=FixedClock(parse_instant(NOW)))
    runner, admin = await _admin(gw)
    try:
        async with aiohttp.ClientSession() as client:
            # Legacy uploads: blocked for company 1501 (forbidden), let through for company 1200 (allowed).
            for i, status in ((1501, 403), (1200, 200), (1501, 403)):
                async with client.put(f"{gw.url}/api/v1/cards/1/files", data=b"x",
                                      headers={"Host": tenants.host(i), "Authorization": "Bearer t"}) as resp:
                    assert resp.status == status
            code, first = await _json(client, admin + "/status.json")
            assert code == 200
            code, filtered = await _json(client, admin + "/status.json?company=Y-0004")
            code, forbidden = await _json(client, admin + "/status.json?phase=legacy_uploads:forbidden&page=3")
            code, last = await _json(client, admin + "/status.json?page=999")
            async with client.get(admin + "/status?company=company-0177&page=1") as resp:
                page = await resp.text()
            bad = []
            for query in ("page=0", "page=x", "phase=forbidden", "company=" + "x" * 65):
                async with client.get(admin + "/status.json?" + query) as resp:
                    bad.append((resp.status, (await resp.json())["code"]))
    finally:
        await runner.cleanup()
    companies = first["companies"]
    assert (companies["total"], companies["matching"], companies["pages"], companies["page"]) == (2000, 2000, 100, 1)
    census = {b["name"]: {p["phase"]: p["companies"] for p in b["phases"]} for b in companies["census"]}
    assert census == {"board_cards": {"full": 0, "capped": 2000, "removed": 0},
                      "legacy_uploads": {"allowed": 1000, "forbidden": 1000}}
    # Those whose clients used deprecated behaviour come first, the one whose uploads are refused before the other.
    shown = first["tenants"]
    assert len(shown) == 20 and (companies["first"], companies["last"]) == (1, 20)
    assert [t["name"] for t in shown[:2]] == ["company-01501", "company-01200"]
    assert shown[0]["attention"] == ["legacy_uploads: 2 requests in the window, forbidden now"]
    assert shown[1]["attention"] == ["legacy_uploads: 1 request in the window"]
    assert shown[2]["attention"] == [] and shown[2]["name"] == "company-00000"
    assert companies["attention"] == 2
    assert [t["name"] for t in filtered["tenants"]] == [f"company-0004{d}" for d in range(10)]
    assert filtered["companies"]["matching"] == 10 and filtered["companies"]["company"] == "Y-0004"
    # The companies in a phase, a page of them: the 41st to the 60th of the odd ones.
    assert forbidden["companies"]["matching"] == 1000 and forbidden["companies"]["first"] == 41
    assert [t["name"] for t in forbidden["tenants"]][:2] == ["company-00079", "company-00081"]
    assert all(b["phase"] == "forbidden" for t in forbidden["tenants"] for b in t["behaviours"]
               if b["name"] == "legacy_uploads")
    assert last["companies"]["page"] == 100 and last["tenants"][-1]["name"] == "company-01999"
    assert 'data-tenant="company-01770"' in page and 'data-tenant="company-01780"' not in page
    assert bad == [(400, "BAD_QUERY")] * 4


async def test_the_admin_views_of_thousands_of_companies_leave_the_event_loop_serving(
        upstream: RecordingUpstream, tmp_path: Path) -> None:
    """A page of 10,000 companies' timelines took seconds to build on the event loop, and held every request that
    long; now the admin /livez (asked every 10 ms by a process of its own) answers within 100 ms of what it takes
    when the gateway is idle, during the first reads of the page and its data after start, and of /config and
    /rollout (every company's)."""
    p = await start(_config(upstream.url, 5000), tmp_path, name="companies", timeout=60,
                    env={**os.environ, "GATEWAY_NOW": NOW})
    try:
        idle = LivezProbe(p.admin)
        await asyncio.sleep(1.0)
        await idle.finish()
        probe = LivezProbe(p.admin)
        try:
            await asyncio.sleep(0.2)
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as client:
                for path in ("/status.json", "/status", "/status.json?phase=board_cards:capped&page=50", "/config",
                             "/rollout"):
                    async with client.get(f"http://127.0.0.1:{p.admin}{path}") as resp:
                        assert resp.status == 200
                        await resp.read()
            await asyncio.sleep(0.2)
        finally:
            await probe.finish()
        assert probe.count > 5 and probe.worst < 0.1 + idle.worst, (probe.worst, idle.worst, probe.count)
    finally:
        p.stop()
