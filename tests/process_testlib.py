"""A real gateway process for the tests that need one (signals, the access log on stdout, workers): started from a
config dict, ready when its admin listener says so, stopped at the end whatever happens."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_testlib import ADMIN_HEADERS, ADMIN_TOKEN, free_port

ROOT = Path(__file__).resolve().parent.parent

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """A /metrics text as {(sample name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


class Proc:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, admin: int, config_path: Path, log: Path) -> None:
        self.proc, self.port, self.admin, self.config_path, self.log = proc, port, admin, config_path, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def metrics(self) -> Samples:
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client, \
                client.get(f"http://127.0.0.1:{self.admin}/metrics") as resp:
            assert resp.status == 200, await resp.text()
            text = await resp.text()
        return samples(text)

    async def get_json(self, path: str) -> Any:
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client, \
                client.get(f"http://127.0.0.1:{self.admin}{path}") as resp:
            return await resp.json()

    def access_lines(self) -> list[dict[str, Any]]:
        """The JSON access-log lines written so far (stdout and stderr share the log file)."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def config(upstream: str, port: int, admin: int, **server: Any) -> dict[str, Any]:
    return {
        "server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{admin}", "admin_token": ADMIN_TOKEN,
                   **server},
        "tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": upstream}],
    }


def write_config(path: Path, data: dict[str, Any]) -> None:
    """``data`` as the YAML file ``path``, its usage ledger (unless given) a SQLite file beside it: never the default
    file in the working directory, which is the repository, shared by every test that leaves it at the default."""
    usage = data.get("usage", {})
    if "url" not in usage.get("ledger", {}):
        ledger = {**usage.get("ledger", {}), "url": f"sqlite:///{path.with_suffix('.sqlite3')}"}
        data = {**data, "usage": {**usage, "ledger": ledger}}
    path.write_text(yaml.safe_dump(data))


async def start(data: dict[str, Any], tmp_path: Path, *, env: dict[str, str] | None = None,
                name: str = "gateway", preexec: Callable[[], None] | None = None, timeout: float = 15) -> Proc:
    """A gateway process serving ``data`` (its listen addresses are set here); returns once it is ready, within
    ``timeout`` seconds. ``preexec``: run in the child before the gateway starts (a resource limit)."""
    port, admin = free_port(), free_port()
    data = {**data, "server": {"admin_token": ADMIN_TOKEN, **data.get("server", {}), "listen": f"127.0.0.1:{port}",
                               "admin_listen": f"127.0.0.1:{admin}"}}
    path = tmp_path / f"{name}.yaml"
    write_config(path, data)
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec)
    item = Proc(proc, port, admin, path, log)

    async def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the gateway exited: {log.read_text()[-2000:]}")
        try:
            async with aiohttp.ClientSession() as c, c.get(f"http://127.0.0.1:{admin}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    try:
        await wait_for(ready, timeout)
    except BaseException:
        item.stop()
        raise
    return item


# Asks for a path every 10 ms until its stdin closes, then prints the longest answer time and the count. A process of
# its own: in the caller's process, the GIL and the event loop serving the pages would be measured too.
_PROBE = """
import http.client, json, sys, threading, time
port, path, host = int(sys.argv[1]), sys.argv[2], sys.argv[3]
times, done = [], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers={"Host": host} if host else {})
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status
    connection.close()
    times.append(time.monotonic() - started)
    time.sleep(0.01)
times.sort()
print(json.dumps({"worst": times[-1] if times else 0.0, "count": len(times),
                  "p99": times[int(len(times) * 0.99)] if times else 0.0}))
"""


class LivezProbe:
    """How long a gateway's admin ``/livez`` (or another ``path`` answered 200) takes at worst (seconds) while it
    works: asked from another process from construction until ``finish``. Used by
    tests/integration/test_bridge_bounds.py, test_usage_ledger.py (a public path) and bench/bridges.py."""

    def __init__(self, port: int, python: str = sys.executable, *, path: str = "/livez", host: str = "") -> None:
        self._proc = subprocess.Popen([python, "-c", _PROBE, str(port), path, host], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE)
        self.worst = self.p99 = 0.0
        self.count = 0

    async def finish(self) -> None:
        out, _ = await asyncio.get_running_loop().run_in_executor(None, self._proc.communicate, b"")
        result = json.loads(out)
        self.worst, self.p99, self.count = result["worst"], result["p99"], result["count"]
