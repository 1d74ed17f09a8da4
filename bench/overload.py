"""Overload: 3,000 client connections against one gateway process, with its connection limit on and off.

    .venv/bin/python bench/overload.py [--connections 3000] [--max-connections 1000] [--duration 10] [--rounds 3]

Starts nginx serving a 1 KB file (the upstream) and two gateways in front of it: one with ``server.max_connections: 0``
(no bound: every connection admitted), one with ``--max-connections``. A load generator in this process opens
``--connections`` keep-alive connections to the gateway under test and sends ``GET /1k.json`` on each in a closed
loop; a connection answered ``503 TOO_MANY_CONNECTIONS`` waits its ``Retry-After`` (1 s, with the jitter of many
independent clients: 0.5 to 1.5 s) before it connects again, as a well-behaved client does. Per round and gateway it reports the admitted requests' throughput and latency
percentiles (measured by the client: from writing the request to reading the whole answer, after ``--warmup`` seconds in which
every client connects at once), and how many answers were 503. Gateways take turns, round after round. Everything on 127.0.0.1; every run bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import free_port, tool, wait_port

ROOT = Path(__file__).resolve().parent.parent
EVENT_LOOP = os.environ.get("BENCH_EVENT_LOOP", "auto")
PYTHON = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
NGINX = """worker_processes 1; daemon off; master_process off; pid {tmp}/nginx.pid; error_log {tmp}/nginx.err;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{port}; root {tmp}; }} }}
"""


class Load:
    """Closed-loop clients on raw sockets: one request at a time per connection."""

    def __init__(self, port: int, connections: int, warmup: float) -> None:
        self.port = port
        self.connections = connections
        self.warmup = warmup  # seconds at the start whose requests are not counted (every client connecting at once)
        self.counting_from = 0.0
        self.rng = random.Random(7)
        self.request = b"GET /1k.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        self.latencies: list[float] = []
        self.busy = 0
        self.errors = 0

    async def client(self, stop: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < stop:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            try:
                while loop.time() < stop:
                    sent = loop.time()
                    writer.write(self.request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                    await reader.readexactly(length)
                    counted = sent >= self.counting_from
                    if head.startswith(b"HTTP/1.1 200"):
                        if counted:
                            self.latencies.append(loop.time() - sent)
                        continue
                    if head.startswith(b"HTTP/1.1 503"):
                        self.busy += counted
                        writer.close()
                        await asyncio.sleep(self.rng.uniform(0.5, 1.5))  # Retry-After: 1, with the jitter of many clients
                        break
                    self.errors += 1
                    break
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                self.errors += 1
            finally:
                writer.close()

    async def run(self, seconds: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self.counting_from = loop.time() + self.warmup
        stop = self.counting_from + seconds
        await asyncio.gather(*(self.client(stop) for _ in range(self.connections)))
        elapsed = seconds
        ordered = sorted(self.latencies)

        def pct(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")

        return {"admitted_per_s": len(ordered) / elapsed, "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
                "refused_503": self.busy, "errors": self.errors}


def gateway_config(port: int, upstream: int, max_connections: int) -> str:
    return json.dumps({
        "server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{free_port()}",
                   "max_connections": max_connections, "backlog": 4096, "event_loop": EVENT_LOOP},
        "access_log": {"enabled": False},
        "tenants": [{"name": "bench", "hosts": ["127.0.0.1"], "upstream": f"http://127.0.0.1:{upstream}"}],
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--max-connections", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds not counted at the start of each run")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.connections + 100:
        print(f"the open-file limit ({hard}) is below --connections", file=sys.stderr)
        return 2
    nginx = tool("nginx")
    tmp = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    (tmp / "1k.json").write_bytes(b"x" * 1024)
    upstream = free_port()
    (tmp / "nginx.conf").write_text(NGINX.format(tmp=tmp, port=upstream))
    procs: list[subprocess.Popen[bytes]] = []
    targets = {"no limit": 0, f"max_connections {args.max_connections}": args.max_connections}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    try:
        procs.append(subprocess.Popen([nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                                      stderr=subprocess.DEVNULL))
        wait_port(upstream)
        ports = {}
        for name, limit in targets.items():
            port = free_port()
            config = tmp / f"gateway-{port}.yaml"
            config.write_text(gateway_config(port, upstream, limit))
            procs.append(subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(config), "--log-level",
                                           "warning"], cwd=ROOT, stdout=subprocess.DEVNULL))
            wait_port(port)
            ports[name] = port
        for round_no in range(args.rounds):
            for name, port in ports.items():
                result = asyncio.run(Load(port, args.connections, args.warmup).run(args.duration))
                results[name].append(result)
                print(f"  round {round_no + 1}/{args.rounds} {name:<24} admitted {result['admitted_per_s']:7.0f}/s "
                      f"p50 {result['p50_ms']:7.1f} ms p99 {result['p99_ms']:7.1f} ms 503s {result['refused_503']}"
                      f" errors {result['errors']}", flush=True)
                time.sleep(2)  # let the refused clients' connections settle
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"{args.connections} connections, {args.rounds} rounds of {args.duration:g} s (medians)")
    print("| gateway | admitted requests/s | p50 | p90 | p99 | 503 answers per round |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(f"| {name} | {med['admitted_per_s']:,.0f} | {med['p50_ms']:.0f} ms | {med['p90_ms']:.0f} ms "
              f"| {med['p99_ms']:.0f} ms | {med['refused_503']:,.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
