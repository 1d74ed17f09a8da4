"""Issue 21's figures: what the usage ledger costs.

1. Throughput: the 1 KB scenario on a deprecated route (GET of a 1 KB board through the board_cards policy, every
   request recorded; wrk -t1 -c50 rotating 1,000 client tokens) with the ledger off, on SQLite and on PostgreSQL,
   each a gateway process in front of the same nginx. Rounds are interleaved (the order rotates each round) and
   the ratios are medians of per-round ratios against "off", measured in the same run.
2. One flush with 100,000 distinct clients in an hour's bucket (the most ``usage.max_clients`` allows per
   behaviour): the write's time (new rows, then the same rows again: the upserts' update path), the database's size
   per row, what the counter holds in memory, ``record``'s cost per request, and the event loop's longest stall
   while the ledger's thread writes (the event loop must never wait for the database).
3. With ``--reads N`` (issue 32): the status page read over a ledger of N clients in its window, on SQLite and on
   PostgreSQL: one read's time, the gateway's peak memory growth, and the public listener's p99 latency with no
   page open and with three pages refreshing every 10 s (``reads``).

    .venv/bin/python bench/ledger.py [--rounds 3] [--duration 10] [--clients 100000] [--skip-throughput]
                                     [--skip-flush] [--reads 100000 [--reads-duration 30]]

Needs nginx and wrk (apt-get install -y nginx-light wrk) for part 1, and Debian's postgresql for the PostgreSQL
figures (started here in a temporary directory, as an unprivileged user: tests/postgres_testlib.py); without it the
PostgreSQL rows say so. Everything listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))
import run as harness  # noqa: E402 - the main harness's process and nginx helpers
from benchlib import cpu_seconds, tool  # noqa: E402

from gateway.config.ledger import LedgerConfig  # noqa: E402
from gateway.ops.ledger import Ledger, LedgerFamilies, Query, window  # noqa: E402
from gateway.ops.ledger.store import Store  # noqa: E402
from gateway.ops.usage import UsageCounter  # noqa: E402

BOARD = {"id": 1, "title": "Board", "cards": [{"id": i, "title": f"card {i}", "column_id": 1} for i in range(16)]}
WRK_SCRIPT = """
local i = 0
request = function()
  i = (i % 1000) + 1
  return wrk.format("GET", nil, {["Authorization"] = "Bearer client-" .. i, ["User-Agent"] = "bench-client/1.0"})
end
"""
NGINX_BOARD = """\
    default_type application/json;
    server {{
        listen {host}:{port};
        root {docroot};
        location / {{ }}
    }}"""


def _postgres() -> Any:
    from tests import postgres_testlib

    try:
        return postgres_testlib.start_postgres()
    except RuntimeError as err:
        print(f"PostgreSQL: {err}; its rows are left out", file=sys.stderr)
        return None


def _pg_url(server: Any) -> str:
    from tests import postgres_testlib

    return str(server.url(server.create_database(), postgres_testlib.PASSWORD))


# --- 1. throughput -------------------------------------------------------------------------------------------------


def throughput(tmp: Path, rounds: int, duration: float, postgres: Any) -> tuple[dict[str, list[float]],
                                                                               dict[str, list[float]]]:
    """Requests per second, and the gateway's CPU seconds per request (steadier on a shared machine), per round."""
    nginx, wrk = tool("nginx"), tool("wrk")
    variants: dict[str, dict[str, Any]] = {"off": {"enabled": False},
                                           "SQLite": {"url": f"sqlite:///{tmp}/usage.sqlite3"}}
    if postgres is not None:
        variants["PostgreSQL"] = {"url": _pg_url(postgres)}
    ports = harness.pick_ports(18480, 1 + 2 * len(variants))
    results: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    pids: dict[str, int] = {}
    totals: dict[str, int] = dict.fromkeys(variants, 0)
    script = tmp / "clients.lua"
    script.write_text(WRK_SCRIPT)
    with harness.Stack() as stack:
        docroot = tmp / "www"
        (docroot / "api/v1/boards").mkdir(parents=True)
        body = json.dumps(BOARD).encode()
        (docroot / "api/v1/boards/1").write_bytes(body)
        conf = harness.nginx_conf(tmp, "upstream", NGINX_BOARD.format(host=harness.HOST, port=ports[0],
                                                                      docroot=docroot))
        upstream = stack.start(harness.Proc("upstream", [nginx, "-p", str(tmp), "-c", str(conf)], tmp))
        harness.wait_ready(upstream, harness.port_accepts(ports[0]))
        urls = {}
        for i, (name, ledger) in enumerate(variants.items()):
            port, admin = ports[1 + 2 * i], ports[2 + 2 * i]
            config = {
                "server": {"listen": f"{harness.HOST}:{port}", "admin_listen": f"{harness.HOST}:{admin}",
                           "shutdown_timeout": 2},
                "tenants": [{"name": "bench", "hosts": [harness.HOST], "upstream": f"http://{harness.HOST}:{ports[0]}",
                             "created": "2025-01-01"}],
                "routes": [{"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"],
                            "chain": [{"board_cards": {"cap": 100}}]}],
                "usage": {"ledger": ledger},
            }
            path = tmp / f"gw{i}.yaml"
            path.write_text(json.dumps(config))
            env = {**os.environ, "GATEWAY_NOW": "2026-09-15T00:00:00Z"}  # before the cap: cards pass, counted
            argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--log-level", "warning"]
            proc = stack.start(harness.Proc(f"gw{i}", argv, tmp, f"gw{i}-access.log", env=env, cwd=tmp))
            harness.wait_ready(proc, lambda: harness.http(f"http://{harness.HOST}:{admin}/readyz")[0] == 200)
            status, answer = harness.http(f"http://{harness.HOST}:{port}/api/v1/boards/1")
            assert status == 200 and json.loads(answer)["cards"], (name, status, answer[:200])
            urls[name] = f"http://{harness.HOST}:{port}/api/v1/boards/1"
            pids[name] = proc.pid
        names = list(variants)
        for rnd in range(rounds):
            order = names[rnd % len(names):] + names[: rnd % len(names)]
            for name in order:
                before = cpu_seconds(pids[name])
                out = subprocess.run([wrk, "-t1", "-c50", f"-d{int(duration)}s", "-s", str(script), urls[name]],
                                     capture_output=True, text=True, timeout=duration + 30)
                used = cpu_seconds(pids[name]) - before
                parsed = harness.parse_wrk(out.stdout)
                results[name].append(parsed["rps"])
                requests = int(_wrk_requests(out.stdout))
                totals[name] += requests
                cpu[name].append(used / max(requests, 1))
                print(f"round {rnd + 1}: ledger {name}: {parsed['rps']:,.0f} req/s ({requests} requests, "
                      f"{used / max(requests, 1) * 1e6:.0f} µs CPU each)", flush=True)
        # The ledger kept every request (the probe request included): read back from each database.
        for i, (name, ledger) in enumerate(variants.items()):
            if "url" not in ledger:
                continue
            admin = ports[2 + 2 * i]
            status, answer = harness.http(f"http://{harness.HOST}:{admin}/deprecations?since=1h&top=1", timeout=60)
            kept = json.loads(answer)["behaviours"]["board_cards"]["requests"] if status == 200 else None
            print(f"ledger {name}: {kept} requests in the ledger, wrk counted {totals[name] + 1} answered")
    return results, cpu


def _wrk_requests(output: str) -> float:
    import re

    match = re.search(r"(\d+) requests in", output)
    return float(match.group(1)) if match else 0.0


# --- 1b. the same, counted in instructions (callgrind): steady on a machine shared with other work ------------------


def instructions(tmp: Path, requests: int, postgres: Any) -> dict[str, tuple[float, float]]:
    """User-space instructions of the gateway process (every thread) under valgrind's callgrind, counted in windows
    (callgrind_control: zero, then dump): ``requests`` GETs of the board by 1,000 client tokens in turn (the
    request's path, the ledger's counting included), then the ledger's write of all of them (a read of
    ``/deprecations`` writes this process's counts first; a second read, with nothing left to write, is subtracted).
    Returns, per variant: (instructions per request on the request's path, instructions of that one write)."""
    import http.client
    import re
    import signal

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    nginx = tool("nginx")
    # "off" twice: the difference between its two runs is the measurement's own noise (hash seeds, memory layout).
    variants: dict[str, dict[str, Any]] = {"off": {"enabled": False},
                                           "SQLite": {"url": f"sqlite:///{tmp}/usage-i.sqlite3", "flush_interval": 3600},
                                           "off, again": {"enabled": False}}
    if postgres is not None:
        variants["PostgreSQL"] = {"url": _pg_url(postgres), "flush_interval": 3600}
    counts: dict[str, tuple[float, float]] = {}
    with harness.Stack() as stack:
        docroot = tmp / "www-i"
        (docroot / "api/v1/boards").mkdir(parents=True)
        (docroot / "api/v1/boards/1").write_bytes(json.dumps(BOARD).encode())
        upstream_port = harness.pick_ports(18580, 1)[0]
        conf = harness.nginx_conf(tmp, "upstream-i", NGINX_BOARD.format(host=harness.HOST, port=upstream_port,
                                                                        docroot=docroot))
        upstream = stack.start(harness.Proc("upstream-i", [nginx, "-p", str(tmp), "-c", str(conf)], tmp))
        harness.wait_ready(upstream, harness.port_accepts(upstream_port))
        for name, ledger in variants.items():
            port, admin = harness.pick_ports(18590, 2)
            config = {
                "server": {"listen": f"{harness.HOST}:{port}", "admin_listen": f"{harness.HOST}:{admin}",
                           "shutdown_timeout": 5, "admin_open": ["/deprecations"]},
                "tenants": [{"name": "bench", "hosts": [harness.HOST],
                             "upstream": f"http://{harness.HOST}:{upstream_port}", "created": "2025-01-01"}],
                "routes": [{"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"],
                            "chain": [{"board_cards": {"cap": 100}}]}],
                "usage": {"ledger": {**ledger, "flush_timeout": 120}},
            }
            path = tmp / f"gw-i-{name}.yaml"
            path.write_text(json.dumps(config))
            out = tmp / f"callgrind-{name}.out"
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                    sys.executable, "-m", "gateway", "serve", "--config", str(path),
                    "--log-level", "warning"]
            env = {**os.environ, "GATEWAY_NOW": "2026-09-15T00:00:00Z"}
            proc = stack.start(harness.Proc(f"gw-i-{name}", argv, tmp, f"gw-i-{name}.log", env=env, cwd=tmp))
            harness.wait_ready(proc, lambda: harness.http(f"http://{harness.HOST}:{admin}/readyz")[0] == 200,
                               timeout=300)
            conn = http.client.HTTPConnection(harness.HOST, port, timeout=60)

            def get(i: int) -> None:
                conn.request("GET", "/api/v1/boards/1", headers={"Authorization": f"Bearer client-{i % 1000}",
                                                                 "User-Agent": "bench-client/1.0"})
                answer = conn.getresponse()
                answer.read()
                assert answer.status == 200

            def control(*argv: str) -> None:
                subprocess.run(["callgrind_control", *argv, str(proc.pid)], capture_output=True, check=True)

            def read() -> None:
                status, _ = harness.http(f"http://{harness.HOST}:{admin}/deprecations?since=1h&top=1", timeout=300)
                assert status == 200, status

            for i in range(1000):  # warm up: first-request paths, every client once, the ledger's first write
                get(i)
            if "url" in ledger:
                read()
                read()
            control("-i", "on")
            control("-z")
            for i in range(requests):
                get(i)
            control("-d")  # window 1: the requests
            if "url" in ledger:
                read()
                control("-d")  # window 2: the write of what they counted, and a read
                read()
                control("-d")  # window 3: a read with nothing to write
            control("-i", "off")
            conn.close()
            proc.popen.send_signal(signal.SIGTERM)
            proc.popen.wait(600)
            stack.stop(proc)
            windows = []
            for suffix in (".1", ".2", ".3"):
                dump = Path(f"{out}{suffix}")
                if dump.exists():
                    total = re.search(r"^totals:\s*(\d+)", dump.read_text(errors="replace"), re.MULTILINE)
                    assert total is not None, dump
                    windows.append(int(total.group(1)))
            flush = float(windows[1] - windows[2]) if len(windows) == 3 else 0.0
            counts[name] = (windows[0] / requests, flush)
            print(f"instructions: ledger {name}: {counts[name][0] / 1e6:.4f} M per request, one write of them "
                  f"{flush / 1e6:.1f} M", flush=True)
    return counts


# --- 2. one flush of 100,000 clients ------------------------------------------------------------------------------


def _counter(clients: int, at: float) -> UsageCounter:
    return UsageCounter(max_clients=clients, max_rows=clients + 10, clock=lambda: at,
                        behaviours={"legacy_upload_guard": "legacy_uploads"})


def _fill(counter: UsageCounter, clients: int) -> UsageCounter:
    for i in range(clients):
        # A User-Agent string of its own per client, as each request's header is (one shared string understated what
        # a row costs: issue 32).
        counter.record({"legacy_upload_guard": "blocked"}, f"{i:012x}", f"bench-client/{i % 1 + 1}.0", "acme")
    return counter


def _batch(clients: int, at: float) -> UsageCounter:
    return _fill(_counter(clients, at), clients)


def flush_cost(tmp: Path, clients: int, postgres: Any) -> list[str]:
    at = time.time()
    lines = []
    # The counter: memory and the cost of a request's record.
    tracemalloc.start()
    counter = _batch(clients, at)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    started = time.perf_counter()
    again = 200_000
    for i in range(again):
        counter.record({"legacy_upload_guard": "blocked"}, f"{i % clients:012x}", "bench-client/1.0", "acme")
    per_record = (time.perf_counter() - started) / again
    lines.append(f"counter: {clients:,} clients held in {held / 2**20:.1f} MiB ({held / clients:.0f} B each); "
                 f"record() {per_record * 1e6:.2f} µs per request (an existing client)")
    urls = {"SQLite": f"sqlite:///{tmp}/flush.sqlite3"}
    if postgres is not None:
        urls["PostgreSQL"] = _pg_url(postgres)
    for name, url in urls.items():
        store = Store(url, timeout=120)
        store.migrate()
        times = []
        for _attempt in range(2):  # new rows, then the same keys again (ON CONFLICT DO UPDATE)
            batch = _batch(clients, at).take()
            assert batch is not None
            started = time.perf_counter()
            store.write(batch, at)
            times.append(time.perf_counter() - started)
        started = time.perf_counter()
        report = store.report(Query(*window(at - 3600, at + 1), top=20))
        read = time.perf_counter() - started
        assert report["behaviours"]["legacy_uploads"]["requests"] == 2 * clients
        size = _size(store, url)
        store.close()
        lag = asyncio.run(_loop_lag_during_flush(url, clients, at))
        lines.append(f"{name}: one flush of {clients:,} clients: {times[0]:.2f} s new rows, {times[1]:.2f} s the "
                     f"same rows again (upsert); {clients / times[0]:,.0f} rows/s; read back (top 20 of "
                     f"{clients:,}) {read:.2f} s; {size / clients:.0f} bytes per client row on disk; event loop's "
                     f"longest stall during the flush {lag[0] * 1000:.1f} ms (p99 of 1 ms ticks {lag[1] * 1000:.1f} ms)")
    return lines


def _size(store: Store, url: str) -> float:
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return float(conn.execute(text("SELECT pg_total_relation_size('usage_clients')")).scalar() or 0)


async def _loop_lag_during_flush(url: str, clients: int, at: float) -> tuple[float, float]:
    """The ledger as the gateway runs it: a batch of ``clients`` rows written by its thread while this loop ticks
    every millisecond; the longest and the 99th percentile of the delays between ticks beyond 1 ms."""
    counter = _counter(clients, at)
    ledger = Ledger(LedgerConfig(url=url, flush_interval=3600, flush_timeout=300), counter, redact=str,
                    families=LedgerFamilies(CollectorRegistry()))
    await ledger.start()
    while ledger.state != "ok":
        await asyncio.sleep(0.01)
    _fill(counter, clients)  # (before the ticks: what the requests themselves cost is measured above)
    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            lags.append(max(0.0, now - last - 0.001))
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    assert await ledger.flush()
    done.set()
    await ticker
    await ledger.close()
    lags.sort()
    return lags[-1], lags[int(len(lags) * 0.99)]


# --- 3. reading a large ledger: the status page ---------------------------------------------------------------------


def _seed(url: str, clients: int, at: float) -> None:
    """``clients`` client rows of this hour and their total, inserted as they are (quicker than upserts)."""
    from gateway.ops.ledger.schema import clients as client_rows, totals

    store = Store(url, timeout=120)
    store.migrate()
    hour = int(at) // 3600 * 3600
    with store.engine.begin() as conn:
        for start in range(0, clients, 20_000):
            conn.execute(client_rows.insert(), [
                {"bucket": hour, "behaviour": "board_cards", "tenant": "bench", "client": f"{i:012x}",
                 "user_agent": "bench-client/1.0", "decision": "full:passed", "requests": 2, "first_seen": at - i,
                 "last_seen": at - i} for i in range(start, min(clients, start + 20_000))])
        conn.execute(totals.insert(), [{"bucket": hour, "behaviour": "board_cards", "tenant": "bench",
                                        "decision": "full:passed", "requests": 2 * clients, "untracked": 0}])
    store.close()


def reads(tmp: Path, clients: int, postgres: Any, duration: float, pages: int, interval: float) -> list[str]:
    """The status page over a ledger holding ``clients`` client rows in its window (the default 30 days), per
    database: one read's time (a window of its own: a query, not a shared answer) and the gateway's peak memory
    growth over it; then the public listener's latency with no page open and with ``pages`` pages refreshing every
    ``interval`` seconds (staggered), ``duration`` seconds each. The latency comes from a probe in another process
    (tests/process_testlib.py), one GET of a board at a time, every 10 ms, through board_cards: every request is
    recorded, so each page's read finds new counts and queries the database (the worst case: pages refreshed with
    no new usage share one answer)."""
    from benchlib import percentile, proc_status

    from tests.process_testlib import LivezProbe

    nginx = tool("nginx")
    urls = {"SQLite": f"sqlite:///{tmp}/reads.sqlite3"}
    if postgres is not None:
        urls["PostgreSQL"] = _pg_url(postgres)
    lines = []
    token = "bench-admin-token-0123456789"
    headers = {"Authorization": f"Bearer {token}"}
    with harness.Stack() as stack:
        docroot = tmp / "www-r"
        (docroot / "api/v1/boards").mkdir(parents=True)
        (docroot / "api/v1/boards/1").write_bytes(json.dumps(BOARD).encode())
        upstream_port = harness.pick_ports(18680, 1)[0]
        conf = harness.nginx_conf(tmp, "upstream-r", NGINX_BOARD.format(host=harness.HOST, port=upstream_port,
                                                                        docroot=docroot))
        upstream = stack.start(harness.Proc("upstream-r", [nginx, "-p", str(tmp), "-c", str(conf)], tmp))
        harness.wait_ready(upstream, harness.port_accepts(upstream_port))
        for name, url in urls.items():
            _seed(url, clients, time.time())
            port, admin = harness.pick_ports(18690, 2)
            config = {
                "server": {"listen": f"{harness.HOST}:{port}", "admin_listen": f"{harness.HOST}:{admin}",
                           "admin_token": token, "shutdown_timeout": 2},
                "tenants": [{"name": "bench", "hosts": [harness.HOST],
                             "upstream": f"http://{harness.HOST}:{upstream_port}", "created": "2025-01-01"}],
                "routes": [{"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"],
                            "chain": [{"board_cards": {"cap": 100}}]}],
                "usage": {"ledger": {"url": url}},
            }
            path = tmp / f"gw-r-{name}.yaml"
            path.write_text(json.dumps(config))
            env = {**os.environ, "GATEWAY_NOW": "2026-09-15T00:00:00Z"}  # before the cap: cards pass, counted
            argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--log-level", "warning"]
            proc = stack.start(harness.Proc(f"gw-r-{name}", argv, tmp, f"gw-r-{name}.log", env=env, cwd=tmp))
            harness.wait_ready(proc, lambda: harness.http(f"http://{harness.HOST}:{admin}/readyz")[0] == 200)
            page = f"http://{harness.HOST}:{admin}/status.json"
            before = proc_status(proc.pid, "VmHWM") or 0
            started = time.perf_counter()
            status, body = harness.http(page + "?since=29d", timeout=120, headers=headers)
            one = time.perf_counter() - started
            assert status == 200, (status, body[:300])
            grown = (proc_status(proc.pid, "VmHWM") or 0) - before
            listed = json.loads(body)["usage"]["policies"][0]["clients"]
            assert listed == clients, (listed, clients)
            figures = {}
            for label, count in (("no page", 0), (f"{pages} pages", pages)):
                probe = LivezProbe(port, path="/api/v1/boards/1")
                times: list[float] = []
                stop = threading.Event()

                def refresh(offset: float) -> None:
                    if stop.wait(offset):
                        return
                    while True:
                        began = time.perf_counter()
                        answer, _ = harness.http(page, timeout=120, headers=headers)
                        assert answer == 200, answer
                        times.append(time.perf_counter() - began)
                        if stop.wait(max(0.0, interval - (time.perf_counter() - began))):
                            return

                threads = [threading.Thread(target=refresh, args=(i * interval / max(count, 1),))
                           for i in range(count)]
                for thread in threads:
                    thread.start()
                time.sleep(duration)
                stop.set()
                for thread in threads:
                    thread.join()
                asyncio.run(probe.finish())
                figures[label] = (probe.p99, probe.worst, probe.count, times)
            stack.stop(proc)
            quiet, busy = figures["no page"], figures[f"{pages} pages"]
            lines.append(
                f"{name}: {clients:,} clients in the window: one /status.json read {one:.2f} s, the gateway's peak "
                f"memory +{grown / 2**20:.0f} MiB; the public listener's p99 {quiet[0] * 1000:.1f} ms with no page "
                f"open, {busy[0] * 1000:.1f} ms with {pages} pages refreshing every {interval:g} s (slowest "
                f"{quiet[1] * 1000:.0f} and {busy[1] * 1000:.0f} ms; {busy[2]:,} requests; {len(busy[3])} page reads, "
                f"median {percentile(busy[3], 0.5):.2f} s)")
            print(lines[-1], flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-flush", action="store_true")
    parser.add_argument("--reads", type=int, default=0, metavar="N",
                        help="also read the status page over a ledger of N clients (e.g. 100000), with the public "
                             "listener's latency meanwhile")
    parser.add_argument("--reads-duration", type=float, default=30)
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory (callgrind's dumps)")
    parser.add_argument("--instructions", type=int, default=0, metavar="N",
                        help="also count instructions per request under callgrind over N requests (e.g. 4000)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-ledger-bench-"))
    postgres = _postgres()
    try:
        with open("/proc/loadavg") as f:
            print(f"load average at start: {f.read().split()[:3]}")
        if not args.skip_throughput:
            results, cpu = throughput(tmp, args.rounds, args.duration, postgres)
            base, base_cpu = results["off"], cpu["off"]
            print("\n| usage ledger | req/s (median) | vs off (median of per-round ratios) | per-round ratios | "
                  "CPU per request | vs off |\n|---|---|---|---|---|---|")
            for name, values in results.items():
                ratios = [v / b for v, b in zip(values, base, strict=True)]
                cpu_ratio = statistics.median(c / b for c, b in zip(cpu[name], base_cpu, strict=True))
                print(f"| {name} | {statistics.median(values):,.0f} | {statistics.median(ratios):.3f}x | "
                      f"{', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(cpu[name]) * 1e6:.0f} µs | "
                      f"{cpu_ratio:.3f}x |")
        if args.instructions:
            counts = instructions(tmp, args.instructions, postgres)
            base_path = counts["off"][0]
            n = args.instructions
            print(f"\n| usage ledger | instructions per request (request's path) | vs off | one write of {n:,} "
                  f"requests by 1,000 clients | with it: a write per {n:,} requests | a write per 40,000 requests "
                  "(10 s at 4,000 req/s) |\n|---|---:|---:|---:|---:|---:|")
            for name, (path, flush) in counts.items():
                print(f"| {name} | {path / 1e6:.4f} M | {path / base_path:.3f}x | {flush / 1e6:.1f} M | "
                      f"{(path + flush / n) / base_path:.3f}x | {(path + flush / 40_000) / base_path:.3f}x |")
        print()
        if not args.skip_flush:
            for line in flush_cost(tmp, args.clients, postgres):
                print(f"- {line}")
        if args.reads:
            print()
            for line in reads(tmp, args.reads, postgres, args.reads_duration, pages=3, interval=10):
                print(f"- {line}")
        with open("/proc/loadavg") as f:
            print(f"\nload average at the end: {f.read().split()[:3]}")
    finally:
        if postgres is not None:
            from tests import postgres_testlib

            postgres_testlib.remove(postgres)
        if args.keep_tmp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
