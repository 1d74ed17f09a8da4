"""Benchmark of board_cards: two ~10 MB boards of 5,000 cards through the gateway in each phase, in one run.

    .venv/bin/python bench/board_cards.py [--duration 5] [--rounds 5] [--pin] [--baseline DIR] [--json FILE]
    .venv/bin/python bench/board_cards.py --instructions 12 [--baseline DIR]   # callgrind, user-space instructions
    .venv/bin/python bench/board_cards.py --latency [--pin] [--rate R] [--baseline DIR]   # 1 KB p99 under boards
    .venv/bin/python bench/board_cards.py --scan [--baseline DIR]              # the scan alone, in-process

Every run has two boards: the bench's own (``board_bytes``: long descriptions that are mostly one run of text) and
a board of realistic cards (``realistic_board_bytes``, seeded: several sentences with quotes, backslashes, tabs,
newlines and non-ASCII text, members, tags, files, custom properties, checklists). The upstream is nginx (one
worker, ``sendfile on``, each board served from a file with its ETag, and a 1 KB JSON document at ``/small``), so it
costs little CPU and the gateway is the bottleneck (``--upstream python``: the aiohttp upstream of earlier runs).
Then one gateway per row (access log on, its own usage ledger), each with its clock fixed by GATEWAY_NOW, driven on
each board with ``wrk -c4 -t2``:

- ``pass-through``: the board route with no policy (the baseline the ratios are against);
- ``full``: board_cards before the cap date (bytes untouched, headers added);
- ``capped`` and ``removed``: the two rewriting phases, with the memo of identical bodies (the default);
- ``capped, cold`` and ``removed, cold``: the same with ``memo_bytes: 0``, so every request scans the body (a board
  never seen before, every time).

Rows and boards take turns for ``--rounds`` rounds, so a change in the machine's load during the run falls on every
row alike. For each row and board: requests per second and the gateway process's CPU time per board
(``/proc/PID/stat``), and both as ratios to the same board's pass-through in the same round, each as the median and
the least and greatest of the rounds. ``--pin``: the gateways on the first CPU, nginx and wrk on the second. It also
times the rewrite itself in-process (scan + splice, the memo hit, and the longest the event loop is held by one piece
of the body).

``--baseline DIR``: another checkout of the gateway (an earlier commit, its C module built), measured in the same
rounds; its rows are compared with its own pass-through.

``--instructions N``: instead of wrk, each of pass-through, capped cold and removed cold (and the baseline's) is run
under valgrind's callgrind for N sequential requests after a warm-up, and the user-space instructions per request are
reported: a count the other work on the machine does not move (system calls and the kernel's copies are not in it).

``--latency``: 1 KB requests (``wrk -t1 -c50`` on ``/small``, as bench/run.py's 1 KB scenario) against a gateway
whose board route rewrites cold, first alone ("idle") then while a client reads ``--board-rate`` boards a second
from it, rounds interleaved; the ratio of the p99 under board load to the idle p99, for each rewriting phase, for
pass-through boards at the same rate, for the baseline, and for a control: the same boards read from the upstream
itself, beside the gateway (what the load does to the 1 KB requests without the gateway carrying a board). The
upstream is nginx here (the Python upstream of the other modes took as much CPU as the boards it served).
``--pin`` puts the gateways on the first CPU and the upstream, wrk and the board client on the second; ``--rate R``
paces the 1 KB requests to about R a second (wrk's ``delay`` hook), below what the gateway can take, so the p99 is
the wait behind the boards rather than a saturated queue. A second table gives the same requests' p99 timed inside
the gateway (its access log's ``duration``), without the client's and the kernel's queues.

``--scan``: the scan alone, in-process CPU time (with ``--instructions 1``: and instructions under callgrind), on
the board written three ways (compact, indented by 2, every
non-ASCII character as a \\uXXXX escape): the native path, the exact path (as without the C module) and the baseline.

The machine's load (``/proc/loadavg``) is printed at the start and the end, and written with the results.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import cpu_seconds, family_cpu_seconds, free_port, percentile, stop_all, tool, wait_port

from gateway.policies.board_cards import json_splice  # noqa: E402
from tests.board_fixtures import board_bytes, realistic_board_bytes  # noqa: E402

PYTHON = sys.executable
# --pin: the gateways on the first CPU, the load (the upstream, wrk, this process's board client) on the second.
GATEWAY_CPU = "0"
LOAD_CPUS = "1"
INSTANTS = {"full": "2026-09-15T00:00:00Z", "capped": "2026-10-15T00:00:00Z", "removed": "2026-11-15T00:00:00Z"}
# The two boards of every run: the bench's own (5,000 cards whose long descriptions are mostly one run of text) and a
# board of realistic cards (tests/board_fixtures.py: several sentences with quotes, backslashes, tabs, newlines and
# non-ASCII text, members, tags, files, custom properties and checklists: many short strings and nested arrays).
BOARDS = ("own", "realistic")
BOARD_IDS = {"own": "1", "realistic": "2"}


def board_path(board: str) -> str:
    return f"/api/latest/boards/{BOARD_IDS[board]}"


def make_boards(cards: int, padding: int, seed: int) -> dict[str, bytes]:
    return {"own": board_bytes(cards, padding=padding), "realistic": realistic_board_bytes(cards, seed=seed)}


def spread(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values``, and their least and greatest."""
    return statistics.median(values), min(values), max(values)


def fmt_spread(values: list[float], digits: int = 2, unit: str = "", suffix: str = "") -> str:
    """``median (min–max)`` of ``values``."""
    mid, low, high = spread(values)
    return f"{mid:.{digits}f}{suffix}{unit} ({low:.{digits}f}–{high:.{digits}f})"

UPSTREAM = r'''
import sys
from aiohttp import web
boards = {name: open(path, "rb").read() for name, path in zip(("1", "2"), sys.argv[2:4])}
small = (b'{"id":1,"title":"' + b"x" * 1000)[:1022] + b'"}'
async def board(request):
    body = boards.get(request.path.rpartition("/")[2], boards["1"])
    if request.headers.get("If-None-Match") == '"board-v1"':
        return web.Response(status=304, headers={"ETag": '"board-v1"'})
    return web.Response(body=body, content_type="application/json", headers={"ETag": '"board-v1"'})
async def one_kb(request):
    return web.Response(body=small, content_type="application/json")
app = web.Application()
app.router.add_get("/small", one_kb)
app.router.add_get("/{tail:.*}", board)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
'''


NGINX_UPSTREAM = """\
worker_processes 1;
master_process off;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-tmp;
    keepalive_requests 1000000;
    sendfile on;
    types {{ application/json json; }}
    default_type application/json;
    server {{
        listen 127.0.0.1:{port};
        root {work}/www;
        location = /small {{ try_files /small.json =404; }}
        location ~ /boards/2$ {{ try_files /board-2.json =404; }}
        location / {{ try_files /board-1.json =404; }}
    }}
}}
"""

def start_nginx_upstream(work: Path, port: int, bodies: dict[str, bytes], pin: list[str]) -> subprocess.Popen[bytes]:
    """The upstream: nginx (one worker, ``sendfile on``) serving each board from a file (``/boards/1``: the bench's
    own, ``/boards/2``: the realistic one), with its ETag, and the 1 KB document, so that it takes little of the
    machine's CPU while it serves 100 MB of boards a second and the gateway is the bottleneck."""
    www = work / "www"
    www.mkdir(mode=0o755, exist_ok=True)
    for name, body in bodies.items():
        (www / f"board-{BOARD_IDS[name]}.json").write_bytes(body)
    (www / "small.json").write_bytes((b'{"id":1,"title":"' + b"x" * 1000)[:1022] + b'"}')
    conf = work / "nginx.conf"
    conf.write_text(NGINX_UPSTREAM.format(work=work, port=port))
    nginx = tool("nginx")
    return subprocess.Popen([*pin, nginx, "-p", str(work), "-c", str(conf)], stderr=subprocess.DEVNULL)


def start_python_upstream(work: Path, port: int, bodies: dict[str, bytes], pin: list[str]) -> subprocess.Popen[bytes]:
    """``--upstream python``: the aiohttp upstream of the earlier runs (it takes about as much CPU as the boards it
    serves, so the gateway shares the machine with it)."""
    (work / "upstream.py").write_text(UPSTREAM)
    paths = []
    for name in BOARDS:
        paths.append(work / f"board-{BOARD_IDS[name]}.json")
        paths[-1].write_bytes(bodies[name])
    return subprocess.Popen([*pin, PYTHON, str(work / "upstream.py"), str(port), *map(str, paths)])


def gateway_config(upstream_port: int, port: int, options: dict[str, Any] | None, *, production: bool = False,
                   ledger: Path | None = None) -> str:
    """The board route with board_cards (``options``; None: no policy). ``production``: the access log and the
    request_id chain on, as bench/run.py's gateway. ``ledger``: the usage ledger's SQLite file (not the default, in
    the working directory: the repository's)."""
    route: dict[str, Any] = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"]}
    if options is not None:
        route["chain"] = [{"board_cards": options}]
    config: dict[str, Any] = {
        "server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{free_port()}"},
        "access_log": {"enabled": production},
        "tenants": [{"name": "bench", "hosts": ["127.0.0.1"], "upstream": f"http://127.0.0.1:{upstream_port}"}],
        "routes": [route],
    }
    if ledger is not None:
        config["usage"] = {"ledger": {"url": f"sqlite:///{ledger}"}}
    if production:
        config["global_chain"] = ["request_id"]
    return json.dumps(config)  # JSON is YAML


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def start_gateway(work: Path, tree: Path, upstream_port: int, phase: str | None, options: dict[str, Any] | None,
                  *, production: bool = False, prefix: list[str] | None = None, cpus: str | None = None,
                  log: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``log``: where the gateway's stdout (its access log, with ``production``) goes; nowhere without it."""
    port = free_port()
    config = work / f"gateway-{port}.yaml"
    config.write_text(gateway_config(upstream_port, port, options, production=production,
                                     ledger=work / f"usage-{port}.sqlite3"))
    env = {**os.environ, "GATEWAY_NOW": INSTANTS[phase or "full"], "PYTHONPATH": str(tree)}
    if cpus is not None:
        prefix = ["taskset", "-c", cpus, *(prefix or [])]
    with log.open("ab") if log is not None else open(os.devnull, "wb") as stdout:
        proc = subprocess.Popen([*(prefix or []), PYTHON, "-m", "gateway", "serve", "--config", str(config),
                                 "--log-level", "warning"], cwd=tree, env=env, stdout=stdout,
                                stderr=subprocess.DEVNULL if prefix else None)
    wait_port(port, timeout=180 if prefix else 15, proc=proc)
    return proc, port


def fetch(port: int, path: str = "/api/latest/boards/1", conn: http.client.HTTPConnection | None = None) -> int:
    """One GET read to its end; the body's size (RuntimeError unless 200)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: status {response.status}")
        return len(data)
    finally:
        if own:
            conn.close()


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    stop_all(procs)


def wrk(url: str, duration: int, connections: int = 4, threads: int = 2, rate: float | None = None,
        cpus: str | None = None) -> dict[str, float]:
    """wrk's figures; ``rate``: each connection waits connections/rate seconds before each of its requests (wrk's
    ``delay`` hook), so the load stays near ``rate`` a second instead of as many as the target can take; ``cpus``:
    wrk pinned to them (taskset)."""
    argv = ["wrk", f"-c{connections}", f"-t{threads}", f"-d{duration}s", "--timeout", "10s", "--latency", url]
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-board-cards-pace-") as script:
        if rate is not None:
            script.write(f"function delay()\n  return {connections * 1000.0 / rate:.3f}\nend\n")
            script.flush()
            argv[-1:-1] = ["-s", script.name]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=duration + 60).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    mean = _ms(re.search(r"Latency\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    return {"requests": requests, "rps": rps, "mean_ms": mean, "p99_ms": p99}


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def time_rewrite(body: bytes, repeat: int = 5) -> dict[str, float]:
    """In-process CPU time of the rewrite itself, best of ``repeat``, in milliseconds."""

    def best(fn: Any, times: int = repeat) -> float:
        runs = []
        for _ in range(times):
            start = time.process_time()
            fn()
            runs.append(time.process_time() - start)
        return min(runs) * 1000

    extra = ("cards_deprecation_message", b'"moved"')
    layout = json_splice.scan(body, "cards", keep=100, extra_key=extra[0])
    copy = bytes(bytearray(body))
    # The pieces the gateway reads: about uvloop's reads (the HTTP parser hands them over as they are).
    pieces = [body[i : i + PIECE] for i in range(0, len(body), PIECE)]

    def read_in_pieces() -> None:
        reader = json_splice.Reader("cards", keep=100, extra_key=extra[0])
        for piece in pieces:
            reader.feed(piece)
        reader.layout()

    def longest_piece() -> float:
        """The longest one piece's read holds the event loop (wall time, best of ``repeat`` bodies)."""
        longest = []
        for _ in range(repeat):
            reader = json_splice.Reader("cards", keep=100, extra_key=extra[0])
            worst = 0.0
            for piece in pieces:
                start = time.perf_counter()
                reader.feed(piece)
                worst = max(worst, time.perf_counter() - start)
            start = time.perf_counter()
            reader.layout()
            longest.append(max(worst, time.perf_counter() - start))
        return min(longest) * 1000

    scanner = json_splice._Scanner
    json_splice._Scanner = None  # the scan by the exact path alone (as without the C module), for comparison
    try:
        scan_without_native = best(lambda: json_splice.scan(body, "cards", keep=100, extra_key=extra[0]), 3)
    finally:
        json_splice._Scanner = scanner
    return {
        "scan_ms": best(lambda: json_splice.scan(body, "cards", keep=100, extra_key=extra[0])),
        "scan_in_pieces_ms": best(read_in_pieces),
        "longest_hold_ms": longest_piece(),
        "scan_without_native_ms": scan_without_native,
        "join_ms": best(lambda: b"".join(pieces)),
        "cap_splice_ms": best(lambda: json_splice.truncate(body, layout, 100, extra)),
        "drop_splice_ms": best(lambda: json_splice.drop(body, layout, extra)),
        "memo_hit_ms": best(lambda: copy == body),
    }


PIECE = 256 * 1024

BASELINE_HOLD = r'''
import sys, time
from gateway.policies.board_cards import json_splice
body = open(sys.argv[1], "rb").read()
pieces = [body[i : i + 256_000] for i in range(0, len(body), 256_000)]
extra = ("cards_deprecation_message", b'"moved"')
runs = []
for _ in range(5):
    start = time.perf_counter()
    joined = b"".join(pieces)  # Reply.read, after the last piece
    layout = json_splice.scan(joined, "cards", keep=100, extra_key=extra[0])
    json_splice.truncate(joined, layout, 100, extra)
    runs.append(time.perf_counter() - start)
print(min(runs) * 1000)
'''


def baseline_hold(tree: Path, body: bytes) -> float:
    """How long the baseline holds the event loop per cold capped board, in ms (best of 5): it joins the body after
    the last piece, scans and splices it, all in one turn of the loop."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "board.json").write_bytes(body)
        out = subprocess.run([PYTHON, "-c", BASELINE_HOLD, str(Path(tmp) / "board.json")], cwd=tree, check=True,
                             env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    return float(out.stdout.strip())


SCAN_TIMES = r'''
import json, sys, time
from gateway.policies.board_cards import json_splice
body = open(sys.argv[1], "rb").read()
runs = []
for _ in range(int(sys.argv[2])):
    start = time.process_time()
    json_splice.scan(body, "cards", keep=100, extra_key="cards_deprecation_message")
    runs.append(time.process_time() - start)
print(json.dumps(runs))
'''


def scan_bodies(cards: int, padding: int, seed: int) -> dict[str, bytes]:
    """The bench's own board three ways (compact, indented by 2, with every non-ASCII character escaped), and the
    realistic board."""
    from tests.board_fixtures import board_dict

    board = board_dict(cards, padding=padding)
    return {
        "compact": board_bytes(cards, padding=padding),
        "indented by 2": json.dumps(board, ensure_ascii=False, indent=2).encode(),
        "\\uXXXX escapes for all non-ASCII text": json.dumps(board, separators=(",", ":")).encode(),
        "realistic cards": realistic_board_bytes(cards, seed=seed),
    }


def scan_instructions(tree: Path, path: Path, tmp: str) -> float:
    """Instructions of one scan under callgrind: a process making 3 scans less one making 1, halved (start-up,
    imports and reading the file cancel out)."""
    counts = []
    for runs in (1, 3):
        out = Path(tmp) / f"scan-{runs}.callgrind"
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", PYTHON, "-c", SCAN_TIMES,
                               str(path), str(runs)], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                              capture_output=True, text=True, check=True)
        total = re.search(r"Collected : (\d+)", done.stderr)
        if total is None:
            raise RuntimeError("no instruction count from callgrind")
        counts.append(int(total.group(1)))
    return (counts[1] - counts[0]) / 2


def scan_table(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """In-process CPU time of one unseen board's scan, each tree reading the same bytes in its own processes, the trees
    taking turns (5 turns of 5 runs; the exact path 3 of 1): the median over all runs."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, body in scan_bodies(args.cards, args.padding, args.seed).items():
            path = Path(tmp) / "board.json"
            path.write_bytes(body)

            def timed(tree: Path, runs: int, exact: bool = False) -> list[float]:
                code = SCAN_TIMES
                if exact:
                    code = code.replace("from gateway.policies.board_cards import json_splice",
                                        "from gateway.policies.board_cards import json_splice\n"
                                        "json_splice._Scanner = None")
                done = subprocess.run([PYTHON, "-c", code, str(path), str(runs)], cwd=tree, check=True, text=True,
                                      env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True)
                return [t * 1000 for t in json.loads(done.stdout)]

            native: list[float] = []
            baseline: list[float] = []
            exact: list[float] = []
            for turn in range(5):
                native += timed(ROOT, 5)
                if args.baseline is not None:
                    baseline += timed(args.baseline.resolve(), 5)
                if turn < 3:
                    exact += timed(ROOT, 1, exact=True)
            row = {"bytes": len(body), "native_ms": statistics.median(native), "exact_ms": statistics.median(exact)}
            if baseline:
                row["baseline_ms"] = statistics.median(baseline)
            if args.instructions:
                row["native_instructions"] = scan_instructions(ROOT, path, tmp)
                if args.baseline is not None:
                    row["baseline_instructions"] = scan_instructions(args.baseline.resolve(), path, tmp)
            out[label] = row
            print(f"  {label}: {row}", flush=True)
    results["scan"] = out
    if args.instructions:
        print()
        print("| body | instructions per scan | baseline's | this vs baseline |")
        print("|---|---:|---:|---:|")
        for label, row in out.items():
            base = row.get("baseline_instructions")
            print(f"| {label} | {row['native_instructions'] / 1e6:.1f} M | "
                  + (f"{base / 1e6:.1f} M | {row['native_instructions'] / base:.2f}x |" if base else " | |"))
    print()
    print("| body | native scan | exact path (no C module) | |" + (" baseline's native scan | this vs baseline |"
                                                                  if args.baseline else ""))
    print("|---|---:|---:|---:|" + ("---:|---:|" if args.baseline else ""))
    for label, row in out.items():
        line = (f"| {label}, {row['bytes'] / 1e6:.1f} MB | {row['native_ms']:.2f} ms | {row['exact_ms']:.1f} ms | "
                f"{row['exact_ms'] / row['native_ms']:.0f}x |")
        if args.baseline is not None:
            line += f" {row['baseline_ms']:.2f} ms | {row['native_ms'] / row['baseline_ms']:.2f}x |"
        print(line)


ROWS: list[tuple[str, str | None, dict[str, Any] | None]] = [
    ("pass-through", None, None),
    ("full", "full", {}),
    ("capped", "capped", {}),
    ("removed", "removed", {}),
    ("capped, cold", "capped", {"memo_bytes": 0}),
    ("removed, cold", "removed", {"memo_bytes": 0}),
]


def trees(args: argparse.Namespace) -> list[tuple[str, Path]]:
    out = [("", ROOT)]
    if args.baseline is not None:
        out.append((" [baseline]", args.baseline.resolve()))
    return out


def throughput(args: argparse.Namespace, work: Path, upstream_port: int, results: dict[str, Any],
               upstream: subprocess.Popen[bytes]) -> None:
    """Every row on both boards, ``wrk -c4 -t2`` for ``--duration`` seconds each, rows and boards taking turns for
    ``--rounds`` rounds. Per row, board and round: requests per second, the gateway process's CPU per board and the
    upstream's (its processes'); the ratios to the same tree's pass-through of the same board in the same round. On
    loopback the kernel sends the upstream's queued data in the context of the reader that opens its window, so work
    moves between the two processes' accounts: their sum shows a change that only moved it."""
    rows = [(name + suffix, phase, options, tree) for suffix, tree in trees(args) for name, phase, options in ROWS]
    samples: dict[tuple[str, str], list[dict[str, float]]] = {
        (name, board): [] for name, *_ in rows for board in BOARDS}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gateways: dict[str, subprocess.Popen[bytes]] = {}
        ports: dict[str, int] = {}
        for name, phase, options, tree in rows:
            proc, port = start_gateway(work, tree, upstream_port, phase, options, production=True,
                                       cpus=GATEWAY_CPU if args.pin else None)
            procs.append(proc)
            for board in BOARDS:
                subprocess.run(["wrk", "-c1", "-t1", "-d1s", f"http://127.0.0.1:{port}{board_path(board)}"],
                               capture_output=True, check=True)  # warm up
            gateways[name], ports[name] = proc, port
        # Rows take turns, round after round (each round starting one row further on), each row running both boards
        # back to back, so that a change in the machine's load falls on every row alike and a ratio to pass-through
        # compares runs minutes apart at most.
        for round_no in range(args.rounds):
            order = list(gateways)
            order = order[round_no % len(order):] + order[: round_no % len(order)]
            boards = BOARDS if round_no % 2 == 0 else BOARDS[::-1]
            for name in order:
                proc = gateways[name]
                for board in boards:
                    before, upstream_before = cpu_seconds(proc.pid), family_cpu_seconds(upstream.pid)
                    sample = wrk(f"http://127.0.0.1:{ports[name]}{board_path(board)}", args.duration,
                                 cpus=LOAD_CPUS if args.pin else None)
                    sample["cpu_ms"] = (cpu_seconds(proc.pid) - before) * 1000
                    sample["cpu_ms_per_board"] = sample["cpu_ms"] / max(sample["requests"], 1)
                    upstream_ms = (family_cpu_seconds(upstream.pid) - upstream_before) * 1000
                    sample["upstream_cpu_ms_per_board"] = upstream_ms / max(sample["requests"], 1)
                    samples[(name, board)].append(sample)
            print(f"  round {round_no + 1}/{args.rounds} (load {loadavg()}): " + ", ".join(
                f"{name}/{board} {samples[(name, board)][-1]['rps']:.1f}/s "
                f"{samples[(name, board)][-1]['cpu_ms_per_board']:.2f} ms" for name in gateways for board in BOARDS),
                flush=True)
    finally:
        stop(procs)
    out = throughput_rows(samples)
    results["rows"] = {f"{name} / {board}": row for (name, board), row in out.items()}
    print()
    pinned = (f"; the gateways on CPU {GATEWAY_CPU}, nginx and wrk on CPU {LOAD_CPUS}" if args.pin else "")
    print(f"wrk -c4 -t2, {args.rounds} rounds x {args.duration} s; median (least–greatest) of the rounds{pinned}:")
    print("| row | board | req/s | vs pass-through | gateway CPU per board | CPU vs pass-through | upstream CPU per "
          "board | gateway + upstream |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, board), row in out.items():
        print(f"| {name} | {board} | {fmt_spread(row['rps_rounds'], 1)} | "
              f"{fmt_spread(row['vs_pass_through_rounds'], 2, suffix='x')} | "
              f"{fmt_spread(row['cpu_ms_rounds'], 2, ' ms')} | "
              f"{fmt_spread(row['cpu_vs_pass_through_rounds'], 2, suffix='x')} | "
              f"{fmt_spread(row['upstream_cpu_ms_rounds'], 2, ' ms')} | "
              f"{fmt_spread(row['both_cpu_ms_rounds'], 2, ' ms')} |")
    if args.baseline is not None:
        print()
        print("| row | board | this tree vs baseline: req/s | gateway CPU per board | gateway + upstream CPU |")
        print("|---|---|---:|---:|---:|")
        for name, _, _ in ROWS:
            for board in BOARDS:
                mine, theirs = samples[(name, board)], samples[(name + " [baseline]", board)]
                rps = [a["rps"] / b["rps"] for a, b in zip(mine, theirs, strict=True)]
                cpu = [a["cpu_ms_per_board"] / b["cpu_ms_per_board"] for a, b in zip(mine, theirs, strict=True)]
                both = [_both(a) / _both(b) for a, b in zip(mine, theirs, strict=True)]
                print(f"| {name} | {board} | {fmt_spread(rps, 2, suffix='x')} | {fmt_spread(cpu, 2, suffix='x')} | "
                      f"{fmt_spread(both, 2, suffix='x')} |")


def _both(sample: dict[str, float]) -> float:
    """The gateway's and the upstream's CPU per board."""
    return sample["cpu_ms_per_board"] + sample["upstream_cpu_ms_per_board"]


def throughput_rows(samples: dict[tuple[str, str], list[dict[str, float]]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per row and board: the per-round figures and their ratios to the same tree's pass-through of the same board in
    the same round (steadier on a shared machine than a ratio of medians), with their medians."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (name, board), runs in samples.items():
        suffix = " [baseline]" if name.endswith(" [baseline]") else ""
        base = samples[("pass-through" + suffix, board)]
        row: dict[str, Any] = {
            "rps_rounds": [r["rps"] for r in runs],
            "cpu_ms_rounds": [r["cpu_ms_per_board"] for r in runs],
            "upstream_cpu_ms_rounds": [r["upstream_cpu_ms_per_board"] for r in runs],
            "both_cpu_ms_rounds": [_both(r) for r in runs],
            "p99_ms_rounds": [r["p99_ms"] for r in runs],
            "vs_pass_through_rounds": [r["rps"] / b["rps"] for r, b in zip(runs, base, strict=True)],
            "cpu_vs_pass_through_rounds": [r["cpu_ms_per_board"] / b["cpu_ms_per_board"] for r, b in zip(runs, base, strict=True)],
            "requests": sum(int(r["requests"]) for r in runs),
        }
        for key in ("rps", "cpu_ms", "vs_pass_through", "cpu_vs_pass_through", "upstream_cpu_ms", "both_cpu_ms"):
            row[key] = statistics.median(row[f"{key}_rounds"])
        out[(name, board)] = row
    return out


def instructions(args: argparse.Namespace, work: Path, upstream_port: int, results: dict[str, Any]) -> None:
    """User-space instructions per request under callgrind (valgrind), for the rows that matter to the rewrite, on
    both boards (one gateway process each)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts: dict[tuple[str, str], float] = {}
    for suffix, tree in trees(args):
        for name, phase, options in (ROWS[0], ROWS[4], ROWS[5]):
            for board in BOARDS:
                counts[(name + suffix, board)] = count_instructions(args, work, tree, upstream_port, phase, options,
                                                                    board)
                print(f"  {name + suffix} / {board}: {counts[(name + suffix, board)] / 1e6:.1f} M instructions per "
                      "request", flush=True)
    results["instructions_per_request"] = {f"{name} / {board}": count for (name, board), count in counts.items()}
    print()
    print("| row | board | user-space instructions per request (callgrind) | vs pass-through |" +
          (" vs baseline |" if args.baseline else ""))
    print("|---|---|---:|---:|" + ("---:|" if args.baseline else ""))
    for (name, board), count in counts.items():
        suffix = " [baseline]" if name.endswith(" [baseline]") else ""
        line = f"| {name} | {board} | {count / 1e6:.1f} M | {count / counts[('pass-through' + suffix, board)]:.2f}x |"
        if args.baseline:
            line += f" {count / counts[(name + ' [baseline]', board)]:.2f}x |" if not suffix else " |"
        print(line)


def count_instructions(args: argparse.Namespace, work: Path, tree: Path, upstream_port: int, phase: str | None,
                       options: dict[str, Any] | None, board: str) -> float:
    """One gateway under callgrind: 3 requests for ``board`` to warm up, then ``--instructions`` counted."""
    out = work / f"callgrind-{free_port()}.out"
    prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    proc, port = start_gateway(work, tree, upstream_port, phase, options, prefix=prefix)
    try:
        for _ in range(3):
            fetch(port, board_path(board))  # warm up: imports, first-request paths, the allocator's arenas
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True, check=True)
        for _ in range(args.instructions):
            fetch(port, board_path(board))
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], capture_output=True, check=True)
    finally:
        stop([proc])
    text = out.read_text(errors="replace")
    total = re.search(r"^totals:\s*(\d+)", text, re.MULTILINE)  # ("summary:" counts from the start only)
    if total is None:
        raise RuntimeError(f"no instruction count in {out}")
    return int(total.group(1)) / int(args.instructions)


class BoardLoad:
    """A client reading ``rate`` boards a second from the gateway (one at a time, paced), in a thread."""

    def __init__(self, port: int, rate: float, path: str = "/api/latest/boards/1") -> None:
        self.port = port
        self.path = path
        self.period = 1.0 / rate
        self.done = 0
        self.failed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                fetch(self.port, self.path, conn=conn)
                self.done += 1
                next_at += self.period
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except Exception as err:  # reported by the caller
            self.failed = repr(err)
        finally:
            conn.close()

    def __enter__(self) -> BoardLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


CONTROL = "control: boards read from the upstream, beside the gateway"
SINK = "floor: boards read from the upstream on the gateway's CPU, by a sink"
SPLIT = "capped, cold, in a second gateway process on the same CPU"

# The sink of the floor row: reads boards from the upstream at a pace, into one buffer (the least a reader of the
# bytes can do), until stdin closes; prints how many it read, or the error.
SINK_SCRIPT = r'''
import http.client, sys, threading, time
port, rate, path = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
buf = memoryview(bytearray(1 << 20))
done, next_at = 0, time.monotonic()
try:
    while not stop.is_set():
        conn.request("GET", path)
        resp = conn.getresponse()
        while resp.readinto(buf):
            pass
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}")
        done += 1
        next_at += 1.0 / rate
        stop.wait(max(0.0, next_at - time.monotonic()))
    print(done)
except Exception as err:
    print(repr(err))
'''


class SinkLoad:
    """``BoardLoad``'s interface, the boards read by a sink process pinned to ``cpus``: what receiving the boards'
    bytes costs the CPU it runs on, without anything done with them."""

    def __init__(self, port: int, rate: float, cpus: str, path: str = "/api/latest/boards/1") -> None:
        self.argv = ["taskset", "-c", cpus, PYTHON, "-c", SINK_SCRIPT, str(port), str(rate), path]
        self.done = 0
        self.failed: str | None = None
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> SinkLoad:
        self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate("", timeout=120)
        out = out.strip()
        if out.isdigit():
            self.done = int(out)
        else:
            self.failed = out or f"the sink exited with {self._proc.returncode}"


def _cpu_times(cpu: str) -> list[int]:
    """CPU ``cpu``'s times from /proc/stat (user nice system idle iowait irq softirq steal), in ticks."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return [int(v) for v in line.split()[1:9]]
    raise RuntimeError(f"cpu{cpu} not in /proc/stat")


def _cpu_share(before: list[int], after: list[int]) -> tuple[float, float]:
    """Between two readings: the busy share of the CPU, and the share spent in softirq (the kernel's network work)."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta)
    if total <= 0:
        return 0.0, 0.0
    return (total - delta[3] - delta[4]) / total, delta[6] / total


def _small_p99_ms(log: Path, offset: int) -> tuple[float, float]:
    """From the access log's lines of the 1 KB requests after ``offset``: the p99 of their ``duration`` and of their
    duration less ``upstream_duration`` (the gateway's own part). The log is written in batches: waits for the last."""
    time.sleep(0.5)
    with log.open("rb") as handle:
        handle.seek(offset)
        records = [json.loads(line) for line in handle.read().splitlines() if line.startswith(b"{")]
    small = [record for record in records if record.get("path") == "/small"]
    if not small:
        raise RuntimeError(f"{log}: no 1 KB request logged")

    return (1000.0 * percentile([float(r["duration"]) for r in small], 0.99),
            1000.0 * percentile([float(r["duration"]) - float(r["upstream_duration"] or 0.0) for r in small], 0.99))


def latency(args: argparse.Namespace, work: Path, upstream_port: int, results: dict[str, Any]) -> None:
    """1 KB p99 with the board route idle, and while boards are read from it at ``--board-rate``, for each board: cold
    rewrites (every body scanned), warm ones (the memo's) and the pass-through, beside the control and the floor."""
    setups = [(f"{label}{suffix}", tree, phase, options) for suffix, tree in trees(args)
              for label, phase, options in (("capped, cold", "capped", {"memo_bytes": 0}),
                                            ("removed, cold", "removed", {"memo_bytes": 0}),
                                            # The memo's case (a board read again, unchanged: the common one), its
                                            # bodies only compared, read one piece a turn as the cold ones.
                                            ("capped, warm", "capped", {}),
                                            ("pass-through boards", None, None))]
    # The control: the same boards read from the upstream itself, beside the gateway: what the machine (the upstream,
    # the board client, wrk) does to the 1 KB requests without the gateway carrying a board.
    setups.append((CONTROL, ROOT, None, None))
    if args.pin:
        # The floor: the same boards received on the gateway's CPU by a sink that does nothing with them: what any
        # proxy there that must read the boards' bytes costs the 1 KB requests before it does anything with them.
        setups.append((SINK, ROOT, None, None))
        if args.split:
            # The boards rewritten by another gateway process on the same CPU: what is left when the kernel, not one
            # event loop, takes turns between the boards and the 1 KB requests.
            setups.append((SPLIT, ROOT, None, None))
    rows = [(name, board) for name, *_ in setups for board in BOARDS]
    samples: dict[tuple[str, str], dict[str, list[dict[str, float]]]] = {
        row: {"idle": [], "boards": []} for row in rows}
    boards_done = dict.fromkeys(rows, 0)
    seconds = dict.fromkeys(rows, 0.0)
    procs: list[subprocess.Popen[bytes]] = []
    logs: dict[str, Path] = {}
    inside: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {
        row: {"idle": [], "boards": []} for row in rows}
    # The gateway's CPU's busy and softirq shares during each 1 KB run (printed with --pin, where that CPU is the
    # gateways' alone).
    cpu: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {row: {"idle": [], "boards": []} for row in rows}
    try:
        gateways = {}
        for name, tree, phase, options in setups:
            logs[name] = work / f"access-{len(logs)}.log"
            proc, port = start_gateway(work, tree, upstream_port, phase, options, production=True,
                                       cpus=GATEWAY_CPU if args.pin else None, log=logs[name])
            procs.append(proc)
            subprocess.run(["wrk", "-c10", "-t1", "-d1s", f"http://127.0.0.1:{port}/small"], capture_output=True,
                           check=True)
            for board in BOARDS:
                fetch(port, board_path(board))
            gateways[name] = port
        # Where each row's boards are read from: its own gateway, or the upstream itself (the control and the
        # floor), or a second gateway on the same CPU.
        board_ports = {**gateways, CONTROL: upstream_port, SINK: upstream_port}
        if SPLIT in gateways:
            logs["split boards"] = work / f"access-{len(logs)}.log"
            proc, board_ports[SPLIT] = start_gateway(work, ROOT, upstream_port, "capped", {"memo_bytes": 0},
                                                     production=True, cpus=GATEWAY_CPU, log=logs["split boards"])
            procs.append(proc)
            for board in BOARDS:
                fetch(board_ports[SPLIT], board_path(board))

        def small_requests(name: str, board: str, port: int, phase: str) -> None:
            """One wrk run of 1 KB requests through the row's gateway: the client's figures, the gateway CPU's
            shares, and the same requests' p99 from the gateway's access log."""
            mark = logs[name].stat().st_size
            ticks = _cpu_times(GATEWAY_CPU)
            samples[(name, board)][phase].append(wrk(f"http://127.0.0.1:{port}/small", args.duration,
                                                     connections=args.connections, threads=1, rate=args.rate,
                                                     cpus=LOAD_CPUS if args.pin else None))
            cpu[(name, board)][phase].append(_cpu_share(ticks, _cpu_times(GATEWAY_CPU)))
            inside[(name, board)][phase].append(_small_p99_ms(logs[name], mark))

        for round_no in range(args.rounds):
            order = list(gateways.items())
            order = order[round_no % len(order):] + order[: round_no % len(order)]
            for name, port in order:
                for board in (BOARDS if round_no % 2 == 0 else BOARDS[::-1]):
                    small_requests(name, board, port, "idle")
                    start = time.monotonic()
                    path = board_path(board)
                    load: BoardLoad | SinkLoad = (
                        SinkLoad(board_ports[name], args.board_rate, GATEWAY_CPU, path) if name == SINK
                        else BoardLoad(board_ports[name], args.board_rate, path))
                    with load:
                        small_requests(name, board, port, "boards")
                    seconds[(name, board)] += time.monotonic() - start
                    if load.failed:
                        raise RuntimeError(f"{name}, {board}: the board client failed: {load.failed}")
                    boards_done[(name, board)] += load.done
            print(f"  round {round_no + 1}/{args.rounds} (load {loadavg()}): " + ", ".join(
                f"{name}/{board} p99 {samples[(name, board)]['idle'][-1]['p99_ms']:.1f} -> "
                f"{samples[(name, board)]['boards'][-1]['p99_ms']:.1f} ms" for name in gateways for board in BOARDS),
                flush=True)
    finally:
        stop(procs)
    out = latency_rows(samples, inside, cpu, boards_done, seconds, floor=SINK if args.pin else None)
    results["latency"] = {f"{name} / {board}": row for (name, board), row in out.items()}
    print_latency(args, out)


def latency_rows(samples: dict[tuple[str, str], dict[str, list[dict[str, float]]]],
                 inside: dict[tuple[str, str], dict[str, list[tuple[float, float]]]],
                 cpu: dict[tuple[str, str], dict[str, list[tuple[float, float]]]],
                 boards_done: dict[tuple[str, str], int], seconds: dict[tuple[str, str], float],
                 floor: str | None) -> dict[tuple[str, str], dict[str, Any]]:
    """Per row and board: the client's p99 idle and under boards (per round, and their ratio), the same requests
    timed inside the gateway, the gateway CPU's shares; with ``floor`` (the sink's row), each row's p99 under boards
    against the floor's on the same board in the same round."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (name, board), runs in samples.items():
        row: dict[str, Any] = {
            "idle_p99_ms_rounds": [r["p99_ms"] for r in runs["idle"]],
            "boards_p99_ms_rounds": [r["p99_ms"] for r in runs["boards"]],
            "p99_ratio_rounds": [b["p99_ms"] / i["p99_ms"] for i, b in zip(runs["idle"], runs["boards"], strict=True)],
            "idle_rps": statistics.median(r["rps"] for r in runs["idle"]),
            "boards_rps": statistics.median(r["rps"] for r in runs["boards"]),
            "boards_per_s": boards_done[(name, board)] / max(seconds[(name, board)], 1e-9),
        }
        if floor is not None:
            base = samples[(floor, board)]["boards"]
            row["vs_floor_rounds"] = [b["p99_ms"] / f["p99_ms"] for b, f in zip(runs["boards"], base, strict=True)]
        for key, at in (("inside", 0), ("own", 1)):
            idle = [sample[at] for sample in inside[(name, board)]["idle"]]
            loaded = [sample[at] for sample in inside[(name, board)]["boards"]]
            row[f"{key}_idle_p99_ms"] = statistics.median(idle)
            row[f"{key}_boards_p99_ms"] = statistics.median(loaded)
            row[f"{key}_p99_ratio"] = statistics.median(b / i for i, b in zip(idle, loaded, strict=True))
        for key, at in (("busy", 0), ("softirq", 1)):
            for phase in ("idle", "boards"):
                row[f"cpu_{key}_{phase}"] = statistics.median(sample[at] for sample in cpu[(name, board)][phase])
        out[(name, board)] = row
    return out


def print_latency(args: argparse.Namespace, out: dict[tuple[str, str], dict[str, Any]]) -> None:
    print()
    paced = f", paced to about {args.rate:g}/s" if args.rate else ", as fast as the gateway answers"
    pinned = (f"; the gateways on CPU {GATEWAY_CPU}, the upstream, wrk and the board client on CPU {LOAD_CPUS}"
              if args.pin else "")
    print(f"1 KB requests, wrk -t1 -c{args.connections}{paced}, idle and while a client reads {args.board_rate:g} "
          f"boards/s{pinned}; median (least–greatest) of {args.rounds} rounds:")
    print("| board route | board | 1 KB p99 idle | p99 under boards | ratio to idle | vs the floor (same board, "
          "same round) | 1 KB req/s idle / under boards | boards/s done |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, board), row in out.items():
        floor = fmt_spread(row["vs_floor_rounds"], 2, suffix="x") if "vs_floor_rounds" in row else ""
        print(f"| {name} | {board} | {fmt_spread(row['idle_p99_ms_rounds'], 2, ' ms')} | "
              f"{fmt_spread(row['boards_p99_ms_rounds'], 2, ' ms')} | "
              f"{fmt_spread(row['p99_ratio_rounds'], 2, suffix='x')} "
              f"| {floor} | {row['idle_rps']:.0f} / {row['boards_rps']:.0f} | {row['boards_per_s']:.1f} |")
    print()
    print("The same 1 KB requests timed inside the gateway (its access log's duration: from the request's head read to "
          "its answer written), without the client's and the kernel's queues:")
    print("| board route | board | p99 idle | p99 under boards | ratio (median of rounds) | the gateway's own part "
          "(less the upstream's time): idle, under boards, ratio |")
    print("|---|---|---:|---:|---:|---|")
    for (name, board), row in out.items():
        print(f"| {name} | {board} | {row['inside_idle_p99_ms']:.3f} ms | {row['inside_boards_p99_ms']:.3f} ms | "
              f"{row['inside_p99_ratio']:.2f}x | {row['own_idle_p99_ms']:.3f} ms, {row['own_boards_p99_ms']:.3f} ms, "
              f"{row['own_p99_ratio']:.2f}x |")
    if args.pin:
        print()
        print(f"The gateway's CPU (CPU {GATEWAY_CPU}) during the 1 KB runs, from /proc/stat (medians of rounds):")
        print("| board route | board | busy idle → under boards | of which softirq (the kernel's network work) |")
        print("|---|---|---|---|")
        for (name, board), row in out.items():
            print(f"| {name} | {board} | {100 * row['cpu_busy_idle']:.0f} % → {100 * row['cpu_busy_boards']:.0f} % | "
                  f"{100 * row['cpu_softirq_idle']:.1f} % → {100 * row['cpu_softirq_boards']:.1f} % |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per row and round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, rows taking turns (default: %(default)s)")
    parser.add_argument("--cards", type=int, default=5000)
    parser.add_argument("--padding", type=int, default=900, help="description characters per card of the bench's own "
                        "board (sets its size)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--baseline", type=Path, help="another checkout of the gateway (an earlier commit, its C "
                        "module built): every row is also measured on it, in the same rounds")
    parser.add_argument("--instructions", type=int, metavar="N", help="count user-space instructions per request "
                        "under callgrind over N requests per row, instead of the wrk rows")
    parser.add_argument("--latency", action="store_true", help="measure the 1 KB p99 while boards are rewritten, "
                        "instead of the wrk rows")
    parser.add_argument("--scan", action="store_true", help="time the scan alone in-process on the board written three "
                        "ways (compact, indented, escaped), instead of the wrk rows")
    parser.add_argument("--board-rate", type=float, default=10.0, help="boards a second during --latency "
                        "(default: %(default)s)")
    parser.add_argument("--rate", type=float, help="--latency: pace the 1 KB requests to about this many a second "
                        "(each wrk connection waits connections/rate seconds before each request), below what the "
                        "gateway can take, instead of as many as it answers")
    parser.add_argument("--pin", action="store_true", help="the gateways on one CPU, everything else (the upstream, "
                        "wrk, --latency's board client) on another, so the load's own work does not take the "
                        "gateway's CPU (needs 2 CPUs and taskset)")
    parser.add_argument("--upstream", choices=("nginx", "python"), default="nginx", help="what serves the boards: "
                        "nginx from files (default), or the aiohttp upstream of the earlier runs")
    parser.add_argument("--seed", type=int, default=37, help="the realistic board's seed (default: %(default)s)")
    parser.add_argument("--split", action="store_true", help="--latency --pin: also a row whose boards are rewritten "
                        "by a second gateway process on the gateways' CPU")
    parser.add_argument("--connections", type=int, default=50, help="wrk connections for the 1 KB requests of "
                        "--latency (default: %(default)s)")
    args = parser.parse_args()

    bodies = make_boards(args.cards, args.padding, args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-board-cards-"))
    work.chmod(0o755)  # nginx's worker may run as another user: it must reach the files under it
    mode = "scan" if args.scan else "instructions" if args.instructions else "latency" if args.latency else "throughput"
    print(f"boards: {args.cards} cards, " + ", ".join(f"{name} {len(body) / 2**20:.1f} MiB" for name, body in
                                                      bodies.items()) +
          f"; {mode}; upstream {args.upstream}; load average {loadavg()}", flush=True)
    results: dict[str, Any] = {"board_bytes": {name: len(body) for name, body in bodies.items()}, "cards": args.cards,
                               "seed": args.seed, "rounds": args.rounds, "mode": mode, "duration": args.duration,
                               "upstream": args.upstream, "pin": args.pin, "load_start": loadavg()}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        upstream_port = free_port()
        pin = ["taskset", "-c", LOAD_CPUS] if args.pin else []
        if args.latency and args.pin:
            os.sched_setaffinity(0, {int(LOAD_CPUS)})  # the board client's thread
        start_upstream = start_nginx_upstream if args.upstream == "nginx" else start_python_upstream
        procs.append(start_upstream(work, upstream_port, bodies, pin))
        wait_port(upstream_port, proc=procs[0])
        for name, body in bodies.items():  # the upstream serves each board whole before anything is measured
            if (size := fetch(upstream_port, board_path(name))) != len(body):
                raise RuntimeError(f"the upstream served {size} bytes for the {name} board, not {len(body)}")
        if args.scan:
            scan_table(args, results)  # (with --instructions N: also callgrind counts per scan, N unused)
        elif args.instructions:
            instructions(args, work, upstream_port, results)
        elif args.latency:
            latency(args, work, upstream_port, results)
        else:
            throughput(args, work, upstream_port, results, procs[0])
    finally:
        stop(procs)
        shutil.rmtree(work, ignore_errors=True)
    if mode == "throughput":
        results["rewrite"] = {}
        for name, body in bodies.items():
            results["rewrite"][name] = rw = time_rewrite(body)
            if args.baseline is not None:
                rw["baseline_hold_ms"] = baseline_hold(args.baseline.resolve(), body)
            print()
            print(f"{name} board, rewrite CPU per request (in-process, best of 5): scan {rw['scan_ms']:.2f} ms whole, "
                  f"{rw['scan_in_pieces_ms']:.2f} ms fed in pieces of {PIECE:,} bytes (longest hold of the loop "
                  f"{rw['longest_hold_ms']:.3f} ms); without the native path {rw['scan_without_native_ms']:.1f} ms; "
                  f"cap splice {rw['cap_splice_ms']:.2f} ms, removal splice {rw['drop_splice_ms']:.3f} ms, memo hit "
                  f"(byte comparison) {rw['memo_hit_ms']:.2f} ms")
            if "baseline_hold_ms" in rw:
                print(f"longest hold of the event loop per cold capped board: {rw['longest_hold_ms']:.3f} ms here, "
                      f"{rw['baseline_hold_ms']:.2f} ms in the baseline")
    results["load_end"] = loadavg()
    print(f"load average at the end: {results['load_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
