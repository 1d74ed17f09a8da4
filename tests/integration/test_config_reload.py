"""SIGHUP with a config whose values are wrong in ways YAML itself accepts (a date that does not exist): the reload
is refused with the problem's path and line, counted as a failure, and the running config keeps serving. SIGHUP with
thousands of companies: the event loop keeps serving while the new config is read and built."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.bench_testlib import load
from tests.gateway_testlib import RecordingUpstream
from tests.process_testlib import LivezProbe, Proc, start, wait_for
from tests.process_testlib import config as process_config

FAILURE = ("gateway_config_reloads_total", (("result", "failure"),))
SUCCESS = ("gateway_config_reloads_total", (("result", "success"),))

tenants = load("tenants")


@pytest.fixture
async def gateway_process(upstream: RecordingUpstream, tmp_path: Path) -> AsyncIterator[Proc]:
    item = await start(process_config(upstream.url, 0, 0), tmp_path, name="reload")
    yield item
    item.stop()


async def test_a_reload_with_an_impossible_value_is_refused_and_counted(gateway_process: Proc) -> None:
    p = gateway_process
    good = p.config_path.read_text()
    data = yaml.safe_load(good)
    for refusals, value in enumerate(["2026-02-30", "2026-10-01T25:00:00", "99999999999999999999999"], 1):
        p.config_path.write_text(yaml.safe_dump({**data, "tenants": data["tenants"] + [
            {"name": "new", "hosts": ["new.test"], "upstream": data["tenants"][0]["upstream"]}]})
            + f"rollout:\n  board_cards_cap: {value}\n")
        line = p.config_path.read_text().splitlines().index(f"  board_cards_cap: {value}") + 1
        p.proc.send_signal(signal.SIGHUP)

        async def refused() -> bool:
            return (await p.metrics()).get(FAILURE) == float(refusals)  # noqa: B023 - awaited in this iteration

        await wait_for(refused)
        log = p.log.read_text()
        assert log.count(f"reload refused, the running configuration stays: {p.config_path}: 1 problem(s):") == refusals
        assert f"line {line}: rollout.board_cards_cap: {value!r}" in log or (
            f"line {line}: rollout.board_cards_cap: expected a date" in log), log
        assert "Traceback" not in log and "Exception in callback" not in log
        assert p.proc.poll() is None
        async with aiohttp.ClientSession() as client:
            async with client.get(p.url + "/x") as resp:  # the running config still serves
                assert resp.status == 200
            async with client.get(p.url + "/x", headers={"Host": "new.test"}) as resp:  # the refused one does not
                assert resp.status == 421
    # The next good file is taken.
    p.config_path.write_text(good)
    p.proc.send_signal(signal.SIGHUP)

    async def reloaded() -> bool:
        return (await p.metrics()).get(SUCCESS) == 1.0

    await wait_for(reloaded)


# Issue 38: a config of this many companies (bench/tenants.py's, the shipped routes and chains) takes seconds to read,
# validate and build; a reload that did it on the event loop held every request, /livez included, that long.
COMPANIES = 2000


async def test_a_reload_of_thousands_of_companies_leaves_the_event_loop_serving(upstream: RecordingUpstream,
                                                                               tmp_path: Path) -> None:
    """The file is read, validated and built in a thread and swapped in at once: while it is, the admin /livez
    (asked every 10 ms by a process of its own) answers within 100 ms of what it takes when the gateway is idle."""
    data = tenants.config(COMPANIES, upstream.url)
    p = await start(data, tmp_path, name="companies", timeout=60)
    try:
        late = tenants.company(COMPANIES, upstream.url)
        written = yaml.load(p.config_path.read_text(), Loader=yaml.CSafeLoader)
        p.config_path.write_text(yaml.dump({**written, "tenants": [*written["tenants"], late]}, Dumper=yaml.CSafeDumper))
        idle = LivezProbe(p.admin)
        await asyncio.sleep(1.0)
        await idle.finish()
        probe = LivezProbe(p.admin)
        try:
            await asyncio.sleep(0.2)
            p.proc.send_signal(signal.SIGHUP)

            async def reloaded() -> bool:
                return "configuration reloaded from" in p.log.read_text()

            await wait_for(reloaded, 60)
        finally:
            await probe.finish()
        assert probe.count > 10 and probe.worst < 0.1 + idle.worst, (probe.worst, idle.worst, probe.count)
        async with aiohttp.ClientSession() as client:
            async with client.get(p.url + "/x", headers={"Host": late["hosts"][0]}) as resp:
                assert resp.status == 200  # the company the reload added is served
    finally:
        p.stop()
