"""Benchmark of the legacy upload guard: what a blocked upload costs, and what the gateway costs an allowed one.

    .venv/bin/python bench/upload_guard.py [--rounds N] [--large-mib 1024] [--small-mib 64] [--json FILE]

Starts, on 127.0.0.1 only, bench/sink.py (the upstream: reads every body to the end) and the gateway
(``python -m gateway serve``, one process, access log off) with a company whose forbid setting is on and one whose
setting is off. Then measures:

1. Blocked uploads, 64 MiB and 1 GiB, PUT .../files (decided from the head) and POST .../comments (file part after
   a text part): time from the end of the request head to the whole 403, and the body bytes the gateway's TCP stack
   accepted (``tcpi_bytes_acked`` of the client socket: an upper bound of what the gateway read), for a client that
   reads while it sends (like curl) and for one that only reads after its writes fail.
2. The gateway's peak RSS (VmHWM) after the blocked uploads.
3. An allowed 1 GiB upload to the restricted access route (POST /api/v1/cards/{uid}/files), through the gateway and
   straight to the sink, in interleaved rounds; and a 1 GiB deprecated upload for a company with the setting off
   (streamed through, part headers read on the way).

Prints a Markdown report. Exits 0 when every measurement was valid, 1 when an answer was wrong. Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from benchlib import HOST, free_port, proc_status, wait_port

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MiB = 1 << 20
BOUNDARY = "bench-upload-guard"
UID = "6f1c0de4-7a7e-4d4e-9a52-0c1f2a3b4c5d"

CONFIG = """\
server: {{listen: "{host}:{port}", admin_listen: "{host}:{admin}"}}
access_log: {{enabled: false}}
tenants:
  - {{name: forbid-on, hosts: ["{host}"], upstream: "http://{host}:{sink}", created: 2026-06-01}}
  - {{name: forbid-off, hosts: [open.test], upstream: "http://{host}:{sink}", created: 2025-01-01}}
routes:
  - name: legacy_card_file_upload
    methods: [PUT]
    paths: ["/cards/{{card_id}}/files"]
    chain: [{{legacy_upload_guard: {{detect: route, successor: "/api/v1/cards/{{card_id}}/files"}}}}]
  - name: legacy_comment_create
    methods: [POST]
    paths: ["/cards/{{card_id}}/comments"]
    chain: [{{legacy_upload_guard: {{detect: file_parts, successor: "/api/v1/cards/{{card_id}}/comments/{{c}}/files"}}}}]
  - name: card_file_upload
    methods: [POST]
    paths: ["/cards/{{card_uid}}/files"]
"""


@contextlib.contextmanager
def started(cmd: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port, proc=proc)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def acked(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("<Q", info, 120)[0])  # tcpi_bytes_acked (Linux)


@dataclass
class Blocked:
    seconds: float  # end of the request head -> whole answer read (blind client: -> its first failed write)
    acked: int
    status: int


def blocked_upload(port: int, head: bytes, total: int, *, reads: bool) -> Blocked:
    """Send ``head`` and up to ``total`` body bytes; a reading client stops when the whole answer is in."""
    sock = socket.create_connection((HOST, port))
    sock.sendall(head)
    start = time.monotonic()
    base = acked(sock)
    block = memoryview(b"\0" * (256 << 10))
    answer = b""
    sent = 0
    seconds = None
    sock.setblocking(False)
    try:
        while sent < total or reads:
            want_write = sent < total
            readable, writable, _ = select.select([sock] if reads else [], [sock] if want_write else [], [], 10)
            if not readable and not writable:
                raise SystemExit("blocked upload: the gateway stalled")
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
                head_end = answer.find(b"\r\n\r\n")
                if head_end != -1 and len(answer) >= head_end + 4 + _length(answer[:head_end]):
                    seconds = time.monotonic() - start
                    break
            if writable:
                try:
                    sent += sock.send(block[: min(len(block), total - sent)])
                except OSError:
                    seconds = time.monotonic() - start
                    break
        got = acked(sock) - base
        if not reads or seconds is None:
            sock.setblocking(True)
            sock.settimeout(5)
            with contextlib.suppress(OSError):
                while data := sock.recv(65536):
                    answer += data
    finally:
        sock.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    if status != 403 or seconds is None:
        raise SystemExit(f"blocked upload: expected a whole 403, got {answer[:200]!r}")
    return Blocked(seconds, got, status)


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def streamed_upload(port: int, head: bytes, prefix: bytes, size: int, suffix: bytes) -> float:
    """Send a whole upload (``prefix`` + ``size`` bytes + ``suffix``) and read the answer; seconds taken."""
    block = b"\0" * MiB
    with socket.create_connection((HOST, port)) as sock:
        start = time.monotonic()
        sock.sendall(head + prefix)
        left = size
        while left:
            n = min(left, len(block))
            sock.sendall(block[:n] if n < len(block) else block)
            left -= n
        sock.sendall(suffix)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        seconds = time.monotonic() - start
    if not answer.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"allowed upload: expected 200, got {answer[:300]!r}")
    return seconds


def multipart_parts(file_field: str, with_text: bool) -> tuple[bytes, bytes]:
    text = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="text"\r\n\r\nsee attachment\r\n' if with_text else ""
    prefix = (f'{text}--{BOUNDARY}\r\nContent-Disposition: form-data; name="{file_field}"; filename="big.bin"\r\n'
              "Content-Type: application/octet-stream\r\n\r\n").encode()  # fmt: skip
    return prefix, f"\r\n--{BOUNDARY}--\r\n".encode()


def request_head(method: str, path: str, length: int, host: str = HOST) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer bench\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {length}\r\n\r\n").encode()  # fmt: skip


def median_of(rounds: int, run: Callable[[], Blocked]) -> Blocked:
    results = [run() for _ in range(rounds)]
    return Blocked(
        statistics.median(r.seconds for r in results), int(statistics.median(r.acked for r in results)), 403
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="repetitions per measurement (median reported)")
    parser.add_argument("--small-mib", type=int, default=64)
    parser.add_argument("--large-mib", type=int, default=1024)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    args = parser.parse_args()
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
    ports = {name: free_port() for name in ("sink", "gateway", "admin")}
    report: dict[str, object] = {"rounds": args.rounds}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.yaml"
        config.write_text(CONFIG.format(host=HOST, port=ports["gateway"], admin=ports["admin"], sink=ports["sink"]))
        sink_cmd = [python, str(BENCH / "sink.py"), "--listen", f"{HOST}:{ports['sink']}"]
        gateway_cmd = [python, "-m", "gateway", "serve", "--config", str(config), "--log-level", "warning"]
        with started(sink_cmd, ports["sink"]), started(gateway_cmd, ports["gateway"]) as gateway:
            report["rss_start"] = proc_status(gateway.pid, "VmRSS")
            blocked: list[dict[str, object]] = []
            for route in ("PUT .../files", "POST .../comments"):
                for size_mib in (args.small_mib, args.large_mib):
                    size = size_mib * MiB
                    if route.startswith("PUT"):
                        head = request_head("PUT", "/api/v1/cards/1/files", size)
                    else:
                        prefix, _ = multipart_parts("files[]", with_text=True)
                        head = request_head("POST", "/api/v1/cards/1/comments", size) + prefix
                    for reads in (True, False):
                        result = median_of(args.rounds, lambda: blocked_upload(ports["gateway"], head, size, reads=reads))
                        blocked.append({"route": route, "mib": size_mib, "client": "reads while sending" if reads
                                        else "reads after its writes fail", **asdict(result)})  # fmt: skip
            report["blocked"] = blocked
            report["rss_peak_after_blocked"] = proc_status(gateway.pid, "VmHWM")

            size = args.large_mib * MiB
            prefix, suffix = multipart_parts("file", with_text=False)
            legacy_prefix, legacy_suffix = multipart_parts("files[]", with_text=True)
            length = len(prefix) + size + len(suffix)
            legacy_length = len(legacy_prefix) + size + len(legacy_suffix)
            restricted = f"/api/v1/cards/{UID}/files"
            targets: dict[str, Callable[[], float]] = {
                "direct": lambda: streamed_upload(
                    ports["sink"], request_head("POST", restricted, length), prefix, size, suffix),
                "gateway": lambda: streamed_upload(
                    ports["gateway"], request_head("POST", restricted, length), prefix, size, suffix),
                "legacy_forbid_off": lambda: streamed_upload(
                    ports["gateway"], request_head("POST", "/api/v1/cards/1/comments", legacy_length, host="open.test"),
                    legacy_prefix, size, legacy_suffix),
            }  # fmt: skip
            seconds: dict[str, list[float]] = {name: [] for name in targets}
            names = list(targets)
            for i in range(max(5, args.rounds)):
                # The order rotates each round, so that a noisy neighbour weighs on every target alike.
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    seconds[name].append(targets[name]())
            report["allowed_mib"] = args.large_mib
            report["allowed_seconds"] = {name: sorted(v) for name, v in seconds.items()}
            report["allowed_ratio"] = statistics.median(
                g / d for g, d in zip(seconds["gateway"], seconds["direct"], strict=True))
            report["rss_peak_end"] = proc_status(gateway.pid, "VmHWM")
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def render(report: dict[str, object]) -> str:
    def mib(n: object) -> str:
        return f"{int(n) / MiB:.1f} MiB"  # type: ignore[call-overload]

    lines = [
        f"## Legacy upload guard (median of {report['rounds']} runs; {os.cpu_count()} CPUs, loopback)",
        "",
        "| blocked upload | size | client | time to the whole 403 | body bytes accepted by the gateway's TCP stack |",
        "|---|---|---|---|---|",
    ]
    for row in report["blocked"]:  # type: ignore[attr-defined]
        lines.append(f"| {row['route']} | {row['mib']} MiB | {row['client']} | {row['seconds'] * 1000:.1f} ms "
                     f"| {mib(row['acked'])} |")  # fmt: skip
    allowed: dict[str, list[float]] = report["allowed_seconds"]  # type: ignore[assignment]
    size = int(report["allowed_mib"]) * MiB  # type: ignore[call-overload]

    def rate(runs: list[float]) -> str:
        mid = statistics.median(runs)
        return f"{size / mid / MiB:.0f} MiB/s | {mid:.2f} s ({min(runs):.2f} to {max(runs):.2f})"

    lines += [
        "",
        f"| gateway peak RSS | at start | after the blocked uploads | at the end (after the {report['allowed_mib']} MiB "
        "uploads) |",
        "|---|---|---|---|",
        f"| VmRSS, then VmHWM | {mib(report['rss_start'])} | {mib(report['rss_peak_after_blocked'])} | "
        f"{mib(report['rss_peak_end'])} |",
        "",
        f"| allowed {report['allowed_mib']} MiB upload ({len(allowed['direct'])} interleaved rounds) | median throughput "
        "| median time (range) |",
        "|---|---|---|",
        f"| restricted route, straight to the sink | {rate(allowed['direct'])} |",
        f"| restricted route, through the gateway | {rate(allowed['gateway'])} |",
        f"| deprecated comment upload through the gateway, setting off (part headers read on the way) "
        f"| {rate(allowed['legacy_forbid_off'])} |",
        "",
        f"Gateway time / direct time for the restricted upload, median of per-round ratios: {report['allowed_ratio']:.2f}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
