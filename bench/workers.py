"""Issue 24, item 4: the --workers supervisor against what an operator would otherwise run, on 127.0.0.1.

    .venv/bin/python bench/workers.py [--rounds 4] [--duration 8] [--kills 5] [--rest 20]

Five targets in front of the same nginx serving a 1 KB JSON file, all started at once, each on its own port:

- ``1 process``: ``gateway serve``, the reference;
- ``1 process, multiprocess metrics``: the same with ``PROMETHEUS_MULTIPROC_DIR`` set: a worker's metrics alone;
- ``--workers 2``: the supervisor and its two workers (prometheus-client's multiprocess mode, metrics summed);
- ``2 processes``: two ``gateway serve --reuse-port`` started independently on the same ports, as two replicas in
  one network namespace would be, or two units of a process manager (each its own metrics, in memory);
- ``2 processes, multiprocess metrics``: the same sharing one ``PROMETHEUS_MULTIPROC_DIR`` (summed metrics, as a
  process manager or gunicorn with prometheus-client's multiprocess mode would have them).

Every process runs in this script's session (see ``Procs``). Throughput: ``wrk -t1 -c50`` for ``--duration``
seconds per target, in ``--rounds`` interleaved rounds (the order rotates), with the CPU seconds of every process of
the target per request; ratios are medians of per-round ratios. At rest: the supervisor's memory (RSS and PSS) and
CPU over ``--rest`` seconds with no traffic, beside its workers'. Replacement: a worker of ``--workers 2`` killed
(SIGKILL) ``--kills`` times, the time until the supervisor has started another and until that one listens on the
port (the port's listening sockets in /proc/net/tcp), and how many requests of a client making one new connection
after another failed meanwhile. Every run is bounded in time; every process is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as harness  # noqa: E402 - the main harness's process and nginx helpers
from benchlib import cpu_seconds, proc_status, tool  # noqa: E402

TARGETS = ("1 process", "1 process, multiprocess metrics", "--workers 2", "2 processes",
           "2 processes, multiprocess metrics")


class Procs:
    """Every process started here, in this script's own session: with the kernel's autogroup scheduling (the default
    on desktop and server kernels alike), each session shares the CPU as one group, so a process started in a session
    of its own (bench/run.py's Proc does that) gets a whole share against wrk and nginx, and the supervisor's two
    workers, in one session, would get one share between them. Here every target, nginx and wrk compete as threads."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.out", "wb") as out, open(self.tmp / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=harness.ROOT)
        self.started.append(proc)
        return proc

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.started):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _config(tmp: Path, name: str, port: int, admin: int, upstream: int) -> Path:
    config = {
        "server": {"listen": f"{harness.HOST}:{port}", "admin_listen": f"{harness.HOST}:{admin}", "shutdown_timeout": 2},
        "access_log": {"enabled": True},
        "tenants": [{"name": "bench", "hosts": [harness.HOST], "upstream": f"http://{harness.HOST}:{upstream}"}],
        "global_chain": ["request_id"],
        "usage": {"ledger": {"url": f"sqlite:///{tmp}/{name}-usage.sqlite3"}},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return path


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _listeners(port: int) -> int:
    """Sockets listening on 127.0.0.1:``port`` (with SO_REUSEPORT, one per process)."""
    local = f"0100007F:{port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        count += fields[1] == local and fields[3] == "0A"
    return count


def _pss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _wait(check: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{proc.args!r} did not start (exit status {proc.poll()})")
        time.sleep(0.05)


def _ready(admin: int) -> bool:
    try:
        return harness.http(f"http://{harness.HOST}:{admin}/readyz", timeout=1)[0] == 200
    except OSError:
        return False


def throughput(args: argparse.Namespace, urls: dict[str, str], pids: dict[str, list[int]], wrk: str) -> None:
    rps: dict[str, list[float]] = {name: [] for name in TARGETS}
    cpu: dict[str, list[float]] = {name: [] for name in TARGETS}
    for rnd in range(args.rounds):
        order = TARGETS[rnd % len(TARGETS):] + TARGETS[: rnd % len(TARGETS)]
        for name in order:
            procs = pids[name] + [c for p in pids[name] for c in _children(p)]
            before = sum(cpu_seconds(p) for p in procs)
            out = subprocess.run([wrk, "-t1", "-c50", f"-d{int(args.duration)}s", urls[name]], capture_output=True,
                                 text=True, timeout=args.duration + 30)
            used = sum(cpu_seconds(p) for p in procs) - before
            result = harness.parse_wrk(out.stdout)
            if result["non2xx"] or result["socket_errors"]:
                raise SystemExit(f"{name}: errors in wrk's run:\n{out.stdout}")
            rps[name].append(result["rps"])
            cpu[name].append(used / result["requests"] * 1e6)
            print(f"round {rnd + 1}: {name}: {result['rps']:,.0f} req/s, {cpu[name][-1]:.0f} µs CPU per request",
                  file=sys.stderr, flush=True)
    print("\n| target | req/s (median) | vs 1 process | CPU per request (median) | vs 1 process |")
    print("|---|---:|---:|---:|---:|")
    for name in TARGETS:
        ratio = statistics.median(v / b for v, b in zip(rps[name], rps["1 process"], strict=True))
        cpu_ratio = statistics.median(v / b for v, b in zip(cpu[name], cpu["1 process"], strict=True))
        print(f"| {name} | {statistics.median(rps[name]):,.0f} | {ratio:.2f}x | {statistics.median(cpu[name]):.0f} µs "
              f"| {cpu_ratio:.2f}x |")
    both = statistics.median(v / b for v, b in zip(rps["--workers 2"], rps["2 processes"], strict=True))
    print(f"\n--workers 2 against 2 processes: {both:.2f}x req/s (median of per-round ratios)")


def at_rest(args: argparse.Namespace, supervisor: int) -> None:
    workers = _children(supervisor)
    time.sleep(2)
    before = {p: cpu_seconds(p) for p in [supervisor, *workers]}
    started = time.monotonic()
    time.sleep(args.rest)
    elapsed = time.monotonic() - started
    print("\n| process, at rest | RSS | PSS | CPU at rest |\n|---|---:|---:|---:|")
    for name, pid in [("supervisor", supervisor), *((f"worker {i + 1}", p) for i, p in enumerate(workers))]:
        used = cpu_seconds(pid) - before[pid]
        rss, pss = proc_status(pid, "VmRSS") or 0, _pss(pid) or 0
        print(f"| {name} | {rss / 2**20:.1f} MiB | {pss / 2**20:.1f} MiB | {used / elapsed * 100:.2f} % of a core "
              f"({used:.2f} s in {elapsed:.0f} s) |")


def replacement(args: argparse.Namespace, supervisor: int, port: int) -> None:
    failures = [0, 0]  # failed, made
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            failures[1] += 1
            try:
                with urllib.request.urlopen(f"http://{harness.HOST}:{port}/1k.json", timeout=5) as answer:
                    answer.read()
            except OSError:
                failures[0] += 1

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    started, listening = [], []
    try:
        for _ in range(args.kills):
            time.sleep(2.5)  # the supervisor starts at most one worker a second
            workers = _children(supervisor)
            assert len(workers) == 2 and _listeners(port) == 2, (workers, _listeners(port))
            killed = time.monotonic()
            os.kill(workers[0], signal.SIGKILL)
            deadline = killed + 30
            while not set(_children(supervisor)) - set(workers) and time.monotonic() < deadline:
                time.sleep(0.002)  # the supervisor has not started the replacement yet
            started.append(time.monotonic() - killed)
            while _listeners(port) < 2 and time.monotonic() < deadline:
                time.sleep(0.002)  # the replacement has not opened its listener yet
            listening.append(time.monotonic() - killed)
    finally:
        stop.set()
        thread.join(10)
    print(f"\nA worker of --workers 2 killed (SIGKILL), {args.kills} times: the supervisor started another after "
          f"{statistics.median(started):.2f} s (median; {min(started):.2f} to {max(started):.2f} s), which listened on "
          f"the port after {statistics.median(listening):.2f} s ({min(listening):.2f} to {max(listening):.2f} s); a "
          f"client making one request per new connection meanwhile: {failures[0]} of {failures[1]} requests failed.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=8)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--rest", type=float, default=20)
    args = parser.parse_args()
    nginx, wrk = tool("nginx"), tool("wrk")
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="gw-workers-bench-") as name, Procs(Path(name)) as procs:
        tmp = Path(name)
        (tmp / "www").mkdir()
        (tmp / "www" / "1k.json").write_bytes(b'{"pad":"' + b"x" * 1012 + b'"}')
        ports = harness.pick_ports(18780, 1 + 2 * len(TARGETS))
        body = harness.NGINX_STATIC.format(host=harness.HOST, port=ports[0], docroot=tmp / "www")
        upstream = procs.start("upstream", [nginx, "-p", str(tmp), "-c", str(harness.nginx_conf(tmp, "upstream", body))])
        _wait(lambda: _listeners(ports[0]) == 1, upstream)
        serve = [sys.executable, "-m", "gateway", "serve", "--log-level", "warning", "--config"]
        urls, pids, ports_of = {}, {}, {}
        for i, target in enumerate(TARGETS):
            port, admin = ports[1 + 2 * i], ports[2 + 2 * i]
            config = str(_config(tmp, f"t{i}", port, admin, ports[0]))
            if target.startswith("2 processes"):
                argvs = [[*serve, config, "--reuse-port"], [*serve, config, "--reuse-port"]]
            else:
                argvs = [[*serve, config, *(["--workers", "2"] if target == "--workers 2" else [])]]
            env = None
            if target.endswith("multiprocess metrics"):
                env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp / f"metrics-{i}")}
                os.mkdir(env["PROMETHEUS_MULTIPROC_DIR"])
            started = [procs.start(f"t{i}-{n}", argv, env) for n, argv in enumerate(argvs)]
            want = 1 if target.startswith("1 process") else 2
            for proc in started:
                _wait(lambda: _listeners(port) >= want and _ready(admin), proc)
            urls[target] = f"http://{harness.HOST}:{port}/1k.json"
            pids[target] = [p.pid for p in started]
            ports_of[target] = port
        supervisor = pids["--workers 2"][0]
        at_rest(args, supervisor)
        throughput(args, urls, pids, wrk)
        replacement(args, supervisor, ports_of["--workers 2"])
    print(f"load average at end: {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
