"""Issue 24, item 4: what each piece of per-request infrastructure costs, in-process (best of N, microseconds).

    .venv/bin/python bench/pieces.py [--repeat 7]                      # this tree
    PYTHONPATH=/tmp/base .venv/bin/python bench/pieces.py               # another checkout (its gateway/ first)
    .venv/bin/python bench/pieces.py --instructions 2000 --trees /tmp/base,.   # callgrind, per proxied request

Each figure is the minimum over ``--repeat`` runs of ``timeit`` divided by the calls per run: the least the machine's
other work added, not a mean. Rows that need code one tree does not have are left out (the hand-written metric
classes, the random buffer). Three parts:

- metrics: one request's updates, as the gateway makes them (in flight up, ``Metrics.observe_request`` with a counter
  and two histograms, in flight down), in one process and in prometheus-client's multiprocess mode (a child process
  with ``PROMETHEUS_MULTIPROC_DIR`` set, as under ``--workers``); and each update alone;
- ids: a request id, a new trace (its ids), a continued trace, and the ways of drawing 128 random bits as hex;
- the access log: the record encoded three ways, and ``Recorder.record`` of a typical proxied request with and
  without its line (the difference is the line), and with the line going through ``AccessLogWriter`` to a file.

``--instructions N``: instead, user-space instructions per proxied 1 KB GET under valgrind's callgrind (N requests
after 500 of warm-up), for each tree of ``--trees`` in turn, ``--runs`` times: what the pieces add up to on a whole
request, in a count the machine's other work does not move.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gateway  # noqa: E402


def best(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Microseconds per call: the fastest of ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def row(name: str, micros: float) -> None:
    print(f"| {name} | {micros:.3f} |", flush=True)


def metrics_rows(repeat: int) -> None:
    from gateway.ops.metrics import Metrics

    multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    _metrics_rows(Metrics(multiprocess=multiprocess), "multiprocess" if multiprocess else "one process", repeat)
    if not multiprocess and Path(gateway.__file__).with_name("ops").joinpath("local_metrics.py").exists():
        # A tree with its own classes in one process: prometheus-client's, in memory, beside them.
        _metrics_rows(Metrics(multiprocess=True), "one process, prometheus-client's classes", repeat)


def _metrics_rows(metrics: Any, mode: str, repeat: int) -> None:
    observe, gauge = metrics.observe_request, metrics.in_flight
    # A tree before issue 38 also labels the requests with their company.
    company = ("acme",) if len(inspect.signature(observe).parameters) == 6 else ()
    args = (*company, "board", "GET", 200, 0.0012, 0.0009)

    def request() -> None:
        gauge.inc()
        observe(*args)
        gauge.dec()

    request()
    row(f"metrics, {mode}: one request (in flight inc, observe_request, in flight dec)", best(request, 100_000, repeat))
    counter = metrics.requests.labels(*company, "board", "GET", "2xx")
    histogram = metrics.request_duration.labels("board")
    row(f"metrics, {mode}: counter child inc ({type(counter).__name__})", best(counter.inc, 200_000, repeat))
    row(f"metrics, {mode}: histogram child observe(0.0012)", best(lambda: histogram.observe(0.0012), 200_000, repeat))
    row(f"metrics, {mode}: gauge inc + dec", best(lambda: (gauge.inc(), gauge.dec()), 200_000, repeat))


def multiprocess_rows(repeat: int) -> None:
    """The same in a child with PROMETHEUS_MULTIPROC_DIR set before prometheus-client is imported (as a worker)."""
    with tempfile.TemporaryDirectory(prefix="pieces-metrics-") as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        subprocess.run([sys.executable, __file__, "--only-metrics", "--repeat", str(repeat)], env=env, check=True)


def id_rows(repeat: int) -> None:
    from gateway.core import http, tracecontext

    row("ids: new_request_id()", best(http.new_request_id, 500_000, repeat))
    row("ids: new_trace() (trace id, span id, the first upstream span id)", best(tracecontext.new_trace, 200_000, repeat))
    parent = tracecontext.TraceParent("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", True)
    row("ids: continued_trace(parent, '')", best(lambda: tracecontext.continued_trace(parent, ""), 200_000, repeat))
    row("ids: new_span_id()", best(tracecontext.new_span_id, 500_000, repeat))
    if hasattr(http, "random_hex") and "urandom" in (http.random_hex.__doc__ or ""):
        row("ids: the os.urandom buffer, random_hex(32)", best(lambda: http.random_hex(32), 500_000, repeat))
    row("ids: os.urandom(16).hex()", best(lambda: os.urandom(16).hex(), 500_000, repeat))
    bits = random.getrandbits
    row("ids: random.getrandbits(128).to_bytes(16).hex()", best(lambda: bits(128).to_bytes(16).hex(), 500_000, repeat))
    row("ids: f'{random.getrandbits(128):032x}'", best(lambda: f"{bits(128):032x}", 500_000, repeat))
    row("ids: '%032x' % random.getrandbits(128)", best(lambda: "%032x" % bits(128), 500_000, repeat))
    own = random.Random().getrandbits
    row("ids: a Random() of its own, '%032x' % getrandbits(128)", best(lambda: "%032x" % own(128), 500_000, repeat))


def _typical(decisions: bool) -> tuple[Any, Any, Any]:
    """A proxied request as the access log sees it: routed, with a request id, a trace, an upstream time; with
    ``decisions``, a board request on which board_cards decided."""
    from aiohttp.test_utils import make_mocked_request
    from yarl import URL

    from gateway.core.exchange import Exchange
    from gateway.core.route import Route
    from gateway.core.tenants import Tenant
    from gateway.core.tracecontext import new_trace

    path = "/api/latest/boards/1" if decisions else "/api/latest/cards/7"
    request = make_mocked_request("GET", path + "?x=1", headers={
        "Host": "acme.example", "Authorization": "Bearer secret", "User-Agent": "bench/1"})
    request.writer.output_size = 1289
    tenant = Tenant("acme", ("acme.example",), URL("http://up"), None, False, False, False)
    route = Route.build("board" if decisions else "catch_all", None, (), ())
    exchange = Exchange(request, 0.0, tenant, route, {}, path, "x=1", "GET")
    exchange.request_id = "0dd90f30c9a1b2d3e4f5061728394a5b"
    exchange.record.upstream_seconds = 0.005491
    if decisions:
        exchange.decisions = {"board_cards": "removed"}
    return request, exchange, new_trace()


def access_log_rows(repeat: int) -> None:
    _, exchange, trace = _typical(True)
    record = {"time": 1795277386.828, "request_id": exchange.request_id, "trace_id": trace.trace_id,
              "span_id": trace.span_id, "tenant": "acme", "route": "board", "method": "GET",
              "path": "/api/latest/boards/1", "status": 200, "bytes_in": None, "bytes_out": 1289, "duration": 0.006017,
              "upstream_duration": 0.005491, "client": "5943d560853d", "decisions": {"board_cards": "removed"}}
    stdlib = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    row("access log: the record (a dict) by json.JSONEncoder(separators, ensure_ascii=False).encode",
        best(lambda: stdlib(record), 200_000, repeat))
    try:
        import orjson
    except ImportError:
        pass
    else:
        dumps = orjson.dumps
        row("access log: the record by orjson.dumps (bytes)", best(lambda: dumps(record), 200_000, repeat))
        row("access log: the record by orjson.dumps(...).decode() (str)",
            best(lambda: dumps(record).decode(), 200_000, repeat))
    for decisions in (False, True):
        asyncio.run(_recorder_rows(repeat, decisions))


class _Lines:
    def __init__(self) -> None:
        self.lines: list[Any] = []

    def write(self, line: Any) -> None:
        self.lines.append(line)
        if len(self.lines) > 10_000:
            self.lines.clear()


async def _recorder_rows(repeat: int, decisions: bool) -> None:
    """In a running event loop, as in the gateway: the writer's timer is set once, it flushes every 64 KiB."""
    from gateway.ops.access_log import AccessLogWriter, Recorder
    from gateway.ops.metrics import Metrics

    request, exchange, trace = _typical(decisions)
    metrics = Metrics(multiprocess=False)
    kind = "a board request with a decision" if decisions else "a plain request"
    with open(os.devnull, "w") as devnull:
        writer = AccessLogWriter(devnull, interval=3600, limit=64 * 1024)
        recorders = {"none": Recorder(metrics, None, None), "list": Recorder(metrics, None, _Lines()),
                     "writer": Recorder(metrics, None, writer)}
        clock = time.monotonic

        def call(recorder: Recorder) -> Callable[[], None]:
            # A duration of about 6 ms, as a small proxied request's.
            return lambda: recorder.record(request, exchange, 200, clock() - 0.006017, trace=trace)

        cost = {name: best(call(recorder), 100_000, repeat) for name, recorder in recorders.items()}
        writer.flush()
    print(f"({kind}: {recorders['list'].sink.lines[-1]})", file=sys.stderr)  # type: ignore[union-attr]
    row(f"access log, {kind}: Recorder.record without its line (metrics only)", cost["none"])
    row(f"access log, {kind}: the line (Recorder.record to a list, less the above)", cost["list"] - cost["none"])
    row(f"access log, {kind}: the line through AccessLogWriter to /dev/null (less the above)",
        cost["writer"] - cost["none"])


def instructions(requests: int, trees: list[tuple[Path, bool]], runs: int) -> None:
    """User-space instructions per proxied 1 KB GET (callgrind), each tree's gateway ``runs`` times, trees in turn: the
    gateway of bench/run.py (access log to a file, ``request_id``, metrics, the ledger on SQLite) in front of nginx.
    A tree given with True runs with ``PROMETHEUS_MULTIPROC_DIR`` set, as a worker of ``--workers N``."""
    import http.client
    import re
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import run as harness
    from benchlib import tool

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    nginx = tool("nginx")
    counts: dict[tuple[Path, bool], list[float]] = {target: [] for target in trees}
    with tempfile.TemporaryDirectory(prefix="pieces-instr-") as name, harness.Stack() as stack:
        tmp = Path(name)
        (tmp / "www").mkdir()
        (tmp / "www" / "1k.json").write_bytes(b'{"pad":"' + b"x" * 1012 + b'"}')
        upstream_port, port, admin = harness.pick_ports(18680, 3)
        conf = harness.nginx_conf(tmp, "upstream", harness.NGINX_STATIC.format(
            host=harness.HOST, port=upstream_port, docroot=tmp / "www"))
        upstream = stack.start(harness.Proc("upstream", [nginx, "-p", str(tmp), "-c", str(conf)], tmp))
        harness.wait_ready(upstream, harness.port_accepts(upstream_port))
        config = harness.gateway_conf(tmp, port, admin, upstream_port)
        for run in range(runs):
            for number, (tree, multiprocess) in enumerate(counts):
                out = tmp / f"callgrind-{number}-{run}.out"
                argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                        sys.executable, "-m", "gateway", "serve", "--config", str(config), "--log-level", "warning"]
                # The tree's own gateway: first on the path (python -m puts the working directory first).
                env = {**os.environ, "PYTHONPATH": str(tree)}
                if multiprocess:  # one process with the metrics of a worker of --workers
                    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / f"metrics-{number}-{run}")
                    os.mkdir(env["PROMETHEUS_MULTIPROC_DIR"])
                proc = stack.start(harness.Proc(f"gw-{number}-{run}", argv, tmp, f"gw-{number}-{run}-access.log",
                                                env=env, cwd=tree))
                harness.wait_ready(proc, lambda: harness.http(f"http://{harness.HOST}:{admin}/readyz")[0] == 200,
                                   timeout=300)
                conn = http.client.HTTPConnection(harness.HOST, port, timeout=60)

                def get() -> None:
                    conn.request("GET", "/1k.json", headers={"Authorization": "Bearer bench-client"})
                    answer = conn.getresponse()
                    answer.read()
                    assert answer.status == 200, answer.status

                def control(*args: str) -> None:
                    subprocess.run(["callgrind_control", *args, str(proc.pid)], capture_output=True, check=True)

                for _ in range(500):
                    get()
                control("-i", "on")
                control("-z")
                for _ in range(requests):
                    get()
                control("-d")
                control("-i", "off")
                conn.close()
                stack.stop(proc)
                dump = next(tmp.glob(f"callgrind-{number}-{run}.out.*"))
                total = re.search(r"^totals:\s*(\d+)", dump.read_text(errors="replace"), re.MULTILINE)
                assert total is not None, dump
                counts[tree, multiprocess].append(int(total.group(1)) / requests)
                print(f"{tree}: run {run + 1}: {counts[tree, multiprocess][-1]:,.0f} instructions per request",
                      file=sys.stderr, flush=True)
    first = sum(counts[trees[0]]) / runs
    print("| tree | instructions per request (each run) | mean | vs the first |\n|---|---|---:|---:|")
    for (tree, multiprocess), values in counts.items():
        mean = sum(values) / runs
        shown = f"{tree}, multiprocess" if multiprocess else str(tree)
        print(f"| {shown} | {' / '.join(f'{v:,.0f}' for v in values)} | {mean:,.0f} | {mean / first:.3f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--instructions", type=int, metavar="N", default=0,
                        help="instead: instructions per request under callgrind over N requests, per tree")
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parent.parent),
                        help="with --instructions: checkouts of the gateway, comma-separated (default: this one); "
                             "DIR:multiprocess runs that one with PROMETHEUS_MULTIPROC_DIR set, as a worker")
    parser.add_argument("--runs", type=int, default=2, help="with --instructions: runs of each tree, in turn")
    parser.add_argument("--only-metrics", action="store_true", help=argparse.SUPPRESS)  # the multiprocess child
    args = parser.parse_args()
    if args.instructions:
        specs = [t.partition(":") for t in args.trees.split(",")]
        instructions(args.instructions, [(Path(t).resolve(), mode == "multiprocess") for t, _, mode in specs], args.runs)
        return 0
    if args.only_metrics:
        metrics_rows(args.repeat)
        return 0
    print(f"gateway from {Path(gateway.__file__).parent}, Python {sys.version.split()[0]}, best of {args.repeat}",
          file=sys.stderr)
    print("| what | µs per call |\n|---|---:|")
    metrics_rows(args.repeat)
    multiprocess_rows(args.repeat)
    id_rows(args.repeat)
    access_log_rows(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
