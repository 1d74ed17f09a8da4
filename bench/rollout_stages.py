"""Issue 35: what the staged rollout costs a request. The board route (board_cards) served three ways, in front of one
nginx serving the boards from files, each gateway its own process:

- ``stages``: this tree, with a ramp, a freeze and a shadow window all in force on the board route's behaviour (the
  client is in the ramp's share? decided by a keyed hash each request; the freeze asks the fleet's record; the shadow
  records what the next phase would do);
- ``plain``: this tree, the same config without them;
- ``baseline`` (``--baseline DIR``): another checkout, the code before, the plain config.

Two requests: a 1 KB board (three cards, the small request) and a board of 2,000 cards, both in the capped phase,
with a token (one client). wrk, ``--rounds`` interleaved rounds of ``--duration`` seconds; the table gives each
target's median req/s, its spread, and the ratios stages/plain and stages/baseline (medians of per-round ratios).

    .venv/bin/python bench/rollout_stages.py [--baseline /path/to/checkout] [--rounds 5] [--duration 5]
    .venv/bin/python bench/rollout_stages.py --instructions 2000 [--baseline ...] [--rounds 3]

``--instructions N``: instead of wrk, each gateway under valgrind's callgrind, the instructions (user space, every
thread) of exactly N requests after a warm-up, per request: repeatable where wall time on a shared machine is not.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import HOST, free_port, tool, wait_port
from run import callgrind_control, callgrind_total

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.board_fixtures import board_bytes  # noqa: E402 - the boards the tests use

PYTHON = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
NOW = "2026-10-15T00:00:00Z"  # the capped phase
REQUESTS = (("1 KB board", "/api/latest/boards/1"), ("2,000-card board", "/api/latest/boards/2"))
STAGES: dict[str, Any] = {
    "ramp_key": "bench",
    "ramps": [{"behaviour": "board_cards", "phase": "removed", "steps": [{"share": 30, "from": "2026-10-05"}]}],
    "freezes": [{"behaviour": "board_cards", "from": "2026-10-10"}],
    "shadows": [{"behaviour": "board_cards", "start": "2026-10-12T00:00:00Z", "end": "2026-10-20T00:00:00Z"}],
}


def nginx(work: Path, port: int) -> subprocess.Popen[bytes]:
    (work / "api/latest/boards").mkdir(parents=True)
    for place in (work.parent, work, *work.glob("**/")):
        place.chmod(0o755)  # nginx's worker (nobody) reads the boards
    (work / "api/latest/boards/1").write_bytes(board_bytes(3))
    (work / "api/latest/boards/2").write_bytes(board_bytes(2000))
    conf = work / "nginx.conf"
    conf.write_text(f"""
daemon off; worker_processes 1; pid {work}/nginx.pid; error_log {work}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off; default_type application/json; sendfile on; keepalive_requests 100000;
  client_body_temp_path {work}/tmp; proxy_temp_path {work}/tmp; fastcgi_temp_path {work}/tmp;
  uwsgi_temp_path {work}/tmp; scgi_temp_path {work}/tmp;
  server {{ listen {HOST}:{port}; root {work}; location / {{ }} }}
}}
""")
    proc = subprocess.Popen([tool("nginx"), "-c", str(conf), "-p", str(work)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port, proc=proc)
    return proc


def gateway(work: Path, name: str, tree: Path, upstream: int, stages: bool,
            wrapper: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], int]:
    port, admin = free_port(), free_port()
    config = {
        "server": {"listen": f"{HOST}:{port}", "admin_listen": f"{HOST}:{admin}"},
        "access_log": {"enabled": True},
        "usage": {"ledger": {"url": f"sqlite:///{work}/{name}.sqlite3"}},
        "tenants": [{"name": "t", "hosts": [HOST], "upstream": f"http://{HOST}:{upstream}", "created": "2026-06-01"}],
        "routes": [{"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}"],
                    "prefixes": ["/api/latest"], "chain": [{"board_cards": {"memo_bytes": 0}}]}],
        "rollout": {"now": NOW, **(STAGES if stages else {})},
    }
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = (work / f"{name}.log").open("wb")
    proc = subprocess.Popen([*wrapper, PYTHON, "-m", "gateway", "serve", "--config", str(path)], cwd=tree, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc=proc, timeout=180 if wrapper else 15)
    return proc, port


def send(port: int, path: str, n: int) -> None:
    """``n`` requests on one kept-alive connection, each answer read whole."""
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        for _ in range(n):
            conn.request("GET", path, headers={"Authorization": "Bearer bench-client"})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}")
    finally:
        conn.close()


def instructions(work: Path, name: str, tree: Path, upstream: int, stages: bool, path: str, n: int, tag: str) -> float:
    """Instructions per request of one gateway under callgrind (counted from ``callgrind_control -i on`` to ``off``
    around exactly ``n`` requests)."""
    out = work / f"callgrind-{name}-{tag}.out"
    proc, port = gateway(work, f"{name}-{tag}", tree, upstream, stages,
                         ("valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"))
    try:
        send(port, path, 200)  # warm-up
        callgrind_control(proc.pid, "-i", "on")
        send(port, path, n)
        callgrind_control(proc.pid, "-i", "off")
        callgrind_control(proc.pid, "-d")
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    total, _ = callgrind_total(out)
    return total / n


def wrk(port: int, path: str, duration: int) -> float:
    send(port, path, 1)  # an answer other than 200 stops the bench: its rate would measure nothing
    out = subprocess.run([tool("wrk"), "-c4", "-t2", f"-d{duration}s", "-H", "Authorization: Bearer bench-client",
                          f"http://{HOST}:{port}{path}"], capture_output=True, text=True, check=True,
                         timeout=duration + 60).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"{path}: answers other than 200 under load:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--baseline", type=Path, help="another checkout (its C module built): the code before")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--instructions", type=int, metavar="N", help="callgrind's instructions per request instead")
    args = parser.parse_args()
    targets = [("stages", ROOT, True), ("plain", ROOT, False)]
    if args.baseline is not None:
        targets.append(("baseline", args.baseline.resolve(), False))
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-stages-") as tmp:
        work = Path(tmp)
        upstream = free_port()
        try:
            procs.append(nginx(work / "nginx", upstream))
            rows: dict[str, dict[str, list[float]]] = {}
            if args.instructions:
                for label, path in REQUESTS:
                    rows[label] = {name: [] for name, _, _ in targets}
                    for rnd in range(args.rounds):
                        for name, tree, stages in targets:
                            rows[label][name].append(instructions(work, name, tree, upstream, stages, path,
                                                                  args.instructions, f"{rnd}{path[-1]}"))
            else:
                ports = {}
                for name, tree, stages in targets:
                    proc, ports[name] = gateway(work, name, tree, upstream, stages)
                    procs.append(proc)
                for label, path in REQUESTS:
                    rows[label] = {name: [] for name, _, _ in targets}
                    for _ in range(args.rounds):
                        for name, _, _ in targets:
                            rows[label][name].append(wrk(ports[name], path, args.duration))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
    print(_table(rows, [name for name, _, _ in targets], "instructions/request" if args.instructions else "req/s"))
    return 0


def _table(rows: dict[str, dict[str, list[float]]], names: list[str], unit: str) -> str:
    lines = ["| request | " + " | ".join(f"{n} {unit} (min-max)" for n in names)
             + " | stages/plain" + (" | stages/baseline |" if "baseline" in names else " |"),
             "|---|" + "---:|" * (len(names) + 1 + ("baseline" in names))]
    for label, per in rows.items():
        cells = [f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for v in (per[n] for n in names)]
        ratios = [statistics.median(a / b for a, b in zip(per["stages"], per[other], strict=True))
                  for other in ("plain", "baseline") if other in per]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.3f}x" for r in ratios) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
