"""Benchmark of board_cards: a ~10 MB board of 5,000 cards through the gateway in each phase, in one run.

    .venv/bin/python bench/board_cards.py [--duration 10] [--cards 5000] [--json FILE]

Starts an upstream that serves the board (with a strong ETag), then one gateway per row, each with its clock fixed
by GATEWAY_NOW, and drives each with ``wrk -c4 -t2``:

- ``pass-through``: the board route with no policy (the baseline the ratios are against);
- ``full``: board_cards before the cap date (bytes untouched, headers added);
- ``capped`` and ``removed``: the two rewriting phases, with the memo of identical bodies (the default);
- ``capped, cold`` and ``removed, cold``: the same with ``memo_bytes: 0``, so every request scans the body.

Rows take turns for ``--rounds`` rounds (medians are reported), so a change in the machine's load during the
run falls on every row alike. For each row: requests per second, mean and p99 latency, the gateway process's CPU time per request
(``/proc/PID/stat``), and the ratio to pass-through. It also times the rewrite itself in-process (scan + splice,
and the memo hit: a byte comparison with the cached body), which is the "CPU time of the rewrite per request".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policies.board_cards import json_splice  # noqa: E402
from tests.board_fixtures import board_bytes  # noqa: E402
from benchlib import cpu_seconds, free_port, wait_port

PYTHON = sys.executable
INSTANTS = {"full": "2026-09-15T00:00:00Z", "capped": "2026-10-15T00:00:00Z", "removed": "2026-11-15T00:00:00Z"}

UPSTREAM = r'''
import sys
from aiohttp import web
body = open(sys.argv[2], "rb").read()
async def board(request):
    if request.headers.get("If-None-Match") == '"board-v1"':
        return web.Response(status=304, headers={"ETag": '"board-v1"'})
    return web.Response(body=body, content_type="application/json", headers={"ETag": '"board-v1"'})
app = web.Application()
app.router.add_get("/{tail:.*}", board)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
'''


def gateway_config(upstream_port: int, port: int, options: dict[str, Any] | None) -> str:
    route: dict[str, Any] = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"]}
    if options is not None:
        route["chain"] = [{"board_cards": options}]
    config = {
        "server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{free_port()}"},
        "access_log": {"enabled": False},
        "tenants": [{"name": "bench", "hosts": ["127.0.0.1"], "upstream": f"http://127.0.0.1:{upstream_port}"}],
        "routes": [route],
    }
    return json.dumps(config)  # JSON is YAML


def wrk(url: str, duration: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-c4", "-t2", f"-d{duration}s", "--latency", url], capture_output=True, text=True,
                         check=True).stdout
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

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        return min(times) * 1000

    extra = ("cards_deprecation_message", b'"moved"')
    layout = json_splice.scan(body, "cards", keep=100, extra_key=extra[0])
    copy = bytes(bytearray(body))
    native = json_splice._native_scan
    json_splice._native_scan = None  # the scan by the exact path alone (as without the C module), for comparison
    try:
        scan_without_native = best(lambda: json_splice.scan(body, "cards", keep=100, extra_key=extra[0]))
    finally:
        json_splice._native_scan = native
    return {
        "scan_ms": best(lambda: json_splice.scan(body, "cards", keep=100, extra_key=extra[0])),
        "scan_without_native_ms": scan_without_native,
        "cap_splice_ms": best(lambda: json_splice.truncate(body, layout, 100, extra)),
        "drop_splice_ms": best(lambda: json_splice.drop(body, layout, extra)),
        "memo_hit_ms": best(lambda: copy == body),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per row and round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, rows taking turns (default: %(default)s)")
    parser.add_argument("--cards", type=int, default=5000)
    parser.add_argument("--padding", type=int, default=900, help="description characters per card (sets the size)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--baseline", type=Path, help="another checkout of the gateway (an earlier commit, its C "
                        "module built): every row is also measured on it, in the same rounds")
    args = parser.parse_args()

    body = board_bytes(args.cards, padding=args.padding)
    work = Path(tempfile.mkdtemp(prefix="bench-board-cards-"))
    (work / "board.json").write_bytes(body)
    (work / "upstream.py").write_text(UPSTREAM)
    print(f"board: {args.cards} cards, {len(body) / 1e6:.1f} MB; wrk -c4 -t2 -d{args.duration}s per row, "
          f"{args.rounds} rounds (medians)", flush=True)

    rows: list[tuple[str, str | None, dict[str, Any] | None, Path]] = [
        ("pass-through", None, None, ROOT),
        ("full", "full", {}, ROOT),
        ("capped", "capped", {}, ROOT),
        ("removed", "removed", {}, ROOT),
        ("capped, cold", "capped", {"memo_bytes": 0}, ROOT),
        ("removed, cold", "removed", {"memo_bytes": 0}, ROOT),
    ]
    if args.baseline is not None:
        rows += [(f"{name} [baseline]", phase, options, args.baseline.resolve()) for name, phase, options, _ in rows]
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {"board_bytes": len(body), "cards": args.cards, "rounds": args.rounds, "rows": {}}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _, _, _ in rows}
    try:
        upstream_port = free_port()
        procs.append(subprocess.Popen([PYTHON, str(work / "upstream.py"), str(upstream_port), str(work / "board.json")]))
        wait_port(upstream_port)
        gateways: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        for name, phase, options, tree in rows:
            port = free_port()
            config = work / f"gateway-{port}.yaml"
            config.write_text(gateway_config(upstream_port, port, options))
            env = {**os.environ, "GATEWAY_NOW": INSTANTS[phase or "full"], "PYTHONPATH": str(tree)}
            proc = subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(config), "--log-level",
                                     "warning"], cwd=tree, env=env, stdout=subprocess.DEVNULL)
            procs.append(proc)
            wait_port(port)
            url = f"http://127.0.0.1:{port}/api/latest/boards/1"
            subprocess.run(["wrk", "-c1", "-t1", "-d1s", url], capture_output=True, check=True)  # warm up
            gateways[name] = (proc, url)
        # Rows take turns, round after round, so a change in the machine's load falls on all of them alike.
        for round_no in range(args.rounds):
            for name, (proc, url) in gateways.items():
                before = cpu_seconds(proc.pid)
                sample = wrk(url, args.duration)
                sample["cpu_ms"] = (cpu_seconds(proc.pid) - before) * 1000
                samples[name].append(sample)
            print(f"  round {round_no + 1}/{args.rounds}: " + ", ".join(
                f"{name} {samples[name][-1]['rps']:.1f}" for name in gateways), flush=True)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    for name, runs in samples.items():
        requests = sum(r["requests"] for r in runs)
        results["rows"][name] = {
            "rps": statistics.median(r["rps"] for r in runs),
            "mean_ms": statistics.median(r["mean_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "requests": requests,
            "gateway_cpu_ms_per_request": sum(r["cpu_ms"] for r in runs) / max(requests, 1),
        }
    results["rewrite"] = time_rewrite(body)
    print()
    print("| row | req/s | vs pass-through | vs full (untouched) | mean latency | p99 latency | gateway CPU per request |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in results["rows"].items():
        # A baseline row is compared with the baseline's own pass-through and full rows.
        suffix = " [baseline]" if name.endswith(" [baseline]") else ""
        base = results["rows"]["pass-through" + suffix]["rps"]
        full = results["rows"]["full" + suffix]["rps"]
        print(f"| {name} | {row['rps']:.1f} | {row['rps'] / base:.2f}x | {row['rps'] / full:.2f}x | {row['mean_ms']:.1f} ms "
              f"| {row['p99_ms']:.1f} ms | {row['gateway_cpu_ms_per_request']:.1f} ms |")
    rw = results["rewrite"]
    print()
    print(f"rewrite CPU per request (in-process, best of 5): scan {rw['scan_ms']:.1f} ms (without the native path "
          f"{rw['scan_without_native_ms']:.1f} ms), cap splice "
          f"{rw['cap_splice_ms']:.2f} ms, removal splice {rw['drop_splice_ms']:.3f} ms, memo hit (byte comparison) "
          f"{rw['memo_hit_ms']:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
