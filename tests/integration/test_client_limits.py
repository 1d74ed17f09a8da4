"""Client-side limits through a real gateway process: a slowloris or silent client is closed within the head timeout,
an idle kept-alive connection within the keep-alive timeout, connections over max_connections are answered 503 and
closed, a process out of descriptors backs off instead of spinning; each is counted, and normal clients are served
throughout."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.gateway_testlib import RecordingUpstream, closed_within, parse_responses
from tests.process_testlib import Proc, start, wait_for


def _config(upstream: str, **server: Any) -> dict[str, Any]:
    return {"server": server, "tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": upstream}]}


async def _counter(gw: Proc, name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
    return (await gw.metrics()).get((name, labels), 0.0)


async def _until_open(gw: Proc, connections: int) -> None:
    """Until the gateway counts ``connections`` open."""

    async def reached() -> bool:
        return await _counter(gw, "gateway_connections_open") == connections

    await wait_for(reached)


async def test_slowloris_and_silent_clients_are_closed_within_the_head_timeout(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    gw = await start(_config(upstream.url, client_header_timeout=1.0), tmp_path)
    try:
        drips = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(20)]
        silent = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(20)]
        opened = time.monotonic()
        head = b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 200

        async def drip(writer: asyncio.StreamWriter) -> None:
            for byte in head:
                if writer.is_closing():
                    return
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        dripping = [asyncio.create_task(drip(w)) for _, w in drips]
        async with aiohttp.ClientSession() as client:
            # A normal client is served while they hold their connections.
            for _ in range(10):
                async with client.get(gw.url + "/normal") as resp:
                    assert resp.status == 200
        closed = await asyncio.gather(*(closed_within(r, 5) for r, _ in drips + silent))
        assert all(closed)
        assert time.monotonic() - opened < 4  # the 1 s limit, not the 10 s the drip would take
        for task in dripping:
            task.cancel()
        assert await _counter(gw, "gateway_client_timeouts_total", (("kind", "head"),)) == 40
        assert all(received.raw_path == "/normal" for received in upstream.received)  # no slow head got through
        for _, w in drips + silent:
            w.close()
    finally:
        gw.stop()


async def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive_timeout(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    gw = await start(_config(upstream.url, client_keepalive_timeout=0.5), tmp_path)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /one HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        assert await closed_within(reader, 3)
        writer.close()
        assert await _counter(gw, "gateway_client_timeouts_total", (("kind", "idle"),)) == 1
    finally:
        gw.stop()


async def test_connections_over_the_bound_are_answered_503_and_closed(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    gw = await start(_config(upstream.url, max_connections=5), tmp_path)
    try:
        held = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(5)]
        await _until_open(gw, 5)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)  # answered, then closed by the gateway
        ((status, headers, payload),) = parse_responses(data)
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(payload)["code"] == "TOO_MANY_CONNECTIONS"
        assert await _counter(gw, "gateway_connections_refused_total") == 1
        writer.close()
        # Once one of the five goes, a new client is served again.
        held[0][1].close()
        await _until_open(gw, 4)
        async with aiohttp.ClientSession() as client, client.get(gw.url + "/y") as resp:
            assert resp.status == 200
        for _, w in held[1:]:
            w.close()
    finally:
        gw.stop()


def _cpu_seconds(pid: int) -> float:
    """The user and system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_out_of_descriptors_the_listener_backs_off_then_serves_the_queued_clients(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """accept() failing with EMFILE leaves the connection queued and the socket readable: the listener stops watching
    it for a second each time instead of calling accept() again at once (which took a core and wrote 165,000 log
    lines in 5 s), logs it once, counts it, and serves the queued clients once descriptors are free."""
    limit = 96

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    gw = await start(_config(upstream.url), tmp_path, preexec=few_descriptors)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(limit + 40):
            held.append(await asyncio.open_connection("127.0.0.1", gw.port))

        def failures() -> list[str]:
            return [line for line in gw.log.read_text().splitlines() if "accepting a connection failed" in line]

        async def out_of_descriptors() -> bool:
            return bool(failures())

        await wait_for(out_of_descriptors)
        before = _cpu_seconds(gw.proc.pid)
        await asyncio.sleep(2)
        assert _cpu_seconds(gw.proc.pid) - before < 0.3  # not a core spinning on accept()
        (line,) = failures()  # once, not once per attempt
        assert "public listener" in line and "Too many open files" in line
        # A client that comes while the process is out of descriptors waits in the kernel's queue, and is served.
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /after HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        for _, w in held:
            w.close()
        held.clear()
        ((status, _, _),) = parse_responses(await asyncio.wait_for(reader.read(), 5))
        assert status == 200 and upstream.received[-1].raw_path == "/after"
        writer.close()
        assert await _counter(gw, "gateway_accept_backoffs_total", (("listener", "public"),)) >= 2
    finally:
        for _, w in held:
            w.close()
        gw.stop()


async def test_a_tenant_over_its_upstream_concurrency_waits_then_gets_503(
    upstream: RecordingUpstream, start_gateway: Any
) -> None:
    from tests.gateway_testlib import make_config

    release = asyncio.Event()

    async def held(request: Any, received: Any) -> Any:
        from aiohttp import web

        await release.wait()
        return web.Response(text="done")

    upstream.responder = held
    gw = await start_gateway(make_config(upstream.url, upstream={"max_concurrent_per_tenant": 2, "queue_timeout": 0.3}))
    async with aiohttp.ClientSession() as client:
        first = [asyncio.create_task(client.get(gw.url + f"/held/{i}")) for i in range(2)]

        async def two_at_the_upstream() -> bool:
            return len(upstream.received) == 2

        await wait_for(two_at_the_upstream)
        started = time.monotonic()
        async with client.get(gw.url + "/third") as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert (await resp.json())["code"] == "UPSTREAM_BUSY"
        assert 0.25 <= time.monotonic() - started < 2  # it waited its queue_timeout for a turn
        # A request that finds a turn freed while it waits goes through.
        waiting = asyncio.create_task(client.get(gw.url + "/fourth"))
        await asyncio.sleep(0.05)
        release.set()
        for task in [*first, waiting]:
            resp = await task
            assert resp.status == 200
            resp.release()
    assert sorted(r.raw_path for r in upstream.received) == ["/fourth", "/held/0", "/held/1"]
    assert gw.metrics.registry.get_sample_value("gateway_upstream_busy_total") == 1


async def test_the_gate_hands_turns_over_in_order_and_gives_up_after_its_timeout() -> None:
    from gateway.proxy.gate import Gate

    gate = Gate(1)
    assert gate.try_enter() and not gate.try_enter()
    order: list[str] = []

    async def wait(name: str, timeout: float) -> None:
        if await gate.enter(timeout):
            order.append(name)

    late = asyncio.create_task(wait("timed out", 0.05))
    a = asyncio.create_task(wait("a", 5))
    b = asyncio.create_task(wait("b", 5))
    await asyncio.sleep(0.1)
    assert late.done() and order == []
    gate.leave()
    await asyncio.sleep(0)
    assert order == ["a"] and gate.busy == 1
    gate.leave()
    await asyncio.gather(a, b)
    assert order == ["a", "b"] and gate.busy == 1
    gate.leave()
    assert gate.busy == 0 and gate.try_enter()


def _limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


async def test_the_open_file_limit_is_raised_to_the_hard_one_and_a_low_hard_limit_is_warned_about(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    import resource
    import subprocess
    import sys

    import yaml

    from tests.gateway_testlib import free_port

    _, parent_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The child starts with a soft limit of 256 and a hard one of 2,048 (or the parent's, if lower).
    hard = 2048 if parent_hard == resource.RLIM_INFINITY else min(parent_hard, 2048)
    for max_connections, low in ((100, False), (5000, True)):
        port, admin = free_port(), free_port()
        data = _config(upstream.url, listen=f"127.0.0.1:{port}", admin_listen=f"127.0.0.1:{admin}",
                       max_connections=max_connections)
        path = tmp_path / f"gw-{max_connections}.yaml"
        path.write_text(yaml.safe_dump(data))
        log = tmp_path / f"gw-{max_connections}.log"

        def lower(limit: int = hard) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, limit))

        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path)], cwd=tmp_path,
                                    stdout=out, stderr=subprocess.STDOUT, preexec_fn=lower)
        try:
            async def ready() -> bool:
                try:
                    async with aiohttp.ClientSession() as c, c.get(f"http://127.0.0.1:{admin}/readyz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_for(ready, 15)
            assert _limits(proc.pid) == (hard, hard)  # started at 256, raised to the hard limit
            warned = "open-file limit" in log.read_text()
            assert warned is low  # 5,000 connections need more than 2,048 descriptors; 100 do not
        finally:
            proc.terminate()
            proc.wait(10)
