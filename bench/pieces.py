"""Issue 24, item 4: what each piece of per-request infrastructure costs, in-process (best of N, microseconds).

    .venv/bin/python bench/pieces.py [--repeat 7]                      # this tree
    PYTHONPATH=/tmp/base .venv/bin/python bench/pieces.py               # another checkout (its gateway/ first)

Each figure is the minimum over ``--repeat`` runs of ``timeit`` divided by the calls per run: the least the machine's
other work added, not a mean. Rows that need code one tree does not have are left out (the hand-written metric
classes, the random buffer). Three parts:

- metrics: one request's updates, as the gateway makes them (in flight up, ``Metrics.observe_request`` with a counter
  and two histograms, in flight down), in one process and in prometheus-client's multiprocess mode (a child process
  with ``PROMETHEUS_MULTIPROC_DIR`` set, as under ``--workers``); and each update alone;
- ids: a request id, a new trace (its ids), a continued trace, and the ways of drawing 128 random bits as hex;
- the access log: the record encoded three ways, and ``Recorder.record`` of a typical proxied request with and
  without its line (the difference is the line), and with the line going through ``AccessLogWriter`` to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
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

    def request() -> None:
        gauge.inc()
        observe("acme", "board", "GET", 200, 0.0012, 0.0009)
        gauge.dec()

    request()
    row(f"metrics, {mode}: one request (in flight inc, observe_request, in flight dec)", best(request, 100_000, repeat))
    counter = metrics.requests.labels("acme", "board", "GET", "2xx")
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


def _typical() -> tuple[Any, Any, Any]:
    """A proxied request as the access log sees it: routed, with a request id, a trace, an upstream time."""
    from aiohttp.test_utils import make_mocked_request
    from yarl import URL

    from gateway.core.exchange import Exchange
    from gateway.core.route import Route
    from gateway.core.tenants import Tenant
    from gateway.core.tracecontext import new_trace

    request = make_mocked_request("GET", "/api/latest/boards/1?x=1", headers={
        "Host": "acme.example", "Authorization": "Bearer secret", "User-Agent": "bench/1"})
    request.writer.output_size = 1289
    tenant = Tenant("acme", ("acme.example",), URL("http://up"), None, False, False, False)
    exchange = Exchange(request, 0.0, tenant, Route.build("board", None, (), ()), {}, "/api/latest/boards/1", "x=1",
                        "GET")
    exchange.request_id = "0dd90f30c9a1b2d3e4f5061728394a5b"
    exchange.upstream_seconds = 0.005491
    exchange.decisions = {"board_cards": "removed"}
    return request, exchange, new_trace()


def access_log_rows(repeat: int) -> None:
    from gateway.ops.access_log import AccessLogWriter, Recorder
    from gateway.ops.metrics import Metrics

    request, exchange, trace = _typical()
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

    class Lines:
        def __init__(self) -> None:
            self.lines: list[Any] = []

        def write(self, line: Any) -> None:
            self.lines.append(line)
            if len(self.lines) > 10_000:
                self.lines.clear()

    metrics = Metrics(multiprocess=False)
    quiet = Recorder(metrics, None, None)
    listed = Recorder(metrics, None, Lines())
    with open(os.devnull, "w") as devnull:
        writer = AccessLogWriter(devnull, interval=3600, limit=64 * 1024)
        written = Recorder(metrics, None, writer)

        def call(recorder: Recorder) -> Callable[[], None]:
            return lambda: recorder.record(request, exchange, 200, 0.0, trace=trace)

        print("(the line: " + _line(listed, request, exchange, trace) + ")", file=sys.stderr)
        without = best(call(quiet), 100_000, repeat)
        with_line = best(call(listed), 100_000, repeat)
        with_writer = best(call(written), 100_000, repeat)
        writer.flush()
    row("access log: Recorder.record without its line (metrics only)", without)
    row("access log: Recorder.record with its line (to a list)", with_line)
    row("access log: the line alone (the difference)", with_line - without)
    row("access log: Recorder.record, the line through AccessLogWriter to /dev/null (64 KiB batches)", with_writer)
    row("access log: the line and its writing (the difference)", with_writer - without)


def _line(recorder: Any, request: Any, exchange: Any, trace: Any) -> str:
    recorder.record(request, exchange, 200, 0.0, trace=trace)
    line = recorder.sink.lines[-1]
    return line.decode() if isinstance(line, bytes) else str(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only-metrics", action="store_true", help=argparse.SUPPRESS)  # the multiprocess child
    args = parser.parse_args()
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
