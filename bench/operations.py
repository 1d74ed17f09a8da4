"""Issue 5's figures: --workers 2 against one worker, and what metrics and the access log cost (on against off).

Every variant is a gateway in front of the same nginx serving a 1 KB JSON file, driven by `wrk -t1 -c50`;
rounds are interleaved (the order rotates each round) and ratios are medians of per-round ratios.

    .venv/bin/python bench/operations.py [--rounds 3] [--duration 10]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as harness  # noqa: E402 - the main harness's process and nginx helpers
from benchlib import tool  # noqa: E402

VARIANTS: dict[str, tuple[int, bool, bool]] = {
    # name: (workers, access log, metrics)
    "1 worker": (1, True, True),
    "2 workers": (2, True, True),
    "1 worker, access log off": (1, False, True),
    "1 worker, metrics off": (1, True, False),
    "1 worker, both off": (1, False, False),
}


def _config(tmp: Path, name: str, port: int, admin: int, upstream: int, log: bool, metrics: bool) -> Path:
    config = {
        "server": {"listen": f"{harness.HOST}:{port}", "admin_listen": f"{harness.HOST}:{admin}", "shutdown_timeout": 2},
        "access_log": {"enabled": log},
        "metrics": {"enabled": metrics},
        "tenants": [{"name": "bench", "hosts": [harness.HOST], "upstream": f"http://{harness.HOST}:{upstream}"}],
    }
    path = tmp / f"{name.replace(' ', '_').replace(',', '')}.yaml"
    path.write_text(json.dumps(config))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10)
    args = parser.parse_args()
    nginx, wrk = tool("nginx"), tool("wrk")
    tmp = Path(tempfile.mkdtemp(prefix="gw-ops-bench-"))
    ports = harness.pick_ports(18280, 1 + 2 * len(VARIANTS))
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        with harness.Stack() as stack:
            docroot = tmp / "www"
            docroot.mkdir()
            (docroot / "1k.json").write_bytes(b'{"pad":"' + b"x" * 1012 + b'"}')
            body = harness.NGINX_STATIC.format(host=harness.HOST, port=ports[0], docroot=docroot)
            upstream = stack.start(harness.Proc("upstream", [nginx, "-p", str(tmp), "-c",
                                                             str(harness.nginx_conf(tmp, "upstream", body))], tmp))
            harness.wait_ready(upstream, harness.port_accepts(ports[0]))
            urls = {}
            for i, (name, (workers, log, metrics)) in enumerate(VARIANTS.items()):
                port, admin = ports[1 + 2 * i], ports[2 + 2 * i]
                config = _config(tmp, name, port, admin, ports[0], log, metrics)
                argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--workers", str(workers),
                        "--log-level", "warning"]
                proc = stack.start(harness.Proc(f"gw{i}", argv, tmp, f"gw{i}-access.log"))
                harness.wait_ready(proc, lambda: harness.http(f"http://{harness.HOST}:{admin}/readyz")[0] == 200)
                urls[name] = f"http://{harness.HOST}:{port}/1k.json"
            names = list(VARIANTS)
            for rnd in range(args.rounds):
                order = names[rnd % len(names):] + names[: rnd % len(names)]
                for name in order:
                    out = subprocess.run([wrk, "-t1", "-c50", f"-d{int(args.duration)}s", urls[name]],
                                         capture_output=True, text=True, timeout=args.duration + 30)
                    rps = harness.parse_wrk(out.stdout)["rps"]
                    results[name].append(rps)
                    print(f"round {rnd + 1}: {name}: {rps:,.0f} req/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results["1 worker"]
    print("\n| variant | req/s (median) | vs 1 worker (median of per-round ratios) |\n|---|---|---|")
    for name, values in results.items():
        ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
        print(f"| {name} | {statistics.median(values):,.0f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
