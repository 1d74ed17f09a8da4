"""Issue 38: one gateway process in front of many companies. The config is the shipped one (config/gateway.yaml: its
routes, chains and rollout) with N generated companies instead of its own: each one host name and one upstream, half
of them created before 2026-05-21 (both file settings off by default), half after (both on).

    .venv/bin/python bench/tenants.py [--companies 1,1000,10000] [--runs 3] [--json FILE]

One row per N, each figure the median over ``--runs`` fresh processes, with its spread (min-max):

- ``start``: seconds from ``gateway serve`` to its admin ``/readyz`` answering 200;
- ``reload``: seconds from a ``SIGHUP`` (the same file again) to the log line that says it is swapped in;
- ``reload hold``: the longest admin ``/livez`` answer while that reload runs, asked every 10 ms by a process of its
  own (tests/process_testlib.LivezProbe): how long the event loop was held;
- ``idle hold``: the same probe for a second before the reload, with nothing to do (the machine's floor).

Extending it: a measurement is a function ``(Running) -> dict[str, float]`` in ``MEASURES`` (``Running`` is the
started process: its ports, pid and log); its columns join the table in the order they are returned. Everything on
127.0.0.1; every process started here is stopped (SIGTERM, then SIGKILL) whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from benchlib import HOST, free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.process_testlib import LivezProbe  # noqa: E402 - the /livez probe the bounds tests use too

PYTHON = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
SHIPPED = ROOT / "config" / "gateway.yaml"
RELOADED = "configuration reloaded from"
# No request is sent in these measurements: the companies' upstream is a port nothing listens on.
NOWHERE = f"http://{HOST}:9"


def company(i: int, upstream: str) -> dict[str, Any]:
    """The ``i``-th generated company: even ones created in 2025, odd ones in June 2026."""
    name = f"company-{i:05d}"
    return {"name": name, "hosts": [f"{name}.example.test"], "upstream": upstream,
            "created": "2025-03-01" if i % 2 == 0 else "2026-06-01"}


def config(companies: int, upstream: str = NOWHERE) -> dict[str, Any]:
    """config/gateway.yaml with ``companies`` generated companies instead of its own."""
    data: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    data["tenants"] = [company(i, upstream) for i in range(companies)]
    return data


def write_config(path: Path, companies: int, *, port: int, admin: int, upstream: str = NOWHERE) -> Path:
    """The config of ``companies`` as ``path``, listening on ``port`` and ``admin``, its usage ledger beside it."""
    data = config(companies, upstream)
    data["server"] = {**data["server"], "listen": f"{HOST}:{port}", "admin_listen": f"{HOST}:{admin}"}
    data["usage"] = {"ledger": {"url": f"sqlite:///{path.with_suffix('.sqlite3')}"}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class Running:
    """A gateway process started by ``start``."""

    proc: subprocess.Popen[bytes]
    port: int
    admin: int
    log: Path
    started: float  # seconds to ready

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _status(port: int, path: str) -> int:
    try:
        connection = http.client.HTTPConnection(HOST, port, timeout=5)
        connection.request("GET", path)
        status = connection.getresponse().status
        connection.close()
        return status
    except OSError:
        return 0


def start(tmp: Path, companies: int, timeout: float = 120.0) -> Running:
    """``gateway serve`` on a generated config of ``companies``; returns once its /readyz answers 200."""
    port, admin = free_port(), free_port()
    path = write_config(tmp / f"tenants-{companies}.yaml", companies, port=port, admin=admin)
    log = path.with_suffix(".log")
    with log.open("wb") as out:
        began = time.monotonic()
        proc = subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(path)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    running = Running(proc, port, admin, log, 0.0)
    deadline = began + timeout
    while _status(admin, "/readyz") != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            running.stop()
            raise RuntimeError(f"the gateway of {companies} companies did not start: {log.read_text()[-2000:]}")
        time.sleep(0.02)
    running.started = time.monotonic() - began
    return running


async def reload(running: Running, timeout: float = 120.0) -> dict[str, float]:
    """A SIGHUP while /livez is asked every 10 ms; the time until the reload is swapped in, and the longest answer."""
    idle = LivezProbe(running.admin, PYTHON)
    await asyncio.sleep(1.0)
    await idle.finish()
    done = running.log.read_text(errors="replace").count(RELOADED)
    probe = LivezProbe(running.admin, PYTHON)
    try:
        await asyncio.sleep(0.2)
        began = time.monotonic()
        running.proc.send_signal(signal.SIGHUP)
        while running.log.read_text(errors="replace").count(RELOADED) == done:
            if time.monotonic() - began > timeout or running.proc.poll() is not None:
                raise RuntimeError(f"no reload: {running.log.read_text(errors='replace')[-2000:]}")
            await asyncio.sleep(0.01)
        seconds = time.monotonic() - began
        await asyncio.sleep(0.2)
    finally:
        await probe.finish()
    return {"reload s": seconds, "reload hold ms": probe.worst * 1000, "idle hold ms": idle.worst * 1000}


async def started(running: Running) -> dict[str, float]:
    return {"start s": running.started}


MEASURES: list[Callable[[Running], Awaitable[dict[str, float]]]] = [started, reload]


async def measure(tmp: Path, companies: int) -> dict[str, float]:
    """One fresh process of ``companies``: every measure's columns."""
    running = start(tmp, companies)
    try:
        row: dict[str, float] = {}
        for each in MEASURES:
            row.update(await each(running))
        return row
    finally:
        running.stop()


def table(rows: dict[int, list[dict[str, float]]]) -> str:
    """A markdown table: one row per number of companies, each column's median over the runs and its spread."""
    columns = list(next(iter(rows.values()))[0])
    lines = ["| companies | " + " | ".join(columns) + " |", "|---:|" + "---:|" * len(columns)]
    for companies, runs in rows.items():
        cells = []
        for column in columns:
            values = [run[column] for run in runs]
            cells.append(f"{_figure(statistics.median(values))} ({_figure(min(values))}-{_figure(max(values))})"
                         if len(values) > 1 else _figure(values[0]))
        lines.append(f"| {companies:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--companies", default="1,1000,10000",
                        help="numbers of companies, comma-separated (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per number (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the runs as JSON to this file")
    args = parser.parse_args()
    counts = [int(n) for n in args.companies.split(",")]
    rows: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory(prefix="gw-tenants-") as tmp:
        for run in range(args.runs):
            for companies in counts:
                row = await measure(Path(tmp), companies)
                rows[companies].append(row)
                print(f"run {run + 1}, {companies} companies: "
                      + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
