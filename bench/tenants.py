"""Issue 38: one gateway process in front of many companies. The config is the shipped one (config/gateway.yaml: its
routes, chains and rollout) with N generated companies instead of its own: each one host name and one upstream, half
of them created before 2026-05-21 (both file settings off by default), half after (both on).

    .venv/bin/python bench/tenants.py [--companies 1,1000,10000] [--runs 3] [--json FILE]
                                      [--rounds 5 --duration 10]   # the 1 KB request's throughput (0 rounds: none)
                                      [--pin]                      # ...the gateways on CPU 0, nginx and wrk on 1
                                      [--instructions 2000]        # ...and its instructions under callgrind

One row per N, each figure the median over ``--runs`` fresh processes, with its spread (min-max):

- ``start s``: seconds from ``gateway serve`` to its admin ``/readyz`` answering 200;
- ``RSS MiB``: the process's resident memory a second after it is ready;
- ``series``, ``scrape ms``: the samples of one admin ``/metrics`` answer and the time it takes (the median of 5,
  after a first one, which also counts the companies per phase: ``first scrape ms``);
- ``reload s``: seconds from a ``SIGHUP`` (the same file again) to the log line that says it is swapped in;
- ``reload hold ms``: the longest admin ``/livez`` answer while that reload runs, asked every 10 ms by a process of
  its own (tests/process_testlib.LivezProbe): how long the event loop was held;
- ``idle hold ms``: the same probe for a second before the reload, with nothing to do (the machine's floor);
- ``status s``, ``page s``, ``status hold ms``: one admin ``/status.json`` and one ``/status`` (the first page of
  companies, as an operator opens it), and the longest ``/livez`` answer meanwhile.

Then the 1 KB request (``GET /1k.json`` from nginx, through the catch-all route, as bench/run.py's 1k scenario)
through a gateway of the fewest and one of the most companies, both running at once in front of the same nginx, in
``--rounds`` interleaved wrk rounds (order alternating): each request names another company (``Host``, in turn over
every company of the config), so the many companies' gateway serves all of them. Its table: requests per second and
CPU per request (median and spread), and the ratios of the many to the few, per round (their median and spread).
On a shared machine those move by several percent from round to round; ``--instructions N`` also counts the
instructions each gateway executes over exactly N such requests under callgrind (valgrind), after one request of
every company: steady within about 0.5%.

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
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import run as harness  # noqa: E402 - the main harness's nginx config and wrk output reader
import yaml
from benchlib import HOST, cpu_seconds, free_port, proc_status, tool, wait_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.process_testlib import LivezProbe  # noqa: E402 - the /livez probe the bounds tests use too

PYTHON = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
SHIPPED = ROOT / "config" / "gateway.yaml"
RELOADED = "configuration reloaded from"
# No request is sent in the per-size measurements: the companies' upstream is a port nothing listens on.
NOWHERE = f"http://{HOST}:9"
TOKEN = "bench-admin-token"
ONE_KB = b'{"pad":"' + b"x" * 1012 + b'"}'


def company(i: int, upstream: str) -> dict[str, Any]:
    """The ``i``-th generated company: even ones created in 2025, odd ones in June 2026."""
    name = f"company-{i:05d}"
    return {"name": name, "hosts": [host(i)], "upstream": upstream,
            "created": "2025-03-01" if i % 2 == 0 else "2026-06-01"}


def host(i: int) -> str:
    return f"company-{i:05d}.example.test"


def config(companies: int, upstream: str = NOWHERE) -> dict[str, Any]:
    """config/gateway.yaml with ``companies`` generated companies instead of its own."""
    data: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    data["tenants"] = [company(i, upstream) for i in range(companies)]
    return data


def write_config(path: Path, companies: int, *, port: int, admin: int, upstream: str = NOWHERE) -> Path:
    """The config of ``companies`` as ``path``, listening on ``port`` and ``admin`` (its token ``TOKEN``), its usage
    ledger beside it."""
    data = config(companies, upstream)
    data["server"] = {**data["server"], "listen": f"{HOST}:{port}", "admin_listen": f"{HOST}:{admin}",
                      "admin_token": TOKEN}
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

    def get(self, path: str, timeout: float = 120.0) -> tuple[int, bytes, float]:
        """An admin path, with the token: its status, body and seconds."""
        began = time.monotonic()
        connection = http.client.HTTPConnection(HOST, self.admin, timeout=timeout)
        try:
            connection.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
            response = connection.getresponse()
            return response.status, response.read(), time.monotonic() - began
        finally:
            connection.close()


def _status(port: int, path: str) -> int:
    try:
        connection = http.client.HTTPConnection(HOST, port, timeout=5)
        connection.request("GET", path)
        status = connection.getresponse().status
        connection.close()
        return status
    except OSError:
        return 0


def start(tmp: Path, companies: int, timeout: float = 120.0, upstream: str = NOWHERE,
          wrapper: tuple[str, ...] = ()) -> Running:
    """``gateway serve`` on a generated config of ``companies`` (its argv after ``wrapper``: valgrind's); returns once
    its /readyz answers 200."""
    port, admin = free_port(), free_port()
    path = write_config(tmp / f"tenants-{companies}-{port}.yaml", companies, port=port, admin=admin, upstream=upstream)
    log = path.with_suffix(".log")
    with log.open("wb") as out:
        began = time.monotonic()
        proc = subprocess.Popen([*wrapper, PYTHON, "-m", "gateway", "serve", "--config", str(path)], cwd=ROOT,
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


async def started(running: Running) -> dict[str, float]:
    return {"start s": running.started}


async def memory(running: Running) -> dict[str, float]:
    await asyncio.sleep(1.0)
    return {"RSS MiB": (proc_status(running.proc.pid, "VmRSS") or 0) / 2**20}


async def scrape(running: Running) -> dict[str, float]:
    """``/metrics``: its samples, the first answer's time and the median of five more."""
    times = []
    for _ in range(6):
        status, body, seconds = await asyncio.to_thread(running.get, "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}: {body[:300]!r}")
        times.append(seconds * 1000)
    lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    return {"series": float(len(lines)), "first scrape ms": times[0], "scrape ms": statistics.median(times[1:])}


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


async def status(running: Running) -> dict[str, float]:
    """One /status.json and one /status while /livez is asked every 10 ms."""
    probe = LivezProbe(running.admin, PYTHON)
    try:
        await asyncio.sleep(0.2)
        answers = []
        for path in ("/status.json", "/status"):
            code, body, seconds = await asyncio.to_thread(running.get, path)
            if code != 200:
                raise RuntimeError(f"{path} answered {code}: {body[:300]!r}")
            answers.append(seconds)
        await asyncio.sleep(0.2)
    finally:
        await probe.finish()
    return {"status s": answers[0], "page s": answers[1], "status hold ms": probe.worst * 1000}


MEASURES: list[Callable[[Running], Awaitable[dict[str, float]]]] = [started, memory, scrape, reload, status]


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
        cells = [_spread([run[column] for run in runs]) for column in columns]
        lines.append(f"| {companies:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _spread(values: list[float], figure: Callable[[float], str] | None = None) -> str:
    """The median and, over several values, (min-max)."""
    show = figure or _figure
    if len(values) == 1:
        return show(values[0])
    return f"{show(statistics.median(values))} ({show(min(values))}-{show(max(values))})"


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


# --- the 1 KB request at few and many companies --------------------------------------------------------------------

# wrk names another company in each request, in turn over the config's companies.
_ROTATE = """
local count, i = {count}, 0
request = function()
  i = (i + 1) % count
  return wrk.format("GET", "/1k.json", {{Host = string.format("company-%05d.example.test", i)}})
end
"""


def _origin(tmp: Path, pin: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], int]:
    """nginx serving /1k.json on a port of its own (its argv after ``pin``: taskset's): the process and the port."""
    (tmp / "www").mkdir(exist_ok=True)
    (tmp / "www" / "1k.json").write_bytes(ONE_KB)
    origin = free_port()
    conf = harness.nginx_conf(tmp, "origin", harness.NGINX_STATIC.format(host=HOST, port=origin, docroot=tmp / "www"))
    upstream = subprocess.Popen([*pin, tool("nginx"), "-p", str(tmp), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait_port(origin, proc=upstream)
    except BaseException:
        upstream.kill()
        raise
    return upstream, origin


# --pin: the gateways on the first CPU, nginx and wrk on the second (each process then competes only with its kind).
GATEWAY_PIN = ("taskset", "-c", "0")
LOAD_PIN = ("taskset", "-c", "1")


def throughput(tmp: Path, few: int, many: int, rounds: int, duration: float, *, pin: bool = False) -> str:
    """The 1 KB request through a gateway of ``few`` and one of ``many`` companies, interleaved rounds: a table."""
    wrk = tool("wrk")
    upstream, origin = _origin(tmp, LOAD_PIN if pin else ())
    gateways: dict[int, Running] = {}
    try:
        for companies in (few, many):
            gateways[companies] = start(tmp, companies, upstream=f"http://{HOST}:{origin}",
                                        wrapper=GATEWAY_PIN if pin else ())
        scripts = {}
        for companies, running in gateways.items():
            script = scripts[companies] = tmp / f"rotate-{companies}.lua"
            script.write_text(_ROTATE.format(count=companies))
            _check_answer(running, companies)
        rps: dict[int, list[float]] = {n: [] for n in gateways}
        cpu: dict[int, list[float]] = {n: [] for n in gateways}
        for rnd in range(rounds):
            for companies in (few, many) if rnd % 2 == 0 else (many, few):
                running = gateways[companies]
                before = cpu_seconds(running.proc.pid)
                argv = [*(LOAD_PIN if pin else ()), wrk, "-t1", "-c50", f"-d{max(1, round(duration))}s", "-s", str(scripts[companies]),
                        f"http://{HOST}:{running.port}/1k.json"]
                out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
                result = harness.parse_wrk(out.stdout)
                if result["non2xx"] or result["socket_errors"]:
                    raise RuntimeError(f"{companies} companies: errors in wrk's run:\n{out.stdout}")
                rps[companies].append(result["rps"])
                cpu[companies].append((cpu_seconds(running.proc.pid) - before) / result["requests"] * 1e6)
                print(f"round {rnd + 1}, {companies:,} companies: {result['rps']:,.0f} req/s, "
                      f"{cpu[companies][-1]:.0f} us CPU per request", flush=True)
    finally:
        for running in gateways.values():
            running.stop()
        upstream.terminate()
        upstream.wait(10)
    ratio = [m / f for m, f in zip(rps[many], rps[few], strict=True)]
    cpu_ratio = [m / f for m, f in zip(cpu[many], cpu[few], strict=True)]
    return "\n".join([
        "| companies | req/s | CPU per request (us) |", "|---:|---:|---:|",
        *(f"| {n:,} | {_spread(rps[n])} | {_spread(cpu[n])} |" for n in (few, many)),
        "",
        f"{many:,} against {few:,} companies, per round (median and spread): {_spread(ratio, _ratio)} the requests "
        f"per second, {_spread(cpu_ratio, _ratio)} the CPU per request",
    ])


def _ratio(value: float) -> str:
    return f"{value:.3f}x"


def instructions(tmp: Path, few: int, many: int, requests: int, rounds: int) -> str:
    """Instructions per 1 KB request under callgrind, at ``few`` and ``many`` companies (each request naming the next
    company), ``rounds`` fresh processes of each, interleaved: a line."""
    valgrind = tool("valgrind", "valgrind")
    upstream, origin = _origin(tmp)
    per: dict[int, list[float]] = {few: [], many: []}
    try:
        for rnd in range(rounds):
            for companies in (few, many) if rnd % 2 == 0 else (many, few):
                per[companies].append(_count(tmp, companies, origin, requests, valgrind, f"{companies}-{rnd}"))
                print(f"round {rnd + 1}, {companies:,} companies: {per[companies][-1]:,.0f} instructions per request",
                      flush=True)
    finally:
        upstream.terminate()
        upstream.wait(10)
    ratios = [m / f for m, f in zip(per[many], per[few], strict=True)]
    return (f"Instructions per 1 KB request under callgrind: {_spread(per[few])} at {few:,} companies, "
            f"{_spread(per[many])} at {many:,}; {many:,} against {few:,}: {_spread(ratios, _ratio)}")


def _count(tmp: Path, companies: int, origin: int, requests: int, valgrind: str, tag: str) -> float:
    out = tmp / f"callgrind-{tag}.out"
    wrapper = (valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}")
    running = start(tmp, companies, timeout=900, upstream=f"http://{HOST}:{origin}", wrapper=wrapper)
    try:
        _rotate(running.port, companies, max(companies, 400), 0)  # every company once: what is built when first asked
        time.sleep(3)
        harness.callgrind_control(running.proc.pid, "-i", "on")
        _rotate(running.port, companies, requests, 7)
        harness.callgrind_control(running.proc.pid, "-i", "off")
        harness.callgrind_control(running.proc.pid, "-d")
    finally:
        running.stop()
    total, _ = harness.callgrind_total(out)
    if total == 0:
        raise RuntimeError(f"callgrind counted nothing for {companies} companies")
    return total / requests


def _rotate(port: int, companies: int, requests: int, first: int, connections: int = 4) -> None:
    """``requests`` GET /1k.json on ``connections`` kept-alive connections, each naming the next company."""
    errors: list[str] = []

    def send(offset: int, share: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=300)
        try:
            for i in range(share):
                connection.putrequest("GET", "/1k.json", skip_host=True, skip_accept_encoding=True)
                connection.putheader("Host", host((first + offset + i * connections) % companies))
                connection.endheaders()
                response = connection.getresponse()
                if response.status != 200 or response.read() != ONE_KB:
                    errors.append(f"HTTP {response.status}")
                    return
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(c, requests // connections + (c < requests % connections)))
               for c in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{companies} companies: {errors[0]}")


def _check_answer(running: Running, companies: int) -> None:
    """The last company's 1 KB answer comes back whole through the gateway before it is timed."""
    connection = http.client.HTTPConnection(HOST, running.port, timeout=10)
    try:
        connection.request("GET", "/1k.json", headers={"Host": host(companies - 1)})
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200 or body != ONE_KB:
        raise RuntimeError(f"{companies} companies: /1k.json answered {response.status} {body[:200]!r}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--companies", default="1,1000,10000",
                        help="numbers of companies, comma-separated (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per number (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="wrk rounds of the 1 KB request at the fewest and the most companies (0: none; "
                             "default: %(default)s)")
    parser.add_argument("--duration", type=float, default=10, help="seconds of each wrk round (default: %(default)s)")
    parser.add_argument("--pin", action="store_true",
                        help="throughput rounds: the gateways on CPU 0, nginx and wrk on CPU 1 (taskset)")
    parser.add_argument("--instructions", type=int, default=0, metavar="N",
                        help="also count instructions per 1 KB request under callgrind over N requests (0: not)")
    parser.add_argument("--instructions-rounds", type=int, default=2,
                        help="fresh processes of each size under callgrind (default: %(default)s)")
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
        if args.rounds > 0 and len(counts) > 1:
            print(throughput(Path(tmp), min(counts), max(counts), args.rounds, args.duration, pin=args.pin))
        if args.instructions > 0 and len(counts) > 1:
            print(instructions(Path(tmp), min(counts), max(counts), args.instructions, args.instructions_rounds))
    if args.json:
        args.json.write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
