"""Operating a gateway process: reload on SIGHUP, drain and finish in-flight requests on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.gateway_testlib import ADMIN_HEADERS, RecordingUpstream, free_port
from tests.process_testlib import ROOT, Proc, start, write_config
from tests.process_testlib import config as _config
from tests.process_testlib import samples as _samples
from tests.process_testlib import wait_for as _wait_for


@pytest.fixture
async def gateway_process(upstream: RecordingUpstream, tmp_path: Path) -> AsyncIterator[Proc]:
    item = await start(_config(upstream.url, 0, 0, drain_delay=0.5, shutdown_timeout=5), tmp_path, name="g")
    yield item
    if item.proc.poll() is None:
        item.proc.kill()
        item.proc.wait(5)


async def test_sighup_reload_applies_a_valid_config_and_keeps_the_old_on_error(gateway_process: Proc,
                                                                                upstream: RecordingUpstream) -> None:
    p = gateway_process
    async with aiohttp.ClientSession() as client:
        async with client.get(p.url + "/x", headers={"Host": "new.test"}) as resp:
            assert resp.status == 421
        config = yaml.safe_load(p.config_path.read_text())
        config["tenants"][0]["hosts"].append("new.test")
        p.config_path.write_text(yaml.safe_dump(config))
        p.proc.send_signal(signal.SIGHUP)

        async def reloaded() -> bool:
            return (await p.metrics()).get(("gateway_config_reloads_total", (("result", "success"),))) == 1.0

        await _wait_for(reloaded)
        async with client.get(p.url + "/x", headers={"Host": "new.test"}) as resp:
            assert resp.status == 200

        p.config_path.write_text("tenants: []\n")
        p.proc.send_signal(signal.SIGHUP)

        async def refused() -> bool:
            return (await p.metrics()).get(("gateway_config_reloads_total", (("result", "failure"),))) == 1.0

        await _wait_for(refused)
        async with client.get(p.url + "/x", headers={"Host": "new.test"}) as resp:
            assert resp.status == 200
    assert "reload refused" in p.log.read_text() and "tenants: List should have at least 1 item" in p.log.read_text()


async def test_sigterm_drains_then_finishes_in_flight_requests(gateway_process: Proc, upstream: RecordingUpstream) -> None:
    p = gateway_process

    release = asyncio.Event()

    async def responder(request: web.BaseRequest, received) -> web.StreamResponse:
        await release.wait()  # held until the test has seen the gateway draining
        return web.Response(text="finished")

    upstream.responder = responder
    async with aiohttp.ClientSession() as client:
        in_flight = asyncio.create_task(client.get(p.url + "/slow"))
        await asyncio.wait_for(upstream.started.wait(), 5)
        p.proc.send_signal(signal.SIGTERM)

        async def draining() -> bool:
            async with client.get(f"http://127.0.0.1:{p.admin}/readyz") as resp:
                return resp.status == 503

        await _wait_for(draining)
        assert p.proc.poll() is None and not in_flight.done()  # still serving the request in flight
        release.set()
        resp = await in_flight
        assert resp.status == 200
        assert await resp.text() == "finished"
        resp.release()
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, p.proc.wait, 10) == 0


async def test_two_workers_share_the_port_and_aggregate_metrics(upstream: RecordingUpstream, tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_config(upstream.url, port, admin)))
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    p = Proc(proc, port, admin, path, tmp_path / "unused.log")
    try:
        async def both_started() -> bool:
            # Each worker writes its own gauge file once its metrics exist (just before it listens).
            pids = {f.stem.rsplit("_", 1)[-1] for f in metrics_dir.glob("gauge_live*_*.db")}
            if len(pids) < 2:
                return False
            try:
                return ("gateway_build_info", (("version", "0.1.0"),)) in await p.metrics()
            except aiohttp.ClientError:
                return False

        await _wait_for(both_started, 20)

        async def both_listening() -> bool:
            # Each worker's listener (and its signal handlers, installed just before) follows its metrics.
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            return len(children) == 2 and all(_listening(pid) for pid in children)

        await _wait_for(both_listening, 10)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        async with aiohttp.ClientSession() as client:
            for _ in range(40):
                # A new connection each time, so the kernel spreads them over both workers.
                async with client.get(p.url + "/w", headers={"Connection": "close"}) as resp:
                    assert resp.status == 200
        metrics = await p.metrics()
        labels = (("method", "GET"), ("route", "catch_all"), ("status_class", "2xx"))
        total = metrics[("gateway_requests_total", labels)]
        assert total == 40.0
        proc.send_signal(signal.SIGHUP)

        async def both_reloaded() -> bool:
            return (await p.metrics()).get(("gateway_config_reloads_total", (("result", "success"),))) == 2.0

        await _wait_for(both_reloaded, 10)
        proc.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, proc.wait, 20) == 0
        for child in children:
            assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _listening(pid: str) -> bool:
    try:
        return any(Path(f"/proc/{pid}/fd/{fd}").readlink().name.startswith("socket:")
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _alive(pid: str) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


async def test_workers_stop_when_the_supervisor_is_killed(upstream: RecordingUpstream, tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_config(upstream.url, port, admin)))
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        children: list[str] = []

        async def started() -> bool:
            nonlocal children
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            # Both workers are past start-up once each has its listening socket open.
            return len(children) == 2 and all(_listening(pid) for pid in children)

        await _wait_for(started, 15)
    finally:
        proc.kill()
        proc.wait(5)

    async def all_gone() -> bool:
        return not any(_alive(pid) for pid in children)

    await _wait_for(all_gone, 10)


# Loaded by every worker of the test below (PYTHONPATH): a worker that starts once the file `slow/on` exists marks
# `slow/<pid>` after its first reading of the config, then waits for the file `slow/go` (20 s at most) before it goes
# on starting: the test sends its SIGHUP while that worker has read the file but not yet installed its handler.
# Workers started before `slow/on`, and every later reading (a reload), are not held. The gateway is not changed.
_SLOW_START = """
import os, time
slow = os.environ.get("TEST_SLOW_START")
if slow and os.environ.get("GATEWAY_WORKER_DIR") and os.path.exists(os.path.join(slow, "on")):
    import gateway.app as app
    read = app.load_config

    def load_config(*args, **kwargs):
        config = read(*args, **kwargs)
        if app.load_config is load_config:
            app.load_config = read  # once: cli's own name for it still calls this, which then only reads
            open(os.path.join(slow, str(os.getpid())), "w").close()
            deadline = time.monotonic() + 20
            while not os.path.exists(os.path.join(slow, "go")) and time.monotonic() < deadline:
                time.sleep(0.05)
        return config

    app.load_config = load_config
"""


async def test_a_reload_asked_while_a_worker_starts_reaches_it(upstream: RecordingUpstream, tmp_path: Path) -> None:
    """A worker that has read the file but not yet installed its SIGHUP handler still reloads when the SIGHUP comes
    then: every worker ends on the new file (one /config digest), none serves the old one for ever."""
    from gateway.app import load_config
    from gateway.ops.status import config_digest

    port, admin = free_port(), free_port()
    path = tmp_path / "w.yaml"
    data = _config(upstream.url, port, admin)
    write_config(path, data)
    hook, slow = tmp_path / "hook", tmp_path / "slow"
    hook.mkdir()
    slow.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_START)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)]), "TEST_SLOW_START": str(slow)}
    log = tmp_path / "w.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env)
    p = Proc(proc, port, admin, path, log)

    def children() -> list[str]:
        return Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()

    async def digests(count: int) -> set[str]:
        """The digests /config answers, asked ``count`` times (an empty set while the admin port refuses)."""
        seen = set()
        try:
            async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client:
                for _ in range(count):
                    # A new connection each time, so the kernel spreads them over both workers.
                    async with client.get(f"http://127.0.0.1:{admin}/config", headers={"Connection": "close"}) as r:
                        seen.add((await r.json())["digest"])
        except aiohttp.ClientError:
            return set()
        return seen

    async def serve(started: int, digest: str) -> bool:
        """Whether ``started`` workers have started in all (each says so once its handlers are installed), and every
        /config answer is ``digest``."""
        return log.read_text().count(" listening on ") == started and await digests(40) == {digest}

    try:
        old = config_digest(load_config(path))
        await _wait_for(lambda: serve(2, old), 20)
        # A worker dies; the one started in its place reads the file, then is held before its handler is installed.
        (slow / "on").touch()
        os.kill(int(children()[0]), signal.SIGKILL)

        async def reading() -> bool:
            return any(mark.name.isdigit() for mark in slow.iterdir())

        await _wait_for(reading, 20)
        newcomer = next(mark.name for mark in slow.iterdir() if mark.name.isdigit())
        # The file changes and the reload is asked now, while the newcomer is still starting: the supervisor passes
        # the SIGHUP to both workers (the other one reloads at once).
        write_config(path, {**data, "tenants": [{**data["tenants"][0], "hosts": ["127.0.0.1", "new.test"]}]})
        new = config_digest(load_config(path))
        assert new != old
        proc.send_signal(signal.SIGHUP)

        async def the_other_reloaded() -> bool:
            return "configuration reloaded" in log.read_text()

        await _wait_for(the_other_reloaded, 10)
        await asyncio.sleep(0.5)
        assert newcomer in children() and not _listening(newcomer), "the newcomer was not held until after the SIGHUP"
        (slow / "go").touch()
        try:
            await _wait_for(lambda: serve(3, new), 15)
        except AssertionError:
            raise AssertionError(f"the workers serve {await digests(40)}, the file is {new}") from None
    finally:
        p.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


async def test_deprecations_endpoint_and_usage_command(upstream: RecordingUpstream, start_gateway,
                                                       start_admin, tmp_path: Path) -> None:
    from tests.gateway_testlib import make_config

    config = make_config(upstream.url, usage={"ledger": {"url": f"sqlite:///{tmp_path}/usage.sqlite3"}})
    gw = await start_gateway(config)
    admin = await start_admin(gw)

    # Stand-in for a deprecation policy: record a decision the way policies do.
    async def decide(exchange, next):
        exchange.decisions["some_deprecation"] = "allowed"
        return await next(exchange)

    state = gw.gateway.state
    inner = state.handlers["catch_all"]
    state.handlers["catch_all"] = lambda exchange: decide(exchange, inner)
    async with aiohttp.ClientSession() as client:
        for token in ("tok-a", "tok-a", "tok-b"):
            async with client.get(gw.url + "/x", headers={"Authorization": f"Bearer {token}",
                                                           "User-Agent": "old-sdk/1.2"}) as resp:
                assert resp.status == 200
        async with client.get(admin + "/deprecations?top=5&since=2h") as resp:
            report = await resp.json()
        for query in ("top=0", "since=yesterday", "order=best", "since=1h&until=2h"):
            async with client.get(admin + "/deprecations?" + query) as resp:
                assert resp.status == 400 and (await resp.json())["code"] == "BAD_QUERY", query
    data = report["behaviours"]["some_deprecation"]  # a policy that declares no behaviour counts under its name
    assert data["requests"] == 3 and data["by_decision"] == {"allowed": 3}
    assert [row["requests"] for row in data["top_clients"]] == [2, 1]
    assert "tok-a" not in json.dumps(report)
    # The command line reads the same database (this gateway wrote it before answering /deprecations).
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(config))
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: subprocess.run(
        [sys.executable, "-m", "gateway", "usage", "--config", str(path), "--since", "1h"], cwd=ROOT,
        capture_output=True, text=True, timeout=20))
    assert out.returncode == 0, out.stderr
    assert "some_deprecation: 3 requests (allowed 3), 2 clients" in out.stdout and "old-sdk/1.2" in out.stdout


async def test_admin_rollout_and_phase_gauge_follow_the_clock(upstream: RecordingUpstream, start_gateway,
                                                              start_admin) -> None:
    from gateway.rollout import FixedClock, parse_instant
    from tests.gateway_testlib import make_config

    clock = FixedClock(parse_instant("2026-10-31T23:59:59Z"))
    config = make_config(upstream.url)
    config["routes"][0]["chain"] = [{"board_cards": {}}]
    gw = await start_gateway(config, clock=clock)
    admin = await start_admin(gw)
    async with aiohttp.ClientSession() as client:
        # A company's phase series appear once it is counted in a deprecation family (issue 38).
        async with client.get(gw.url + "/api/v1/boards/1") as resp:
            await resp.read()
        async with client.get(admin + "/rollout") as resp:
            before = await resp.json()
        board = before["tenants"]["acme"]["behaviours"]["board_cards"]
        assert board["phase"] == "capped"
        assert board["next_change"] == {"at": "2026-11-01T00:00:00+00:00", "phase": "removed"}
        assert before["tenants"]["acme"]["behaviours"]["legacy_uploads"]["phase"] == "forbidden"
        assert before["tenants"]["oldco"]["behaviours"]["legacy_uploads"]["phase"] == "allowed"
        clock.instant = parse_instant("2026-11-01T00:00:01Z")
        async with client.get(admin + "/metrics") as resp:
            text = await resp.text()
    samples = _samples(text)
    key = ("gateway_rollout_phase", (("behaviour", "board_cards"), ("phase", "removed"), ("tenant", "acme")))
    assert samples[key] == 1.0
    capped = ("gateway_rollout_phase", (("behaviour", "board_cards"), ("phase", "capped"), ("tenant", "acme")))
    assert samples[capped] == 0.0
    assert samples[("gateway_rollout_companies", (("behaviour", "board_cards"), ("phase", "removed")))] == 2.0
