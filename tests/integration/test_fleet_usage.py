"""The usage report of a fleet: `gateway usage` merges several gateways' /deprecations (repeated --admin, and
--discover NAME:PORT for every address of a name), and /deprecations answers for every worker of a process.

Real gateways on real sockets: the legacy upload guard records each blocked upload, the admin listeners serve the
reports, the command line (a real process, or main() for the DNS test) asks them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from gateway import cli
from gateway.core.http import token_fingerprint
from gateway.ops.admin import make_admin_app
from gateway.ops.workers import Peers
from tests.conftest import (ADMIN_HEADERS, ADMIN_TOKEN, GatewayFactory, RecordingUpstream, RunningGateway, admin_url, free_port, guarded_routes,
                            make_config)
from tests.process_testlib import ROOT, wait_for

UA = "legacy-uploader/2.1"


@pytest.fixture
async def admins() -> AsyncIterator[Any]:
    """``await admins(gw, host="127.0.0.1", port=0)``: the gateway's admin app on that address; its base URL."""
    runners: list[web.AppRunner] = []

    async def start(gw: RunningGateway, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> str:
        runner = web.AppRunner(make_admin_app(gw.gateway, **kwargs), access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, host, port).start()
        return admin_url(runner.addresses[0][1], host)

    yield start
    for runner in runners:
        await runner.cleanup()


async def _uploads(client: aiohttp.ClientSession, gw: RunningGateway, token: str, count: int) -> None:
    for _ in range(count):
        async with client.put(gw.url + "/api/v1/cards/1/files", data=b"file bytes",
                              headers={"Authorization": f"Bearer {token}", "User-Agent": UA}) as resp:
            assert resp.status == 403  # acme forbids legacy uploads: blocked, counted, never forwarded


async def _fleet(upstream: RecordingUpstream, start_gateway: GatewayFactory, count: int) -> list[RunningGateway]:
    return [await start_gateway(make_config(upstream.url, routes=guarded_routes())) for _ in range(count)]


async def _load(gateways: list[RunningGateway]) -> None:
    """"spread" makes 8 uploads on every gateway and is the first on none; "local" makes 30 on the first one only;
    each gateway has a champion of its own (9, 10, 11) and a tail of 25 clients with one upload each, so that the
    first answers (22 clients each) are cut short and the merge must ask again."""
    async with aiohttp.ClientSession() as client:
        for i, gw in enumerate(gateways):
            await _uploads(client, gw, "spread", 8)
            await _uploads(client, gw, f"champion-{i}", 9 + i)
            for j in range(25):
                await _uploads(client, gw, f"tail-{i}-{j}", 1)
        await _uploads(client, gateways[0], "local", 30)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "usage", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)


async def test_usage_merges_several_gateways_exactly(upstream: RecordingUpstream, start_gateway: GatewayFactory,
                                                     admins: Any) -> None:
    gateways = await _fleet(upstream, start_gateway, 3)
    urls = [await admins(gw) for gw in gateways]
    await _load(gateways)
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _run_cli(*(a for u in urls for a in ("--admin", u)),
                                                            "--top", "2", "--json"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["legacy_upload_guard"]
    rows = [(r["client"], r["tenant"], r["user_agent"], r["requests"], r["decisions"]) for r in report["top_clients"]]
    assert rows == [(token_fingerprint("Bearer local"), "acme", UA, 30, {"blocked": 30}),
                    (token_fingerprint("Bearer spread"), "acme", UA, 24, {"blocked": 24})]
    total = 3 * 8 + 9 + 10 + 11 + 3 * 25 + 30
    assert report["requests"] == total and report["by_decision"] == {"blocked": total}
    assert report["by_tenant"] == {"acme": {"blocked": total}}
    assert report["top_clients_exact"] is True
    assert "Bearer" not in out.stdout and "spread" not in out.stdout  # fingerprints, never tokens

    text = await loop.run_in_executor(None, lambda: _run_cli(*(a for u in urls for a in ("--admin", u)),
                                                             "--top", "3"))
    assert text.returncode == 0, text.stderr
    assert f"merged from 3 gateways: {', '.join(urls)}" in text.stdout
    assert f"legacy_upload_guard: {total} requests" in text.stdout and "by tenant: acme " + str(total) in text.stdout
    lines = [line.split() for line in text.stdout.splitlines() if UA in line]
    assert [(line[0], line[1]) for line in lines] == [
        ("30", token_fingerprint("Bearer local")), ("24", token_fingerprint("Bearer spread")),
        ("11", token_fingerprint("Bearer champion-2"))]


async def test_usage_says_which_gateway_it_could_not_read(upstream: RecordingUpstream,
                                                          start_gateway: GatewayFactory, admins: Any) -> None:
    gateways = await _fleet(upstream, start_gateway, 1)
    url = await admins(gateways[0])
    async with aiohttp.ClientSession() as client:
        await _uploads(client, gateways[0], "someone", 2)
    dead = f"http://127.0.0.1:{free_port()}"
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _run_cli("--admin", url, "--admin", dead))
    assert out.returncode == 1
    assert f"cannot read {dead}/deprecations" in out.stderr
    assert "legacy_upload_guard: 2 requests" in out.stdout  # what the others answered is still shown
    out = await loop.run_in_executor(None, lambda: _run_cli("--discover", "no-such-name.invalid:9090"))
    assert out.returncode == 1 and "cannot resolve no-such-name.invalid" in out.stderr


async def test_discover_asks_every_address_of_a_name(upstream: RecordingUpstream, start_gateway: GatewayFactory,
                                                     admins: Any, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Two gateways' admin listeners on the same port of two loopback addresses, as two pods behind a headless
    Service; the name resolves to both (and to one of them twice, over two families' worth of answers)."""
    gateways = await _fleet(upstream, start_gateway, 2)
    port = free_port()
    await admins(gateways[0], "127.0.0.1", port)
    await admins(gateways[1], "127.0.0.2", port)
    async with aiohttp.ClientSession() as client:
        await _uploads(client, gateways[0], "pod-a-client", 3)
        await _uploads(client, gateways[1], "pod-b-client", 4)
    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "admin-pods.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN)  # discovered addresses carry no credentials
    loop = asyncio.get_running_loop()
    code = await loop.run_in_executor(None, lambda: cli.main(["usage", "--discover", f"admin-pods.test:{port}"]))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"merged from 2 gateways: http://127.0.0.1:{port}, http://127.0.0.2:{port}" in out.out
    assert "legacy_upload_guard: 7 requests" in out.out
    assert token_fingerprint("Bearer pod-a-client") in out.out and token_fingerprint("Bearer pod-b-client") in out.out


async def test_deprecations_fails_rather_than_answer_for_part_of_the_workers(
        upstream: RecordingUpstream, start_gateway: GatewayFactory, admins: Any, tmp_path: Path) -> None:
    """A sibling that accepts but never answers: 503 naming it; one whose socket is left behind by an exited worker
    (nobody listens): left out."""
    gw = (await _fleet(upstream, start_gateway, 1))[0]
    async with aiohttp.ClientSession() as client:
        await _uploads(client, gw, "someone", 2)
    directory = tmp_path / "w"
    directory.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "111.sock"))
    stale.close()  # the file stays, nothing listens: connection refused
    peers = Peers(str(directory), pid=999)
    url = await admins(gw, peers=peers)
    async with aiohttp.ClientSession() as client, client.get(url + "/deprecations") as resp:
        assert resp.status == 200
        assert (await resp.json())["legacy_upload_guard"]["requests"] == 2
    stuck = socket.socket(socket.AF_UNIX)
    stuck.bind(str(directory / "222.sock"))
    stuck.listen()  # accepts (the kernel's backlog), never answers
    peers.timeout = 0.5
    try:
        async with aiohttp.ClientSession() as client, client.get(url + "/deprecations") as resp:
            assert resp.status == 503
            body = await resp.json()
        assert body["code"] == "WORKERS_UNAVAILABLE" and "worker 222" in body["message"]
    finally:
        stuck.close()


async def test_deprecations_answers_for_every_worker(upstream: RecordingUpstream, tmp_path: Path) -> None:
    """`gateway serve --workers 2`: whichever worker takes the scrape reports the uploads both received; a worker
    killed (and restarted by the supervisor) takes its share with it but does not break the report."""
    port, admin = free_port(), free_port()
    config = make_config(upstream.url, routes=guarded_routes())
    config["server"] = {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{admin}", "admin_token": ADMIN_TOKEN}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the supervisor's private directory goes there
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        def sockets() -> list[Path]:
            return sorted(tmp_path.glob("gateway-workers-*/*.sock"))

        async def both_listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError("the gateway exited")
            return len(sockets()) == 2 and all(await asyncio.gather(*(_answers(s) for s in sockets())))

        await wait_for(both_listening, 20)
        async with aiohttp.ClientSession() as client:
            for i in range(40):
                # A new connection each time, so the kernel spreads them over both workers.
                async with client.put(f"http://127.0.0.1:{port}/api/v1/cards/1/files", data=b"x",
                                      headers={"Authorization": f"Bearer token-{i % 4}", "User-Agent": UA,
                                               "Connection": "close"}) as resp:
                    assert resp.status == 403
        shares = {s.stem: await _local_requests(s) for s in sockets()}
        assert sum(shares.values()) == 40 and all(shares.values()), shares  # both workers took some
        async with aiohttp.ClientSession() as client:
            for _ in range(6):  # whichever worker answers, the whole process
                async with client.get(f"http://127.0.0.1:{admin}/deprecations?top=10",
                                      headers={"Connection": "close", **ADMIN_HEADERS}) as resp:
                    assert resp.status == 200
                    report = (await resp.json())["legacy_upload_guard"]
                assert report["requests"] == 40 and report["top_clients_exact"] is True
                assert sorted(r["requests"] for r in report["top_clients"]) == [10, 10, 10, 10]
            async with client.get(f"http://127.0.0.1:{admin}/status.json",
                                  headers={"Connection": "close", **ADMIN_HEADERS}) as resp:
                status = await resp.json()
            assert len(status["workers"]["answered"]) == 2 and status["workers"]["failed"] == {}
            assert status["usage"]["policies"][0]["requests"] == 40
            victim = next(iter(shares))
            os.kill(int(victim), signal.SIGKILL)

            async def restarted() -> bool:
                names = {s.stem for s in sockets()}
                return victim not in names and len(names) == 2

            for _ in range(6):  # before and after the supervisor notices
                async with client.get(f"http://127.0.0.1:{admin}/deprecations",
                                      headers={"Connection": "close", **ADMIN_HEADERS}) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["legacy_upload_guard"]["requests"] == 40 - shares[victim]
            await wait_for(restarted, 15)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert not list(tmp_path.glob("gateway-workers-*")), "the supervisor removes its directory"


async def _answers(path: Path) -> bool:
    try:
        await _local_requests(path)
        return True
    except (aiohttp.ClientError, OSError):
        return False


async def _local_requests(path: Path) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as client, client.get(
            "http://worker/usage?top=100") as resp:
        report = await resp.json()
    return int(report["legacy_upload_guard"]["requests"]) if report else 0
