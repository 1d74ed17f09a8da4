"""Benchmarks of the migration bridges, each side by side with what a migrated client would do itself.

    .venv/bin/python bench/bridges.py [--rounds 5] [--requests 40] [--upload-mb 100] [--json FILE] [--only-limits]

Starts the sandbox (playing the service after it withdrew cards: no cards on the board route) and a gateway in front
of it whose legacy client (User-Agent ``bench-legacy/``) is exempted onto the ``full`` phase with both bridges on.

- **Card backfill**: a 250-card board read by the bridged client through the gateway (one request: the gateway reads
  the pages), against the same cards read as a migrated client would (the board, then the card list's three pages
  one after another), directly from the sandbox and through the gateway. Latency per complete read (median and p90 over ``--requests`` reads per
  round), interleaved round by round; the ratio is gateway / direct.
- **Upload upgrade** (when the guard's upgrade exists in this tree): a ``--upload-mb`` legacy ``PUT
  /api/v1/cards/{id}/files`` through the gateway, upgraded to the restricted route, against the same multipart upload
  sent directly to the restricted route on the sandbox (``POST /api/v1/cards/{uid}/files``), and through the gateway
  without a bridge. Throughput of each (the ratio is upgraded / direct), the gateway's RSS sampled during each
  (``VmRSS``), and its peak over its life (``VmHWM``) after the upgraded upload.
- **Within the service's limits** (``--limits``, on by default): a second sandbox allowing a token 5 requests a second
  (``--rate-limit 5``) and a third without a limit, each with a 2,000-card board (20 pages of 100), behind one gateway
  (``share_seconds: 0``: each measure a fresh backfill). The bridged read of the limited board (time to the whole
  answer, and the 429s the service sent), against a client that reads the board and its pages from the service itself
  and waits for ``Retry-After`` on each 429; then 20 legacy readers of the unlimited board on one token at once (the
  page requests the service received, the readers' p99), against one reader alone.
- **Adversarial backfill** (``--adversarial``, on by default): a second gateway (``backfill.max_bytes`` 64 MiB) in
  front of a small hostile card list served from this process, pages made ahead of time: pages of 16 MB read four at
  a time (64 MiB and more together), one page of 3 million ids (about 50 MB), and two cards of 28 MB. For each: the
  answer, the time, the growth of the gateway's peak resident set (``VmHWM``) and the longest answer of its admin
  ``/livez``, asked every 10 ms by a process of its own while the backfill runs.

Everything on 127.0.0.1; each run bounded by its request counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from benchlib import free_port, percentile, proc_status, stop_all

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.process_testlib import LivezProbe  # noqa: E402 - the /livez probe the bounds tests use too

PYTHON = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
MiB = 1 << 20
TOKEN = {"Authorization": "Bearer sandbox-token"}
LEGACY = {**TOKEN, "User-Agent": "bench-legacy/1.0"}


async def wait_ready(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as client:
        while time.monotonic() < deadline:
            try:
                async with client.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready")


def start(tmp: Path) -> tuple[list[subprocess.Popen[bytes]], str, str, str, int]:
    sandbox_port, port, admin = free_port(), free_port(), free_port()
    sandbox = subprocess.Popen(
        [PYTHON, "-m", "sandbox", "--port", str(sandbox_port), "--cards-cap-from", "2026-10-01",
         "--cards-removal-from", "2026-11-01", "--now", "2026-11-24T12:00:00Z", "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())
    for tenant in config["tenants"]:
        tenant["upstream"] = f"http://127.0.0.1:{sandbox_port}"
    config["access_log"] = {"enabled": False}
    config["rollout"]["now"] = "2026-11-24T12:00:00Z"
    config["rollout"]["exemptions"] = [
        {"name": "bench-board", "phase": "full", "until": "2099-01-01",
         "header": {"name": "User-Agent", "prefix": "bench-legacy/"}, "bridge": True}]
    config["tenants"][0]["bridges"] = {"upload_upgrade": True}
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(path), "--listen",
                                f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}", "--log-level", "warning"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ([sandbox, gateway], f"http://127.0.0.1:{sandbox_port}", f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{admin}", gateway.pid)


async def migrated_read(client: aiohttp.ClientSession, base: str) -> None:
    """What a migrated client does: the board, then the card list's pages one after another."""
    async with client.get(f"{base}/api/latest/boards/1", headers=TOKEN) as resp:
        await resp.read()
    cards = 0
    offset = 0
    while True:
        async with client.get(f"{base}/api/latest/cards?board_id=1&limit=100&offset={offset}", headers=TOKEN) as resp:
            page = json.loads(await resp.read())
        cards += len(page)
        offset += 100
        if len(page) < 100:
            break
    assert cards == 250


async def backfill_round(client: aiohttp.ClientSession, sandbox: str, gateway: str, n: int) -> dict[str, list[float]]:
    bridged: list[float] = []
    direct: list[float] = []
    via: list[float] = []
    for _ in range(n):
        started = time.perf_counter()
        async with client.get(f"{gateway}/api/latest/boards/1", headers=LEGACY) as resp:
            body = await resp.read()
            assert resp.headers.get("X-Gateway-Backfill", "").startswith("done; cards=250"), resp.headers
        bridged.append(time.perf_counter() - started)
        assert len(json.loads(body)["cards"]) == 250
        started = time.perf_counter()
        await migrated_read(client, sandbox)
        direct.append(time.perf_counter() - started)
        started = time.perf_counter()
        await migrated_read(client, gateway)
        via.append(time.perf_counter() - started)
    return {"bridged": bridged, "direct": direct, "via_gateway": via}


async def upload_round(client: aiohttp.ClientSession, sandbox: str, gateway: str, pid: int,
                       size: int) -> dict[str, Any] | None:
    boundary = "bench-bridge-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    chunk = b"\xa5" * (1 << 20)

    async def body() -> Any:
        yield head
        for _ in range(size >> 20):
            yield chunk
        yield tail

    headers = {**TOKEN, "Content-Type": f"multipart/form-data; boundary={boundary}",
               "Content-Length": str(len(head) + (size >> 20 << 20) + len(tail))}
    async with client.get(f"{sandbox}/api/v1/cards/1", headers=TOKEN) as resp:
        uid = (await resp.json())["uid"]
    out: dict[str, Any] = {}
    runs = (("upgraded", gateway, "PUT", "/api/v1/cards/1/files"),
            ("direct", sandbox, "POST", f"/api/v1/cards/{uid}/files"),
            ("via_gateway", gateway, "POST", f"/api/v1/cards/{uid}/files"))
    for name, base, method, path in runs:
        peak = proc_status(pid, "VmRSS") or 0
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, proc_status(pid, "VmRSS") or 0)
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        async with client.request(method, base + path, headers=headers, data=body()) as resp:
            answer = await resp.read()
            status = resp.status
        seconds = time.perf_counter() - started
        done.set()
        await watcher
        if name == "upgraded" and status in (403, 404, 405):
            return None  # no upload upgrade in this tree
        assert status in (200, 201), (name, status, answer[:300])
        if name == "upgraded":
            assert resp.headers.get("X-Gateway-Upload-Upgrade") == "upgraded; files=1", resp.headers
        out[name] = {"mb_per_s": size / seconds / 1e6, "peak_rss_mib": peak / MiB,
                     "hwm_mib": (proc_status(pid, "VmHWM") or 0) / MiB}
    return out


def _pages(kind: str) -> dict[tuple[int, int], bytes]:
    """(limit, offset) -> the page, made ahead of time."""
    out: dict[tuple[int, int], bytes] = {}
    if kind == "parallel":
        pad = b"x" * 160_000  # 100 cards of 160 KB: 16 MB a page; 5 pages would be 80 MB
        for offset in (0, 99, 198, 297, 396):
            cards = [b'{"id": %d, "board_id": 9, "description": "%s"}' % (n + 1, pad)
                     for n in range(offset, min(offset + 100, 490))]
            out[(100, offset)] = b"[" + b",".join(cards) + b"]"
    elif kind == "ids":
        out[(100, 0)] = b"[" + b", ".join(b'{"id": %d}' % n for n in range(3_000_000)) + b"]"
    else:
        pad = b"x" * (28 << 20)
        out[(100, 0)] = b"[" + b",".join(b'{"id": %d, "board_id": 9, "description": "%s"}' % (n, pad)
                                         for n in (1, 2)) + b"]"
    return out


async def adversarial(tmp: Path) -> list[dict[str, Any]]:
    """The adversarial backfills, each against a fresh gateway (its peak resident set is its own)."""
    pages: dict[tuple[int, int], bytes] = {}

    async def serve(request: web.BaseRequest) -> web.StreamResponse:
        if request.path.startswith("/api/latest/boards/"):
            board = int(request.path.rsplit("/", 1)[1])
            return web.json_response({"id": board, "title": "board", "columns": [], "lanes": []})
        if request.path == "/api/latest/cards":
            hostile = request.query["board_id"] == "9"  # board 8: the warm-up's, empty
            body = pages.get((int(request.query["limit"]), int(request.query["offset"])), b"[]") if hostile else b"[]"
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(body)
            await response.prepare(request)
            view = memoryview(body)
            for at in range(0, len(body), 1 << 20):
                await response.write(view[at : at + (1 << 20)])
            await response.write_eof()
            return response
        return web.json_response({})

    runner = web.ServerRunner(web.Server(serve))
    await runner.setup()
    upstream_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", upstream_port).start()
    results = []
    try:
        for kind, expected in (("parallel", "failed; reason=too_large"), ("ids", "failed; reason=inconsistent"),
                               ("huge_cards", "done; cards=2")):
            pages.clear()
            pages.update(_pages(kind))
            port, admin = free_port(), free_port()
            config = {
                "server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{admin}"},
                "access_log": {"enabled": False},
                "tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": f"http://127.0.0.1:{upstream_port}",
                             "created": "2026-06-01", "bridges": {"card_backfill": True}}],
                "rollout": {"now": "2026-11-24T12:00:00Z", "exemptions": [
                    {"name": "legacy", "phase": "full", "until": "2099-01-01",
                     "header": {"name": "User-Agent", "prefix": "bench-legacy/"}, "bridge": True}]},
                "routes": [{"name": "board", "methods": ["GET"], "paths": ["/boards/{board_id}"],
                            "chain": [{"board_cards": {"backfill": {"max_bytes": 64 * MiB, "timeout": 60}}}]}],
            }
            path = tmp / f"adversarial-{kind}.yaml"
            path.write_text(yaml.safe_dump(config))
            gateway = subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(path), "--log-level",
                                        "error"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                await wait_ready(f"http://127.0.0.1:{admin}/readyz")
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
                    async with client.get(f"http://127.0.0.1:{port}/api/latest/boards/8", headers=LEGACY) as resp:
                        await resp.read()  # warm: a backfill of an empty board
                    before = proc_status(gateway.pid, "VmHWM") or 0
                    probe = LivezProbe(admin, PYTHON)
                    await asyncio.sleep(0.3)
                    started = time.perf_counter()
                    async with client.get(f"http://127.0.0.1:{port}/api/latest/boards/9", headers=LEGACY) as resp:
                        await resp.read()
                        answer = resp.headers.get("X-Gateway-Backfill", "")
                    seconds = time.perf_counter() - started
                    await probe.finish()
                growth = ((proc_status(gateway.pid, "VmHWM") or 0) - before) / MiB
                assert answer.startswith(expected), (kind, answer)
                row = {"kind": kind, "answer": answer, "seconds": seconds, "hwm_growth_mib": growth,
                       "hwm_mib": before / MiB + growth, "livez_worst_ms": probe.worst * 1000,
                       "livez_count": probe.count, "largest_page_mib": max(map(len, pages.values())) / MiB}
                results.append(row)
                print(f"adversarial backfill {kind}: {answer} in {seconds:.2f} s; gateway peak RSS +{growth:.0f} MiB "
                      f"(largest page {row['largest_page_mib']:.0f} MiB, max_bytes 64 MiB); /livez at worst "
                      f"{row['livez_worst_ms']:.0f} ms over {probe.count} probes", flush=True)
            finally:
                gateway.send_signal(signal.SIGTERM)
                try:
                    gateway.wait(15)
                except subprocess.TimeoutExpired:
                    gateway.kill()
    finally:
        await runner.cleanup()
    return results


LIMITED_CARDS = 2000


def start_limits(tmp: Path) -> tuple[list[subprocess.Popen[bytes]], str, str, str, str]:
    """A sandbox limiting a token to 5 requests a second, one without a limit (each with the 2,000-card board 4),
    and a gateway in front of both (tenant ``limited`` at Host ``limited.localhost``)."""
    limited_port, free_port_, port, admin = free_port(), free_port(), free_port(), free_port()
    common = ["--cards-cap-from", "2026-10-01", "--cards-removal-from", "2026-11-01", "--now", "2026-11-24T12:00:00Z",
              "--log-level", "warning", "--extra-board", str(LIMITED_CARDS)]
    procs = [subprocess.Popen([PYTHON, "-m", "sandbox", "--port", str(p), *common, *extra], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p, extra in ((limited_port, ["--rate-limit", "5"]), (free_port_, []))]
    config = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())
    config["tenants"] = [
        {"name": "limited", "hosts": ["limited.localhost"], "upstream": f"http://127.0.0.1:{limited_port}"},
        {"name": "free", "hosts": ["127.0.0.1", "localhost"], "upstream": f"http://127.0.0.1:{free_port_}"}]
    config["access_log"] = {"enabled": False}
    config["rollout"]["now"] = "2026-11-24T12:00:00Z"
    config["rollout"]["exemptions"] = [
        {"name": "bench-board", "phase": "full", "until": "2099-01-01",
         "header": {"name": "User-Agent", "prefix": "bench-legacy/"}, "bridge": True}]
    for route in config["routes"]:
        if route["name"] == "board":
            route["chain"] = [{"board_cards": {"backfill": {"share_seconds": 0}}}]
    path = tmp / "limits.yaml"
    path.write_text(yaml.safe_dump(config))
    procs.append(subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(path), "--listen",
                                   f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}", "--log-level",
                                   "warning"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return (procs, f"http://127.0.0.1:{limited_port}", f"http://127.0.0.1:{free_port_}", f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{admin}")


async def _journal(client: aiohttp.ClientSession, sandbox: str, *, clear: bool = False) -> list[dict[str, Any]]:
    async with client.get(f"{sandbox}/_sandbox/journal") as resp:
        entries: list[dict[str, Any]] = await resp.json()
    if clear:
        async with client.delete(f"{sandbox}/_sandbox/journal") as resp:
            await resp.read()
    return [e for e in entries if e["path"].startswith("/api/")]


async def waiting_client_read(client: aiohttp.ClientSession, sandbox: str) -> None:
    """A client that reads the board and its pages from the service itself, one after another, and waits for
    ``Retry-After`` whenever it is answered 429."""

    async def get(url: str) -> bytes:
        while True:
            async with client.get(url, headers=TOKEN) as resp:
                body = await resp.read()
                if resp.status != 429:
                    return body
                await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))

    await get(f"{sandbox}/api/latest/boards/4")
    cards, offset = 0, 0
    while True:
        page = json.loads(await get(f"{sandbox}/api/latest/cards?board_id=4&limit=100&offset={offset}"))
        cards += len(page)
        offset += 100
        if len(page) < 100:
            break
    assert cards == LIMITED_CARDS


async def limits_round(client: aiohttp.ClientSession, limited: str, free: str, gateway: str) -> dict[str, Any]:
    """One round of both cases (each after a pause that lets the service's window reset)."""
    row: dict[str, Any] = {}
    await _journal(client, limited, clear=True)
    await asyncio.sleep(1.1)
    started = time.perf_counter()
    async with client.get(f"{gateway}/api/latest/boards/4", headers={**LEGACY, "Host": "limited.localhost"}) as resp:
        body = await resp.read()
        assert resp.headers.get("X-Gateway-Backfill", "").startswith(f"done; cards={LIMITED_CARDS}"), resp.headers
    row["bridged_s"] = time.perf_counter() - started
    assert len(json.loads(body)["cards"]) == LIMITED_CARDS
    row["bridged_429"] = sum(e["status"] == 429 for e in await _journal(client, limited, clear=True))
    await asyncio.sleep(1.1)
    started = time.perf_counter()
    await waiting_client_read(client, limited)
    row["client_s"] = time.perf_counter() - started
    row["client_429"] = sum(e["status"] == 429 for e in await _journal(client, limited, clear=True))

    async def reader() -> float:
        began = time.perf_counter()
        async with client.get(f"{gateway}/api/latest/boards/4", headers=LEGACY) as resp:
            await resp.read()
            assert resp.headers.get("X-Gateway-Backfill", "").startswith("done"), resp.headers
        return time.perf_counter() - began

    await _journal(client, free, clear=True)
    row["one_s"] = await reader()
    row["one_pages"] = sum(e["path"] == "/api/latest/cards" for e in await _journal(client, free, clear=True))
    times = await asyncio.gather(*(reader() for _ in range(20)))
    row["twenty_p99_s"] = percentile(list(times), 0.99)
    row["twenty_pages"] = sum(e["path"] == "/api/latest/cards" for e in await _journal(client, free, clear=True))
    return row


async def limits(tmp: Path, rounds: int) -> list[dict[str, Any]]:
    procs, limited, free, gateway, admin = start_limits(tmp)
    try:
        await wait_ready(limited + "/_sandbox/journal")
        await wait_ready(free + "/_sandbox/journal")
        await wait_ready(admin + "/readyz")
        rows = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
            for r in range(rounds):
                row = await limits_round(client, limited, free, gateway)
                rows.append(row)
                print(f"limits round {r + 1}: 2,000 cards under 5 requests a second: bridged {row['bridged_s']:.2f} s "
                      f"({row['bridged_429']} 429s), a client waiting for Retry-After itself {row['client_s']:.2f} s "
                      f"({row['client_429']} 429s); 20 readers on one token: {row['twenty_pages']} page requests, "
                      f"p99 {row['twenty_p99_s'] * 1000:.0f} ms, against one reader {row['one_pages']} and "
                      f"{row['one_s'] * 1000:.0f} ms", flush=True)
        print(f"limits: median bridged / waiting client {statistics.median(r['bridged_s'] / r['client_s'] for r in rows):.2f}; "
              f"20 readers' p99 / one reader {statistics.median(r['twenty_p99_s'] / r['one_s'] for r in rows):.2f}")
        return rows
    finally:
        stop_all(procs, 15)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--upload-mb", type=int, default=100)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-adversarial", dest="adversarial", action="store_false",
                        help="skip the adversarial backfills")
    parser.add_argument("--no-limits", dest="limits", action="store_false",
                        help="skip the rate-limited and the 20-reader backfills")
    parser.add_argument("--only-limits", action="store_true", help="only the rate-limited and 20-reader backfills")
    args = parser.parse_args()
    if args.only_limits:
        with tempfile.TemporaryDirectory() as tmp:
            rows = await limits(Path(tmp), args.rounds)
            if args.json:
                args.json.write_text(json.dumps({"limits": rows}, indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        procs, sandbox, gateway, admin, pid = start(Path(tmp))
        try:
            await wait_ready(sandbox + "/_sandbox/journal")
            await wait_ready(admin + "/readyz")
            results: dict[str, Any] = {"backfill": [], "upload": []}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
                await backfill_round(client, sandbox, gateway, 5)  # warm-up
                for r in range(args.rounds):
                    got = await backfill_round(client, sandbox, gateway, args.requests)
                    row: dict[str, Any] = {
                        k: {"median_ms": statistics.median(v) * 1000, "p90_ms": percentile(v, 0.9) * 1000}
                        for k, v in got.items()
                    }
                    row["ratio"] = row["bridged"]["median_ms"] / row["direct"]["median_ms"]
                    row["ratio_via"] = row["bridged"]["median_ms"] / row["via_gateway"]["median_ms"]
                    results["backfill"].append(row)
                    print(f"backfill round {r + 1}: bridged {row['bridged']['median_ms']:.1f} ms "
                          f"(p90 {row['bridged']['p90_ms']:.1f}), direct board + pages "
                          f"{row['direct']['median_ms']:.1f} ms (p90 {row['direct']['p90_ms']:.1f}), the same "
                          f"through the gateway {row['via_gateway']['median_ms']:.1f} ms; ratios "
                          f"{row['ratio']:.2f} and {row['ratio_via']:.2f}", flush=True)
                    up = await upload_round(client, sandbox, gateway, pid, args.upload_mb << 20)
                    if up is not None:
                        up["ratio"] = up["upgraded"]["mb_per_s"] / up["direct"]["mb_per_s"]
                        up["ratio_via"] = up["upgraded"]["mb_per_s"] / up["via_gateway"]["mb_per_s"]
                        results["upload"].append(up)
                        print(f"upload round {r + 1}: upgraded {up['upgraded']['mb_per_s']:.0f} MB/s "
                              f"(gateway RSS {up['upgraded']['peak_rss_mib']:.0f} MiB, peak so far "
                              f"{up['upgraded']['hwm_mib']:.0f} MiB), direct to the sandbox "
                              f"{up['direct']['mb_per_s']:.0f} MB/s, through the gateway without a bridge "
                              f"{up['via_gateway']['mb_per_s']:.0f} MB/s (gateway RSS "
                              f"{up['via_gateway']['peak_rss_mib']:.0f} MiB); ratios {up['ratio']:.2f} and "
                              f"{up['ratio_via']:.2f}", flush=True)
            ratios = [row["ratio"] for row in results["backfill"]]
            via = [row["ratio_via"] for row in results["backfill"]]
            print(f"backfill: median ratio bridged / migrated client reading the sandbox directly "
                  f"{statistics.median(ratios):.2f}, / the same through the gateway {statistics.median(via):.2f}, "
                  f"over {len(ratios)} rounds")
            if results["upload"]:
                ups = [u["ratio"] for u in results["upload"]]
                via_ups = [u["ratio_via"] for u in results["upload"]]
                peak = max(u["upgraded"]["peak_rss_mib"] for u in results["upload"])
                hwm = max(u["upgraded"]["hwm_mib"] for u in results["upload"])
                print(f"upload upgrade: median throughput ratio upgraded / direct to the sandbox "
                      f"{statistics.median(ups):.2f}, / through the gateway without a bridge "
                      f"{statistics.median(via_ups):.2f}; gateway RSS during upgraded uploads at most {peak:.0f} MiB, "
                      f"peak over its life (VmHWM) {hwm:.0f} MiB")
            if args.adversarial:
                results["adversarial"] = await adversarial(Path(tmp))
            if args.limits:
                results["limits"] = await limits(Path(tmp), args.rounds)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
        finally:
            stop_all(procs, 15)


if __name__ == "__main__":
    asyncio.run(main())
