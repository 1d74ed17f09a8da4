"""Benchmark harness: the gateway against nginx and a minimal aiohttp proxy, in interleaved rounds.

    .venv/bin/python bench/run.py [--quick] [--scenarios 1k,10m,download1g,upload1g] [--rounds N]
                                  [--transfer-rounds N] [--duration S] [--big-size BYTES]
                                  [--baseline DIR] [--trace-export RATIO[,RATIO...]] [--without PIECE[,PIECE...]]
    .venv/bin/python bench/run.py --instructions N [--instructions-connections C] [--instructions-rounds R]
                                  [--scenarios 1k] [--baseline DIR] [--trace-export RATIO[,RATIO...]]
                                  [--without PIECE[,PIECE...]]

Starts, on 127.0.0.1 only: nginx serving static files (the upstream), bench/sink.py (the upstream of uploads),
nginx as a reverse proxy (the reference; once with default buffers, once with 64 KiB buffers),
bench/minimal_proxy.py (the floor of a Python proxy) and the gateway. The proxies are started fresh for every
scenario, so the peak RSS reported (VmHWM) is that scenario's. ``--trace-export 1.0,0.1`` adds, per ratio, the
gateway with its OpenTelemetry export on (``tracing.export``, that ``sample_ratio``), sending its spans to
bench/sink.py (which answers 200 to anything, as a collector does); the spans it exported and dropped are read from
its metrics at the end. ``--without access_log,metrics,request_id,new_traces,ledger,fast_paths`` adds, per piece,
the gateway with that piece of its per-request work switched off in its configuration (the access log, the
per-request metrics, the ``request_id`` policy, the trace started for a request without ``traceparent``, the usage
ledger) or its environment (aiohttp's fast paths: ``GATEWAY_AIOHTTP_FAST_PATHS=off``, their public fallbacks
instead): the difference to the gateway is what the piece costs (what the fast paths save, for the last). Targets
are measured in interleaved rounds (the order rotates each round) and ratios are the median of ratios taken within
the same round, so that a noisy neighbour on the shared machine weighs on both sides of a ratio alike. Every wrk run
and transfer is bounded in time, and every process started is stopped at the end, on an error, on Ctrl-C and on
SIGTERM.

``--instructions N`` counts instructions instead of timing wrk (the 1k scenario only; wrk ratios move by ±20% on
the shared machine, callgrind's counts repeat within about 0.5%). Each Python proxy target (the minimal proxy, the
gateway, and the baseline and span-export gateways when asked for) runs in turn under valgrind's callgrind with
instrumentation off, in front of the same nginx upstream; once it is ready it gets 400 requests to warm up, the
harness waits until it is idle (a gateway still opens its usage ledger in a thread after /readyz answers), then
switches instrumentation on (``callgrind_control -i on``), sends exactly N ``GET /1k.json`` requests on C
keep-alive connections (N/C each, one after the other, every answer checked: 200 and the file's length), switches
it off, dumps, and stops the process. Instructions per request: the ``totals:`` lines of that process's dumps, summed,
divided by N (user space, every thread of the target; not the kernel, the client or the upstream). R rounds
repeat the whole set, the order rotating; the report gives per target the median, the min–max over rounds, and
the ratios to the minimal proxy (and to the baseline) as medians of per-round ratios. Needs valgrind.

Prints Markdown tables and writes them to bench/results/latest.md. Exits 0 when every measurement was valid
(the gateway missing a performance target does not fail the run), 1 when something failed (a process did not
start, a target answered wrongly, an upload arrived short, a count had no dump), 2 on a usage error, 128+N on
signal N. Stdlib only, besides the programs it starts (nginx, wrk, curl; valgrind for --instructions).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path

from benchlib import cpu_seconds as proc_cpu, proc_status, tool as _find_tool

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results" / "latest.md"
HOST = "127.0.0.1"
MiB = 1024 * 1024
GiB = 1024 * MiB

TARGETS = ("direct", "nginx", "nginx64k", "minimal", "gateway")
LABELS = {
    "direct": "direct (no proxy)",
    "nginx": "nginx proxy",
    "nginx64k": "nginx proxy, 64 KiB buffers",
    "minimal": "minimal aiohttp proxy",
    "gateway": "gateway",
    "baseline": "gateway, baseline tree (--baseline)",
}
PROXIES = ["nginx", "nginx64k", "minimal", "gateway", "baseline"]
# The gateways' admin token (the admin listener is closed without one): /metrics is read with it.
ADMIN_TOKEN = "bench-admin-token-0123456789"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _gateway_targets(labels: dict[str, str]) -> tuple[str, ...]:
    """More gateway targets (name -> label), registered in LABELS and PROXIES."""
    for target, label in labels.items():
        LABELS.setdefault(target, label)
        if target not in PROXIES:
            PROXIES.append(target)
    return tuple(labels)


def export_targets(ratios: tuple[float, ...]) -> tuple[str, ...]:
    """The gateway with its span export on, one target per sample ratio."""
    return _gateway_targets({f"export{ratio:g}": f"gateway, span export at ratio {ratio:g}" for ratio in ratios})


# --without: a piece of the gateway's per-request work switched off by its configuration, and what that takes.
WITHOUT: dict[str, dict[str, object]] = {
    "access_log": {"access_log": {"enabled": False}},
    "metrics": {"metrics": {"enabled": False}},
    "request_id": {"global_chain": []},
    "new_traces": {"tracing": {"new_traces": False}},
    "ledger": {"usage": {"ledger": {"enabled": False}}},
    "fast_paths": {},
}
# ... or by its environment: aiohttp's fast paths off, their public fallbacks in their place (core/aiohttp_fast.py).
WITHOUT_ENV: dict[str, dict[str, str]] = {"fast_paths": {"GATEWAY_AIOHTTP_FAST_PATHS": "off"}}


def without_targets(pieces: tuple[str, ...]) -> tuple[str, ...]:
    """The gateway with one piece switched off, one target per piece."""
    return _gateway_targets({f"without_{piece}": f"gateway without {piece}" for piece in pieces})


def span_counts(metrics: bytes) -> tuple[float, float]:
    """(spans exported, spans dropped) from a gateway's /metrics text."""
    exported = dropped = 0.0
    for line in metrics.decode(errors="replace").splitlines():
        name, _, value = line.rpartition(" ")
        if name == "gateway_trace_spans_exported_total":
            exported += float(value)
        elif name.startswith("gateway_trace_spans_dropped_total{"):
            dropped += float(value)
    return exported, dropped


class BenchError(Exception):
    """The harness cannot go on: a process did not start, or a target answered wrongly."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP: unwind, stopping every child process on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


# --------------------------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    kind: str  # "wrk" | "download" | "upload"
    path: str
    connections: int = 0
    # nginx with 64 KiB buffers is measured only where bodies are large: a 1 KB response fits the defaults.
    targets: tuple[str, ...] = TARGETS

    @property
    def transfer(self) -> bool:
        return self.kind != "wrk"


SCENARIOS = {
    "1k": Scenario("1k", "1 KB JSON response", "wrk", "/1k.json", 50, ("direct", "nginx", "minimal", "gateway")),
    "10m": Scenario("10m", "10 MiB response", "wrk", "/10m.bin", 4),
    "download1g": Scenario("download1g", "large download", "download", "/big.bin"),
    "upload1g": Scenario("upload1g", "large upload", "upload", "/upload"),
}


@dataclass
class Sample:
    target: str
    round: int
    value: float  # requests/s (wrk) or MiB/s (transfers)
    cpu_s: float  # CPU seconds used by the target's process during the measurement
    units: float  # requests (wrk) or bytes (transfers) done during the measurement
    seconds: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    mib_s: float | None = None
    problem: str | None = None  # the measurement is invalid (wrong answer): the run fails
    note: str | None = None  # worth reporting, figures kept (e.g. a few wrk socket errors)


@dataclass
class ScenarioResult:
    scenario: Scenario
    size: int
    rounds: int
    samples: list[Sample] = field(default_factory=list)
    peak_rss: dict[str, int] = field(default_factory=dict)  # target -> bytes (VmHWM)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # export target -> (exported, dropped)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of(self, target: str) -> list[Sample]:
        return [s for s in self.samples if s.target == target and s.problem is None]

    def median(self, target: str, attr: str) -> float | None:
        values = [getattr(s, attr) for s in self.of(target) if getattr(s, attr) is not None]
        return statistics.median(values) if values else None

    def paired_ratio(self, target: str, reference: str) -> float | None:
        """Median over rounds of value(target) / value(reference), both measured in the same round."""
        ref = {s.round: s.value for s in self.of(reference)}
        ratios = [s.value / ref[s.round] for s in self.of(target) if ref.get(s.round)]
        return statistics.median(ratios) if ratios else None

    def cpu_per_unit(self, target: str) -> float | None:
        samples = self.of(target)
        units = sum(s.units for s in samples)
        return sum(s.cpu_s for s in samples) / units if units else None


# --------------------------------------------------------------------------------------------- processes


class Proc:
    """A child process with its output in files; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: list[str], workdir: Path, stdout_name: str | None = None,
                 env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        self.name = name
        self.argv = argv
        self.stdout_path = workdir / (stdout_name or f"{name}.out")
        self.stderr_path = workdir / f"{name}.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # Own session: a Ctrl-C in the terminal reaches only the harness, which stops its children in order.
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, start_new_session=True, env=env
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        texts = []
        for path in (self.stderr_path, self.stdout_path):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").strip().splitlines()[-lines:]
                if text:
                    texts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(texts) or "(no output)"

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(5)


class Stack:
    """Every process the harness started; all stopped (last started first) on exit, error or Ctrl-C."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def stop(self, *procs: Proc) -> None:
        for proc in reversed(procs or tuple(self.procs)):
            proc.stop()
            if proc in self.procs:
                self.procs.remove(proc)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        # Ignore a second Ctrl-C or SIGTERM while stopping: leaving children behind is worse than a slow exit.
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
        try:
            self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers do: connections of an earlier run in TIME_WAIT do not make a port busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_ports(base: int, count: int) -> list[int]:
    """``base``, ``base+1``... when free; any free port in place of a busy one."""
    ports = []
    for port in range(base, base + count):
        if not port_free(port):
            with socket.socket() as sock:
                sock.bind((HOST, 0))
                port = sock.getsockname()[1]
        ports.append(port)
    return ports


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(url: str, method: str = "GET", data: bytes | None = None, timeout: float = 5.0,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=data, headers=headers or {})
    try:
        with _NO_PROXY.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_ready(proc: Proc, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise BenchError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        with contextlib.suppress(OSError, urllib.error.URLError, ConnectionError):
            if check():
                return
        time.sleep(0.05)
    raise BenchError(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.tail()}")


def port_accepts(port: int) -> Callable[[], bool]:
    def check() -> bool:
        with socket.create_connection((HOST, port), timeout=1):
            return True

    return check


# --------------------------------------------------------------------------------------------- configs

NGINX_COMMON = """\
worker_processes 1;
master_process off;
daemon off;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/{name}-tmp/body;
    proxy_temp_path {tmp}/{name}-tmp/proxy;
    fastcgi_temp_path {tmp}/{name}-tmp/fastcgi;
    uwsgi_temp_path {tmp}/{name}-tmp/uwsgi;
    scgi_temp_path {tmp}/{name}-tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
{body}
}}
"""

NGINX_STATIC = """\
    sendfile on;
    tcp_nopush on;
    types {{ application/json json; application/octet-stream bin; }}
    default_type application/octet-stream;
    server {{
        listen {host}:{port};
        root {docroot};
        location / {{ }}
    }}"""

# The reference proxy, configured as one would in production for a streaming API gateway:
# HTTP/1.1 keep-alive pool to the upstream, request bodies streamed (proxy_request_buffering off), response
# buffering left on (nginx's default: it frees the upstream connection early for small bodies) but never
# spilled to a temp file (proxy_max_temp_file_size 0) - the Python proxies never touch the disk either.
# Buffer sizes are nginx's defaults (8 x 4 KiB, client body 8 KiB on x86-64) for "nginx"; "nginx64k" is the same with
# 64 KiB buffers, as commonly tuned for large bodies, shown for large bodies so the reference is not a weak one.
NGINX_PROXY = """\
    upstream backend {{
        server {host}:{upstream_port};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen {host}:{port};
        client_max_body_size 0;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_request_buffering off;
            proxy_buffering on;
            proxy_max_temp_file_size 0;{tuning}
        }}
    }}"""


NGINX_64K = """
            client_body_buffer_size 64k;
            proxy_buffer_size 64k;
            proxy_buffers 8 64k;"""


def nginx_conf(tmp: Path, name: str, body: str) -> Path:
    (tmp / f"{name}-tmp").mkdir(exist_ok=True)
    path = tmp / f"{name}.conf"
    path.write_text(NGINX_COMMON.format(tmp=tmp, name=name, body=body))
    return path


def gateway_conf(tmp: Path, port: int, admin_port: int, upstream_port: int, name: str = "gateway",
                 tracing: dict[str, object] | None = None, patch: dict[str, object] | None = None) -> Path:
    # JSON is YAML: the harness needs no YAML library.
    config: dict[str, object] = {
        "server": {"listen": f"{HOST}:{port}", "admin_listen": f"{HOST}:{admin_port}", "shutdown_timeout": 2,
                   "admin_token": ADMIN_TOKEN},
        "access_log": {"enabled": True},
        "tenants": [{"name": "bench", "hosts": [HOST, "localhost"], "upstream": f"http://{HOST}:{upstream_port}"}],
        "global_chain": ["request_id"],
        # The usage ledger (on by default) in the run's temp dir, not the default file in the working directory.
        "usage": {"ledger": {"url": f"sqlite:///{tmp / name}-{upstream_port}-usage.sqlite3"}},
    }
    if tracing is not None:
        config["tracing"] = tracing
    for key, value in (patch or {}).items():
        current = config.get(key)
        config[key] = {**current, **value} if isinstance(value, dict) and isinstance(current, dict) else value
    path = tmp / f"{name}-{upstream_port}.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------------------------- environment


@dataclass
class Env:
    tmp: Path
    python: str
    nginx: str
    wrk: str
    curl: str
    ports: dict[str, int]
    big_size: int
    stack: Stack
    upstream: Proc | None = None
    sink: Proc | None = None
    # Another checkout of the gateway (an earlier commit, its C module built), run beside this one as "baseline".
    baseline: Path | None = None
    # The minimal proxy's event loop: the gateway's own (server.event_loop "auto": uvloop when installed).
    loop: str = "asyncio"
    # --trace-export: the gateway again with its span export on, one target per sample ratio ("export1.0"...).
    export_ratios: tuple[float, ...] = ()
    # --instructions: valgrind, which runs each Python proxy under callgrind.
    valgrind: str = ""
    # --without: the gateway again with one piece of its per-request work off, one target per piece.
    without: tuple[str, ...] = ()

    def targets(self, scenario: Scenario) -> tuple[str, ...]:
        extra = ("baseline",) if self.baseline is not None else ()
        return (*scenario.targets, *extra, *export_targets(self.export_ratios), *without_targets(self.without))

    @property
    def docroot(self) -> Path:
        return self.tmp / "www"

    @property
    def big_file(self) -> Path:
        return self.docroot / "big.bin"

    def url(self, target: str, path: str) -> str:
        return f"http://{HOST}:{self.ports[target]}{path}"

    def make_files(self) -> None:
        self.docroot.mkdir()
        items = [{"id": i, "name": f"item-{i:03d}", "ok": True} for i in range(24)]
        payload = json.dumps({"items": items}, separators=(",", ":")).encode()
        payload = payload[:-2] + b',"pad":"' + b"x" * max(0, 1024 - len(payload) - 10) + b'"}'
        (self.docroot / "1k.json").write_bytes(payload)
        with open(self.docroot / "10m.bin", "wb") as out:
            out.write(os.urandom(10 * MiB))
        with open(self.big_file, "wb") as out:  # sparse: costs no disk, reads as zeros
            out.truncate(self.big_size)

    def start_upstreams(self) -> None:
        body = NGINX_STATIC.format(host=HOST, port=self.ports["direct"], docroot=self.docroot)
        conf = nginx_conf(self.tmp, "upstream", body)
        self.upstream = self.stack.start(
            Proc("nginx-upstream", [self.nginx, "-p", str(self.tmp), "-c", str(conf)], self.tmp)
        )
        wait_ready(self.upstream, port_accepts(self.ports["direct"]))
        sink = [self.python, str(BENCH / "sink.py"), "--listen", f"{HOST}:{self.ports['sink']}"]
        self.sink = self.stack.start(Proc("sink", sink, self.tmp))
        wait_ready(self.sink, port_accepts(self.ports["sink"]))

    def admin_port(self, target: str) -> int:
        """The admin listener of a gateway target (``gateway``, ``baseline``, ``export...``)."""
        return self.ports["admin" if target == "gateway" else f"{target}_admin"]

    def ready(self, target: str) -> Callable[[], bool]:
        """A target is ready: the minimal proxy accepts connections, a gateway answers 200 on its admin /readyz."""
        if target == "minimal":
            return port_accepts(self.ports["minimal"])
        url = f"http://{HOST}:{self.admin_port(target)}/readyz"
        return lambda: http(url, headers=ADMIN_HEADERS)[0] == 200

    def start_python(self, target: str, upstream_port: int, tag: str, wrapper: tuple[str, ...] = (),
                     config_name: str | None = None) -> Proc:
        """Start one Python proxy target (``minimal``, ``gateway``, ``baseline`` or an ``export...`` target) in front of
        ``upstream_port``, its argv after ``wrapper`` (e.g. valgrind's); not waited for (see ``ready``)."""
        if target == "minimal":
            argv = [
                self.python, str(BENCH / "minimal_proxy.py"),
                "--listen", f"{HOST}:{self.ports['minimal']}", "--upstream", f"http://{HOST}:{upstream_port}",
                "--loop", self.loop,
            ]  # fmt: skip
            return self.stack.start(Proc(f"minimal-{tag}", [*wrapper, *argv], self.tmp))
        tracing: dict[str, object] | None = None
        patch: dict[str, object] | None = None
        env: dict[str, str] | None = None
        cwd = ROOT
        if target == "baseline":
            if self.baseline is None:
                raise BenchError("no --baseline tree to start")
            env, cwd = {**os.environ, "PYTHONPATH": str(self.baseline)}, self.baseline
        elif target.startswith("without_"):
            piece = target.removeprefix("without_")
            patch = WITHOUT[piece]
            if piece in WITHOUT_ENV:
                env = {**os.environ, **WITHOUT_ENV[piece]}
        elif target != "gateway":
            ratio = dict(zip(export_targets(self.export_ratios), self.export_ratios, strict=True))[target]
            tracing = {"sample_ratio": ratio, "export": {
                "enabled": True, "endpoint": f"http://{HOST}:{self.ports['sink']}/v1/traces"}}
        config = gateway_conf(self.tmp, self.ports[target], self.admin_port(target), upstream_port,
                              config_name or target, tracing, patch)
        argv = [self.python, "-m", "gateway", "serve", "--config", str(config), "--log-level", "warning"]
        # stdout is the JSON access log: written to a file, as in production, and part of the measured cost.
        return self.stack.start(
            Proc(f"{target}-{tag}", [*wrapper, *argv], self.tmp, f"{target}-{tag}-access.log", env=env, cwd=cwd)
        )

    def start_proxies(self, upstream_port: int, tag: str) -> dict[str, Proc]:
        """Fresh nginx proxy, minimal proxy and gateway in front of ``upstream_port``."""
        procs: dict[str, Proc] = {}
        try:
            for name, tuning in (("nginx", ""), ("nginx64k", NGINX_64K)):
                body = NGINX_PROXY.format(host=HOST, port=self.ports[name], upstream_port=upstream_port, tuning=tuning)
                conf = nginx_conf(self.tmp, f"proxy-{name}", body)
                procs[name] = self.stack.start(
                    Proc(f"{name}-proxy-{tag}", [self.nginx, "-p", str(self.tmp), "-c", str(conf)], self.tmp)
                )
            procs["minimal"] = self.start_python("minimal", upstream_port, tag)
            procs["gateway"] = self.start_python("gateway", upstream_port, tag)
            # The baseline and the span-export gateways are started one at a time, each once the one before is ready.
            for target in (*(("baseline",) if self.baseline is not None else ()), *export_targets(self.export_ratios),
                           *without_targets(self.without)):
                procs[target] = self.start_python(target, upstream_port, tag)
                wait_ready(procs[target], self.ready(target))
            for name in ("nginx", "nginx64k"):
                wait_ready(procs[name], port_accepts(self.ports[name]))
            wait_ready(procs["minimal"], self.ready("minimal"))
            wait_ready(procs["gateway"], self.ready("gateway"))
        except BaseException:
            self.stack.stop(*procs.values())
            raise
        return procs


# --------------------------------------------------------------------------------------------- measuring

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if not match:
        raise ValueError(f"cannot read wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(output: str) -> dict[str, float]:
    result: dict[str, float] = {}
    match = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if not match:
        raise ValueError("no Requests/sec in wrk output")
    result["rps"] = float(match.group(1))
    match = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m|h)", output)
    if match:
        result["requests"] = float(match.group(1))
        result["seconds"] = _ms(match.group(2) + match.group(3)) / 1e3
    for pct in ("50", "99"):
        match = re.search(rf"^\s+{pct}%\s+(\S+)", output, re.M)
        if match:
            result[f"p{pct}"] = _ms(match.group(1))
    match = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    result["non2xx"] = float(match.group(1)) if match else 0.0
    match = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    result["socket_errors"] = float(sum(int(g) for g in match.groups())) if match else 0.0
    return result


def run_wrk(env: Env, url: str, connections: int, duration: float) -> dict[str, float]:
    argv = [env.wrk, "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "5s", "--latency", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return parse_wrk(done.stdout)


def run_curl(env: Env, url: str, upload: Path | None, timeout: float) -> tuple[int, float, float, bytes]:
    """One transfer with curl; returns (status, bytes, seconds, response body or b'')."""
    out = env.tmp / "curl-body"
    argv = [
        env.curl,
        "-sS",
        "--noproxy",
        "*",
        "--max-time",
        str(round(timeout)),
        "-o",
        str(out if upload else os.devnull),
    ]
    if upload is not None:
        argv += ["-T", str(upload), "-w", "%{http_code} %{size_upload} %{time_total}"]
    else:
        argv += ["-w", "%{http_code} %{size_download} %{time_total}"]
    argv.append(url)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 10)
    if done.returncode != 0:
        raise BenchError(f"curl {url} failed ({done.returncode}): {done.stderr.strip()}")
    status, size, seconds = done.stdout.split()
    body = out.read_bytes() if upload is not None else b""
    return int(status), float(size), float(seconds), body


def measure(env: Env, scenario: Scenario, target: str, pid: int, rnd: int, duration: float) -> Sample:
    cpu_before = proc_cpu(pid)
    if scenario.kind == "wrk":
        result = run_wrk(env, env.url(target, scenario.path), scenario.connections, duration)
        cpu = proc_cpu(pid) - cpu_before
        file_size = (env.docroot / scenario.path.lstrip("/")).stat().st_size
        sample = Sample(
            target, rnd, result["rps"], cpu, result.get("requests", 0.0), result.get("seconds", duration),
            p50_ms=result.get("p50"), p99_ms=result.get("p99"), mib_s=result["rps"] * file_size / MiB,
        )  # fmt: skip
        if result["non2xx"]:
            sample.problem = f"{int(result['non2xx'])} non-2xx responses"
        elif result["socket_errors"]:
            sample.note = f"{int(result['socket_errors'])} wrk socket errors (timeouts or resets)"
        return sample
    upload = env.big_file if scenario.kind == "upload" else None
    url = env.url("sink" if (upload and target == "direct") else target, scenario.path)
    status, size, seconds, body = run_curl(env, url, upload, timeout=max(60.0, env.big_size / (20 * MiB)))
    cpu = proc_cpu(pid) - cpu_before
    sample = Sample(target, rnd, size / MiB / seconds, cpu, size, seconds)
    if status != 200:
        sample.problem = f"HTTP {status}"
    elif int(size) != env.big_size:
        sample.problem = f"transferred {int(size)} of {env.big_size} bytes"
    elif upload is not None and body.strip() != str(env.big_size).encode():
        sample.problem = f"sink received {body.strip().decode(errors='replace')!r}, expected {env.big_size}"
    return sample


def sanity_check(env: Env, scenario: Scenario, targets: dict[str, int]) -> None:
    """Every target answers the scenario's request correctly before it is timed."""
    for target in targets:
        if scenario.kind == "upload":
            url = env.url("sink" if target == "direct" else target, scenario.path)
            status, body = http(url, "PUT", b"x" * 100_000, timeout=10)
            ok = status == 200 and body.strip() == b"100000"
        elif scenario.kind == "download":
            status, _, _, _ = run_curl(env, env.url(target, scenario.path), None, timeout=60)
            ok = status == 200
            body = b""
        else:
            status, body = http(env.url(target, scenario.path), timeout=10)
            expected = (env.docroot / scenario.path.lstrip("/")).read_bytes()
            ok = status == 200 and body == expected
        if not ok:
            raise BenchError(f"{target} answered {scenario.path} wrongly: HTTP {status} {body[:200]!r}")


def run_scenario(
    env: Env, scenario: Scenario, rounds: int, duration: float, log: Callable[[str], None]
) -> ScenarioResult:
    assert env.upstream is not None and env.sink is not None
    size = env.big_size if scenario.transfer else (env.docroot / scenario.path.lstrip("/")).stat().st_size
    result = ScenarioResult(scenario, size, rounds)
    upstream = env.sink if scenario.kind == "upload" else env.upstream
    upstream_port = env.ports["sink" if scenario.kind == "upload" else "direct"]
    targets = env.targets(scenario)
    procs = env.start_proxies(upstream_port, scenario.key)
    try:
        everyone = {"direct": upstream, **procs}
        sanity_check(env, scenario, {t: everyone[t].pid for t in targets})
        if not scenario.transfer:  # warm up: connections, upstream pools, caches, the allocator
            for target in targets:
                run_wrk(env, env.url(target, scenario.path), scenario.connections, 1 if duration < 5 else 2)
        width = max(len(LABELS[t]) for t in targets)
        for rnd in range(rounds):
            shift = rnd % len(targets)
            for target in targets[shift:] + targets[:shift]:
                proc = everyone[target]
                if not proc.alive():
                    raise BenchError(f"{proc.name} died:\n{proc.tail()}")
                sample = measure(env, scenario, target, proc.pid, rnd, duration)
                result.samples.append(sample)
                detail = f"{sample.value:9,.0f} MiB/s" if scenario.transfer else f"{sample.value:9,.0f} req/s"
                if sample.p99_ms is not None:
                    detail += f", p50 {sample.p50_ms:.2f} ms, p99 {sample.p99_ms:.2f} ms"
                problem = f"  !! {sample.problem or sample.note}" if sample.problem or sample.note else ""
                log(f"  round {rnd + 1}/{rounds} {LABELS[target]:<{width}} {detail}{problem}")
                if sample.problem:
                    result.problems.append(f"{LABELS[target]} round {rnd + 1}: {sample.problem}")
                if sample.note:
                    result.notes.append(f"{LABELS[target]} round {rnd + 1}: {sample.note}")
        for name, proc in procs.items():
            rss = proc_status(proc.pid, "VmHWM")
            if rss is not None:
                result.peak_rss[name] = rss
        for target in export_targets(env.export_ratios):
            result.spans[target] = span_counts(http(f"http://{HOST}:{env.ports[f'{target}_admin']}/metrics",
                                                    headers=ADMIN_HEADERS)[1])
    finally:
        env.stack.stop(*procs.values())
    return result


# --------------------------------------------------------------------------------------------- instructions

WARMUP_REQUESTS = 400  # --instructions: requests each target serves before counting starts
STARTUP_TIMEOUT = 300.0  # a Python proxy under valgrind takes tens of seconds to import and start listening
STOP_TIMEOUT = 120.0  # ...and to shut down and write its last dump after SIGTERM
SETTLE_TIMEOUT = 120.0  # after the warm-up, how long a target may take to go quiet before it is counted


def wait_quiet(proc: Proc, timeout: float = SETTLE_TIMEOUT, most: float = 0.02) -> float:
    """Until ``proc`` uses at most ``most`` CPU seconds in one second (nothing sent to it): what it still does after
    its warm-up (a gateway opens its usage ledger in a thread, importing the database's libraries, which under
    valgrind goes on for seconds after /readyz answers) must not be counted as the requests' work. Returns the seconds
    waited; BenchError after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = proc_cpu(proc.pid)
        time.sleep(1.0)
        if not proc.alive():
            raise BenchError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        if proc_cpu(proc.pid) - before <= most:
            return time.monotonic() - started
    raise BenchError(f"{proc.name} still busy {timeout:.0f}s after its warm-up, with nothing sent to it")


@dataclass
class Count:
    """Instructions a Python proxy target executed (callgrind's Ir, user space, every thread) over ``requests``."""

    target: str
    round: int
    instructions: int
    requests: int
    seconds: float
    problem: str | None = None  # the count is invalid (a wrong answer, a missing dump): the run fails

    @property
    def per_request(self) -> float:
        return self.instructions / self.requests


@dataclass
class InstructionsResult:
    requests: int
    length: int  # bytes of the 1 KB file's body
    connections: int
    rounds: int
    targets: tuple[str, ...]
    counts: list[Count] = field(default_factory=list)
    # export target -> (spans exported, spans dropped), read from its /metrics after its last count
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def of(self, target: str) -> list[Count]:
        return [c for c in self.counts if c.target == target and c.problem is None]

    def per_request(self, target: str) -> list[float]:
        return [c.per_request for c in self.of(target)]

    def paired_ratio(self, target: str, reference: str) -> float | None:
        """Median over rounds of the per-request instructions of ``target`` / ``reference`` in the same round."""
        ref = {c.round: c.per_request for c in self.of(reference)}
        ratios = [c.per_request / ref[c.round] for c in self.of(target) if ref.get(c.round)]
        return statistics.median(ratios) if ratios else None


class FixedClient:
    """``connections`` keep-alive HTTP/1.1 connections to one target, kept open from the warm-up to the end of the
    count (no connection is opened or closed while counting). ``send(n)`` sends exactly ``n`` GET requests, split
    among the connections, each connection's share sequentially in its own thread, and checks every answer: status
    200 and a body of ``length`` bytes. The request is wrk's: a request line and a Host header, nothing else."""

    def __init__(self, port: int, path: str, length: int, connections: int, timeout: float = 120.0) -> None:
        self.path = path
        self.length = length
        self.conns = [HTTPConnection(HOST, port, timeout=timeout) for _ in range(connections)]
        self.done = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def _run(self, conn: HTTPConnection, requests: int) -> None:
        try:
            for _ in range(requests):
                conn.putrequest("GET", self.path, skip_accept_encoding=True)
                conn.endheaders()
                response = conn.getresponse()
                body = response.read()
                if response.status != 200 or len(body) != self.length:
                    raise BenchError(f"HTTP {response.status} with {len(body)} bytes, expected 200 with {self.length}")
                with self._lock:
                    self.done += 1
        except Exception as err:  # noqa: BLE001 - reported as the measurement's problem; this connection stops
            with self._lock:
                self.errors.append(f"{type(err).__name__}: {err}")

    def send(self, requests: int, progress: Callable[[int], None], every: float = 15.0) -> None:
        """Send ``requests`` requests; ``progress(done)`` every ``every`` seconds. Errors are in ``errors``."""
        self.done = 0
        shares = [requests // len(self.conns) + (i < requests % len(self.conns)) for i in range(len(self.conns))]
        threads = [threading.Thread(target=self._run, args=(conn, share), daemon=True)
                   for conn, share in zip(self.conns, shares, strict=True) if share]
        for thread in threads:
            thread.start()
        last = time.monotonic()
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(0.2)
            if time.monotonic() - last >= every:
                last = time.monotonic()
                progress(self.done)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def callgrind_control(pid: int, *command: str) -> None:
    """``callgrind_control COMMAND PID``; BenchError when it did not reach the process (it exits 0 even then)."""
    done = subprocess.run(["callgrind_control", *command, str(pid)], capture_output=True, text=True, timeout=120)
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or re.search(r"^(Error|No active callgrind)", text, re.MULTILINE):
        raise BenchError(f"callgrind_control {' '.join(command)} {pid} failed: {text}")


def callgrind_total(out: Path) -> tuple[int, list[str]]:
    """Instructions in every dump callgrind wrote for one process (``out.1``, ``out.2``... and, at exit, ``out``):
    the sum of their ``totals:`` lines. (``summary:`` counts from the start of the process: 0 with
    --instr-atstart=no.) Returns (total, the dump files' names)."""
    total, names = 0, []
    dumps = [out, *out.parent.glob(f"{out.name}.*")]
    for dump in sorted(d for d in dumps if d.exists() and (d == out or d.suffix[1:].isdigit())):
        match = re.search(r"^totals:\s*(\d+)", dump.read_text(errors="replace"), re.MULTILINE)
        if match is None:
            raise BenchError(f"no totals: line in callgrind's dump {dump}")
        total += int(match.group(1))
        names.append(dump.name)
    return total, names


def count_one(env: Env, target: str, rnd: int, args: argparse.Namespace, expected: bytes, result: InstructionsResult,
              log: Callable[[str], None]) -> Count:
    """One target under callgrind: start, wait until ready, warm up, count exactly N requests, dump, stop."""
    assert env.upstream is not None
    n = args.instructions
    if not env.upstream.alive():
        raise BenchError(f"the upstream nginx exited with {env.upstream.popen.returncode}:\n{env.upstream.tail()}")
    tag = f"i{rnd + 1}"
    out = env.tmp / f"callgrind-{target}-{tag}.out"
    wrapper = (env.valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}")
    proc = env.start_python(target, env.ports["direct"], tag, wrapper, config_name=f"{target}-{tag}")
    client: FixedClient | None = None
    try:
        started = time.monotonic()
        wait_ready(proc, env.ready(target), timeout=STARTUP_TIMEOUT)
        status, body = http(env.url(target, "/1k.json"), timeout=60)
        if status != 200 or body != expected:
            raise BenchError(f"{target} answered /1k.json wrongly: HTTP {status} {body[:200]!r}")
        log(f"    {LABELS[target]}: ready in {time.monotonic() - started:.0f}s; {WARMUP_REQUESTS} requests to warm up")
        client = FixedClient(env.ports[target], "/1k.json", len(expected), args.instructions_connections)
        client.send(WARMUP_REQUESTS, lambda done: log(f"      warm-up {done}/{WARMUP_REQUESTS}"))
        if client.errors:
            raise BenchError(f"{target} failed while warming up: {client.errors[0]}")
        log(f"    quiet {wait_quiet(proc):.0f}s after the warm-up")
        log(f"    counting {n} requests ({args.instructions_connections} connections)")
        callgrind_control(proc.pid, "-i", "on")
        started = time.monotonic()
        client.send(n, lambda done: log(f"      {done}/{n} requests, {time.monotonic() - started:.0f}s"))
        seconds = time.monotonic() - started
        callgrind_control(proc.pid, "-i", "off")
        callgrind_control(proc.pid, "-d")
        problem = None
        if client.errors or client.done != n:
            problem = f"{client.done} of {n} requests answered right; {'; '.join(sorted(set(client.errors)))}"
            if not env.upstream.alive():
                problem += f" (the upstream nginx exited with {env.upstream.popen.returncode}: killed from outside?)"
        if target in export_targets(env.export_ratios):
            metrics = http(f"http://{HOST}:{env.admin_port(target)}/metrics", headers=ADMIN_HEADERS, timeout=60)[1]
            result.spans[target] = span_counts(metrics)
        if not proc.alive():
            raise BenchError(f"{proc.name} died:\n{proc.tail()}")
    finally:
        if client is not None:
            client.close()
        proc.stop(STOP_TIMEOUT)  # SIGTERM: it writes its last dump as it exits (SIGKILL after the timeout)
        env.stack.stop(proc)
    total, dumps = callgrind_total(out)
    if not any(name != out.name for name in dumps):
        problem = problem or f"callgrind wrote no dump on request (files: {', '.join(dumps) or 'none'})"
    elif total == 0:
        problem = problem or "callgrind counted 0 instructions"
    count = Count(target, rnd, total, n, seconds, problem)
    note = f"  !! {problem}" if problem else ""
    log(f"    {LABELS[target]}: {count.per_request:,.0f} instructions per request ({total:,} over {n:,} requests,"
        f" {seconds:.0f}s; {' + '.join(dumps)}){note}")
    return count


def run_instructions(env: Env, args: argparse.Namespace, log: Callable[[str], None]) -> InstructionsResult:
    """The 1k scenario's Python proxies under callgrind, one at a time, in interleaved rounds (order rotating)."""
    targets = tuple(t for t in env.targets(SCENARIOS["1k"]) if t not in ("direct", "nginx"))
    expected = (env.docroot / "1k.json").read_bytes()
    result = InstructionsResult(args.instructions, len(expected), args.instructions_connections,
                                args.instructions_rounds, targets)
    for rnd in range(args.instructions_rounds):
        shift = rnd % len(targets)
        for target in targets[shift:] + targets[:shift]:
            log(f"  round {rnd + 1}/{args.instructions_rounds} {LABELS[target]}:")
            count = count_one(env, target, rnd, args, expected, result, log)
            result.counts.append(count)
            if count.problem:
                result.problems.append(f"{LABELS[target]} round {rnd + 1}: {count.problem}")
    return result


def render_instructions(r: InstructionsResult, info: dict[str, str]) -> str:
    baseline = "baseline" in r.targets
    lines = [
        f"# Gateway benchmark, instructions per request under callgrind — {info['date']}",
        "",
        f"Machine: {info['machine']}. Load average at start {info['load_start']}, at end {info['load_end']}.",
        f"Run: `{info['command']}` — 1 KB JSON response (`GET /1k.json`, {r.length:,} bytes) through each Python"
        f" proxy; N = {r.requests:,} requests per measurement on C = {r.connections} keep-alive connections, after"
        f" {WARMUP_REQUESTS} to warm up; {r.rounds} interleaved round(s); wall time {info['wall']}.",
        f"Gateway: {info['gateway']}, commit {info['commit']}. Event loop of the gateway and the minimal proxy:"
        f" {info['loop']}. {info['valgrind']} (callgrind, `--instr-atstart=no`). Versions: {info['versions']}.",
        "",
        "- Instructions are callgrind's count (Ir) of the proxy process, every thread, user space only, from",
        "  `callgrind_control -i on` to `-i off` around exactly N requests (the kernel's socket work, the client and",
        "  the upstream are not in it), divided by N: the sum of the `totals:` lines of the process's dumps.",
        "- Each target runs fresh under valgrind in each round, with the wrk mode's configuration (gateway: access log",
        "  to a file, `request_id`, the usage ledger on SQLite, metrics on). Ratios are medians of per-round ratios.",
        "",
        "### 1 KB JSON response — instructions per request",
        "",
        "| target | instructions per request | min–max over rounds | spread | vs minimal |"
        + (" vs baseline |" if baseline else ""),
        "|---|---:|---:|---:|---:|" + ("---:|" if baseline else ""),
    ]
    for target in r.targets:
        values = r.per_request(target)
        if not values:
            lines.append(f"| {LABELS[target]} | – | – | – | – |" + (" – |" if baseline else ""))
            continue
        median, low, high = statistics.median(values), min(values), max(values)
        row = (f"| {LABELS[target]} | {median / 1e3:,.1f} k | {low / 1e3:,.1f}–{high / 1e3:,.1f} k"
               f" | {(high - low) / median:.2%} | {_fmt(r.paired_ratio(target, 'minimal'), '.3f', '×')} |")
        if baseline:
            row += f" {_fmt(r.paired_ratio(target, 'baseline'), '.3f', '×')} |"
        lines.append(row)
    gm = r.paired_ratio("gateway", "minimal")
    lines += ["", f"Gateway vs minimal proxy: **{_fmt(gm, '.3f')}×** the instructions per request."]
    if baseline:
        lines += ["", f"Gateway vs the baseline tree: **{_fmt(r.paired_ratio('gateway', 'baseline'), '.3f')}×** the"
                      " instructions per request."]
    for target in [t for t in r.targets if t in r.spans]:
        exported, dropped = r.spans[target]
        ratio = _fmt(r.paired_ratio(target, "gateway"), ".3f")
        lines += ["", f"{LABELS[target]} vs gateway (export off): **{ratio}×** the instructions per request;"
                      f" {exported:,.0f} spans exported, {dropped:,.0f} dropped (its last round, warm-up included)."]
    pieces = [t for t in r.targets if t.startswith("without_") and r.per_request(t)]
    if pieces and r.per_request("gateway"):
        gateway = statistics.median(r.per_request("gateway"))
        lines += ["", "What each piece of the gateway's per-request work costs (the gateway with it on, less the gateway"
                      " with it off):", "", "| piece | instructions per request | share of the gateway's |",
                  "|---|---:|---:|"]
        for target in pieces:
            cost = gateway - statistics.median(r.per_request(target))
            lines.append(f"| {target.removeprefix('without_')} | {cost / 1e3:,.1f} k | {cost / gateway:.1%} |")
    if r.problems:
        lines += ["", "**Invalid measurements**: " + "; ".join(r.problems)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / MiB:.0f} MiB"


def _size(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB and n % GiB == 0 else f"{n // MiB} MiB"


@dataclass
class Check:
    name: str
    wanted: str
    got: str
    met: bool | None


def target_checks(results: dict[str, ScenarioResult]) -> list[Check]:
    """The issue's targets, each against the nginx proxy with default buffers (the 64 KiB one shown beside)."""
    checks = []

    def vs_nginx(r: ScenarioResult) -> tuple[float | None, str]:
        gn = r.paired_ratio("gateway", "nginx")
        text = f"{_fmt(gn, '.2f')}× nginx"
        if "nginx64k" in r.scenario.targets:
            text += f" ({_fmt(r.paired_ratio('gateway', 'nginx64k'), '.2f')}× nginx with 64 KiB buffers)"
        return gn, text

    if (r := results.get("1k")) is not None:
        gm, gn = r.paired_ratio("gateway", "minimal"), r.paired_ratio("gateway", "nginx")
        mn = r.paired_ratio("minimal", "nginx")
        got = f"{_fmt(gm, '.2f')}× minimal; gateway {_fmt(gn, '.3f')}× nginx, minimal {_fmt(mn, '.3f')}× nginx"
        checks.append(
            Check(
                "1 KB JSON, wrk -c50",
                "gateway ≥ 1.0× minimal proxy on the same event loop",
                got,
                None if gm is None else gm >= 1.0,
            )
        )
    if (r := results.get("10m")) is not None:
        gn, got = vs_nginx(r)
        checks.append(Check("10 MiB response, wrk -c4", "gateway ≥ 0.9× nginx", got, None if gn is None else gn >= 0.9))
    for key in ("download1g", "upload1g"):
        if (r := results.get(key)) is not None:
            gn, got = vs_nginx(r)
            rss = r.peak_rss.get("gateway")
            met = None if gn is None or rss is None else gn >= 0.8 and rss < 100 * MiB
            name = f"{_size(r.size)} {'upload' if r.scenario.kind == 'upload' else 'download'}"
            checks.append(Check(name, "gateway ≥ 0.8× nginx, peak RSS < 100 MiB", f"{got}; peak RSS {_mib(rss)}", met))
    return checks


def scenario_table(r: ScenarioResult) -> list[str]:
    s = r.scenario
    per_gib = r.size >= MiB  # CPU per GiB moved for large bodies, per request for small ones
    if s.transfer:
        how = "`curl -T` (PUT, Content-Length) into the sink" if s.kind == "upload" else "`curl -o /dev/null`"
        head = f"### {s.title} — {_size(r.size)}, one transfer at a time, {how}, {r.rounds} round(s)"
        cols = "| target | MiB/s | seconds | vs nginx | CPU s per GiB | peak RSS |"
    else:
        head = f"### {s.title} — `wrk -t1 -c{s.connections}`, {r.rounds} round(s)"
        cpu_col = "CPU s per GiB" if per_gib else "CPU per request"
        cols = f"| target | req/s | MiB/s | p50 | p99 | vs nginx | {cpu_col} | peak RSS |"
    lines = [head, "", cols, "|---" * (cols.count("|") - 1) + "|"]
    withouts = [t for t in PROXIES if t.startswith("without_") and r.of(t)]
    for target in [t for t in (*s.targets, "baseline", *r.spans, *withouts) if r.of(t)]:
        label = LABELS[target]
        if target == "direct":
            label += " — sink" if s.kind == "upload" else " — nginx static"
        ratio = _fmt(r.paired_ratio(target, "nginx"), ".3f" if r.size < MiB else ".2f", "×")
        rss = _mib(r.peak_rss.get(target)) if target in PROXIES else "–"
        cpu = r.cpu_per_unit(target)
        value = _fmt(r.median(target, "value"), ",.0f")
        if s.transfer:
            cpu_text = _fmt(None if cpu is None else cpu * GiB, ".2f")
            lines.append(
                f"| {label} | {value} | {_fmt(r.median(target, 'seconds'), '.2f')} | {ratio} | {cpu_text} | {rss} |"
            )
        else:
            cpu_text = (
                _fmt(None if cpu is None else cpu * GiB / r.size, ".2f")
                if per_gib
                else _fmt(None if cpu is None else cpu * 1e6, ".0f", " µs")
            )
            p50, p99 = _fmt(r.median(target, "p50_ms"), ".2f", " ms"), _fmt(r.median(target, "p99_ms"), ".2f", " ms")
            mib_s = _fmt(r.median(target, "mib_s"), ",.0f")
            lines.append(f"| {label} | {value} | {mib_s} | {p50} | {p99} | {ratio} | {cpu_text} | {rss} |")
    gm = r.paired_ratio("gateway", "minimal")
    cpu_g, cpu_m = r.cpu_per_unit("gateway"), r.cpu_per_unit("minimal")
    cpu_ratio = f"{cpu_g / cpu_m:.2f}×" if cpu_g and cpu_m else "–"
    lines += ["", f"Gateway vs minimal proxy: **{_fmt(gm, '.2f')}×** throughput, {cpu_ratio} the CPU per unit of work."]
    if r.of("baseline"):
        gb = r.paired_ratio("gateway", "baseline")
        cpu_b = r.cpu_per_unit("baseline")
        cpu_gb = f"{cpu_g / cpu_b:.2f}×" if cpu_g and cpu_b else "–"
        lines += ["", f"Gateway vs the baseline tree: **{_fmt(gb, '.2f')}×** throughput, {cpu_gb} the CPU per unit of "
                      "work (same round, same machine)."]
    for target in [t for t in r.spans if r.of(t)]:
        vs_gateway = r.paired_ratio(target, "gateway")
        cpu_t = r.cpu_per_unit(target)
        cpu_tg = f"{cpu_t / cpu_g:.2f}×" if cpu_t and cpu_g else "–"
        exported, dropped = r.spans[target]
        lines += ["", f"{LABELS[target]} vs gateway (export off): **{_fmt(vs_gateway, '.2f')}×** throughput, {cpu_tg} "
                      f"the CPU per unit of work; {exported:,.0f} spans exported, {dropped:,.0f} dropped."]
    for target in withouts:
        cpu_t = r.cpu_per_unit(target)
        cpu_tg = f"{cpu_g / cpu_t:.2f}×" if cpu_t and cpu_g else "–"
        lines += ["", f"Gateway against {LABELS[target]}: **{_fmt(r.paired_ratio('gateway', target), '.2f')}×** "
                      f"throughput, {cpu_tg} the CPU per unit of work."]
    if r.problems:
        lines += ["", "**Invalid measurements**: " + "; ".join(r.problems)]
    if r.notes:
        lines += ["", "Notes: " + "; ".join(r.notes)]
    return lines


def render(results: dict[str, ScenarioResult], args: argparse.Namespace, env: Env, info: dict[str, str]) -> str:
    lines = [
        f"# Gateway benchmark — {info['date']}{' (QUICK: indicative only)' if args.quick else ''}",
        "",
        f"Machine: {info['machine']}. Load average at start {info['load_start']}, at end {info['load_end']}.",
        f"Run: `{info['command']}` — {args.rounds} interleaved round(s) of wrk ({args.duration:g} s each),"
        f" {args.transfer_rounds} of the {_size(env.big_size)} transfers; wall time {info['wall']}.",
        f"Gateway: {info['gateway']}, commit {info['commit']}. Versions: {info['versions']}. Event loop of the"
        f" gateway and the minimal proxy: {info['loop']}.",
        "",
        '- Ratios ("vs nginx", "gateway vs minimal") are medians of per-round ratios, both sides measured in the',
        "  same round; throughputs and latencies are medians over rounds and are context only: the machine is",
        "  shared, and client, proxy and upstream share its 2 cores.",
        '- "nginx" is the reference: nginx proxy with default buffer sizes; "nginx, 64 KiB buffers" is shown for',
        "  large bodies as a stronger reference.",
        "- CPU is the target process's own user+system time during the measured runs (upstream and client excluded).",
        "- Peak RSS is VmHWM of a process started fresh for that scenario, over its warm-up and all its rounds.",
        "",
        "## Targets",
        "",
        "| scenario | target | result | verdict |",
        "|---|---|---|---|",
    ]
    for c in target_checks(results):
        verdict = "–" if c.met is None else ("met" if c.met else "**MISSED**")
        lines.append(f"| {c.name} | {c.wanted} | {c.got} | {verdict} |")
    for r in results.values():
        lines += ["", *scenario_table(r)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- main


def _ratios(text: str) -> tuple[float, ...]:
    try:
        ratios = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ratios like 1.0,0.1, got {text!r}") from None
    if not ratios or not all(0.0 <= r <= 1.0 for r in ratios) or len(set(ratios)) != len(ratios):
        raise argparse.ArgumentTypeError("ratios are distinct numbers from 0 to 1")
    return ratios


def _pieces(text: str) -> tuple[str, ...]:
    pieces = tuple(piece.strip() for piece in text.split(",") if piece.strip())
    unknown = [piece for piece in pieces if piece not in WITHOUT]
    if unknown or not pieces:
        raise argparse.ArgumentTypeError(f"pieces are {','.join(WITHOUT)}, not {text!r}")
    return pieces


def _tool(name: str, install: str = "nginx-light wrk curl") -> str:
    try:
        return _find_tool(name, install)
    except SystemExit as missing:
        raise BenchError(str(missing)) from None


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _first_line(argv: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=ROOT)
        return (done.stdout + done.stderr).strip().splitlines()[0]
    return "?"


def _versions(env: Env) -> str:
    first = _first_line
    aiohttp_v = first([env.python, "-c", "import aiohttp, sys; print(aiohttp.__version__, sys.version.split()[0])"])
    wrk = f" {first([env.wrk, '-v']).split(' Copyright')[0]}," if env.wrk else ""
    return f"{first([env.nginx, '-v']).replace('nginx version: ', '')},{wrk} aiohttp/Python {aiohttp_v}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark the gateway against nginx and a minimal aiohttp proxy.")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round of 3 s wrk runs, 3 of 64 MiB transfers (< 90 s)")
    parser.add_argument(
        "--scenarios", help=f"comma-separated, from {','.join(SCENARIOS)} (default all; with --instructions only 1k)"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds per scenario (default 3, quick 1)")
    parser.add_argument(
        "--transfer-rounds", type=int, help="interleaved rounds of the large transfers (default 5, quick 3)"
    )
    parser.add_argument("--duration", type=float, help="seconds per wrk run (default 10, quick 3)")
    parser.add_argument(
        "--big-size", type=int, help="bytes of the large download/upload file (default 1 GiB, quick 64 MiB)"
    )
    parser.add_argument("--port-base", type=int, default=18080, help="first of the ports used (default 18080)")
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help=f"Markdown report (default {RESULTS.relative_to(ROOT)})"
    )
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (configs, logs, access log)")
    parser.add_argument(
        "--baseline", type=Path,
        help="another checkout of the gateway (an earlier commit, with its C module built) measured beside this one",
    )
    parser.add_argument(
        "--trace-export", type=_ratios, default=(), metavar="RATIO[,RATIO...]",
        help="also the gateway with its span export on (tracing.export) at each sample ratio, e.g. 1.0,0.1",
    )
    parser.add_argument(
        "--without", type=_pieces, default=(), metavar="PIECE[,PIECE...]",
        help=f"also the gateway with one piece of its per-request work switched off, one target each, from "
             f"{','.join(WITHOUT)}: what each piece costs (with --instructions: a table of it)",
    )
    parser.add_argument(
        "--instructions", type=int, metavar="N",
        help="instead of wrk: user-space instructions per request of each Python proxy under callgrind, counted over"
             " exactly N requests of the 1k scenario (e.g. 2000)",
    )
    parser.add_argument(
        "--instructions-connections", type=int, metavar="C",
        help="--instructions: keep-alive connections sending the N requests, N/C each, sequentially (default 4)",
    )
    parser.add_argument(
        "--instructions-rounds", type=int, metavar="R",
        help="--instructions: interleaved rounds of the whole set of targets (default 1)",
    )
    args = parser.parse_args(argv)
    if args.instructions is None:
        if args.instructions_connections is not None or args.instructions_rounds is not None:
            parser.error("--instructions-connections and --instructions-rounds go with --instructions N")
        args.scenarios = args.scenarios or ",".join(SCENARIOS)
    else:
        wrk_only = [f"--{name.replace('_', '-')}" for name in ("quick", "rounds", "transfer_rounds", "duration",
                                                                "big_size") if getattr(args, name) not in (None, False)]
        if wrk_only:
            parser.error(f"{', '.join(wrk_only)}: not with --instructions (its rounds: --instructions-rounds R)")
        if args.scenarios is not None and [s.strip() for s in args.scenarios.split(",") if s.strip()] != ["1k"]:
            parser.error(f"--instructions measures the 1k scenario only, not {args.scenarios!r}: give --scenarios 1k"
                         " or leave --scenarios out")
        args.scenarios = "1k"
        if args.instructions_connections is None:
            args.instructions_connections = 4
        if args.instructions_rounds is None:
            args.instructions_rounds = 1
        if not (1 <= args.instructions_connections <= args.instructions) or args.instructions_rounds < 1:
            parser.error("--instructions N ≥ 1, --instructions-connections C from 1 to N, --instructions-rounds R"
                         " ≥ 1")
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown or not args.scenarios:
        parser.error(f"unknown scenario(s) {unknown}; choose from {','.join(SCENARIOS)}")
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.transfer_rounds = args.transfer_rounds or (3 if args.quick else 5)
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    args.big_size = args.big_size or (64 * MiB if args.quick else GiB)
    if args.transfer_rounds < 1 or args.rounds < 1 or args.duration < 1 or args.big_size < MiB:
        parser.error("--rounds and --transfer-rounds ≥ 1, --duration ≥ 1 and --big-size ≥ 1 MiB")
    return args


def _loop() -> str:
    """The gateway's event loop under ``server.event_loop: auto``, which the minimal proxy then runs on too."""
    probe = subprocess.run([_python(), "-c", "import uvloop"], capture_output=True)
    return "uvloop" if probe.returncode == 0 else "asyncio"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    # Set explicitly: a shell starts background jobs with SIGINT ignored, and Ctrl-C must always stop the run.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    status = 0
    try:
        with Stack() as stack:
            names: tuple[str, ...] = ("gateway", "direct", "minimal", "nginx", "sink", "admin", "nginx64k", "baseline",
                                      "baseline_admin")
            for target in (*export_targets(args.trace_export), *without_targets(args.without)):
                names += (target, f"{target}_admin")
            ports = dict(zip(names, pick_ports(args.port_base, len(names)), strict=True))
            counting = args.instructions is not None  # callgrind instead of wrk and curl
            if counting:
                _tool("callgrind_control", "valgrind")
            env = Env(
                tmp=tmp, python=_python(), nginx=_tool("nginx"), wrk="" if counting else _tool("wrk"),
                curl="" if counting else _tool("curl"), ports=ports, big_size=args.big_size, stack=stack,
                baseline=args.baseline.resolve() if args.baseline else None, loop=_loop(),
                export_ratios=args.trace_export, valgrind=_tool("valgrind", "valgrind") if counting else "",
                without=args.without,
            )  # fmt: skip
            info = {
                "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": f"{os.cpu_count()} CPUs ({_cpu_model()}), {platform.system()} {platform.release()}",
                "gateway": _first_line([env.python, "-m", "gateway", "--version"]),
                "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                "command": " ".join(["python bench/run.py", *(argv if argv is not None else sys.argv[1:])]),
                "versions": _versions(env),
                "commit": _commit(),
                "loop": env.loop,
            }
            if counting:
                info["valgrind"] = _first_line([env.valgrind, "--version"])
            if env.baseline is not None:
                info["commit"] += f"; baseline {_commit(env.baseline)} at {env.baseline}"
            log(f"temp dir {tmp}; ports {env.ports}")
            env.make_files()
            env.start_upstreams()
            results: dict[str, ScenarioResult] = {}
            counts: InstructionsResult | None = None
            if counting:
                log(f"{SCENARIOS['1k'].title} (1k), instructions under callgrind over {args.instructions} requests:")
                counts = run_instructions(env, args, log)
                if counts.problems:
                    status = 1
            else:
                for key in args.scenarios:
                    scenario = SCENARIOS[key]
                    log(f"{scenario.title} ({key}):")
                    rounds = args.transfer_rounds if scenario.transfer else args.rounds
                    results[key] = run_scenario(env, scenario, rounds, args.duration, log)
                    if results[key].problems:
                        status = 1
            info["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
            info["wall"] = f"{time.monotonic() - started:.0f}s"
            report = render(results, args, env, info) if counts is None else render_instructions(counts, info)
        print(report)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
        log(f"written to {args.output}")
    except BenchError as err:
        log(f"bench: {err}")
        status = 1
    except (Interrupted, KeyboardInterrupt) as err:
        log(f"bench: interrupted ({err or 'SIGINT'}); every process it started is stopped")
        status = 128 + getattr(err, "signum", signal.SIGINT)
    finally:
        if args.keep_tmp:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return status


def _commit(tree: Path = ROOT) -> str:
    """HEAD, and whether gateway/ differs from it (read-only: no index refresh)."""
    git = ["git", "--no-optional-locks", "-C", str(tree)]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode == 0:
            dirty = subprocess.run(
                [*git, "status", "--porcelain", "--", "gateway"], capture_output=True, text=True, timeout=10
            )
            return head.stdout.strip() + (" + uncommitted changes in gateway/" if dirty.stdout.strip() else "")
    return "unknown"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
