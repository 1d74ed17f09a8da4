"""SIGHUP with a config whose values are wrong in ways YAML itself accepts (a date that does not exist): the reload
is refused with the problem's path and line, counted as a failure, and the running config keeps serving."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.gateway_testlib import RecordingUpstream
from tests.process_testlib import Proc, start, wait_for
from tests.process_testlib import config as process_config

FAILURE = ("gateway_config_reloads_total", (("result", "failure"),))
SUCCESS = ("gateway_config_reloads_total", (("result", "success"),))


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
