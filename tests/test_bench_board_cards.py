"""bench/board_cards.py's parts: the floor row's sink that reads boards on the gateway's CPU, the CPU shares read from
/proc/stat, the realistic board, the figures per round and the nginx upstream."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from aiohttp import web

from tests.bench_testlib import load
from tests.board_fixtures import realistic_board_bytes
from tests.gateway_testlib import free_port

board_cards = load("board_cards")
benchlib = load("benchlib")


def test_cpu_share_is_busy_and_softirq_over_all_ticks() -> None:
    # user nice system idle iowait irq softirq steal
    before = [100, 0, 50, 1000, 10, 0, 5, 0]
    after = [160, 0, 70, 1100, 20, 0, 25, 0]  # +60 user, +20 system, +100 idle, +10 iowait, +20 softirq: 210 ticks
    busy, softirq = board_cards._cpu_share(before, after)
    assert abs(busy - 100 / 210) < 1e-9 and abs(softirq - 20 / 210) < 1e-9
    assert board_cards._cpu_share(before, before) == (0.0, 0.0)
    assert len(board_cards._cpu_times("0")) == 8


async def test_the_sink_reads_boards_at_its_pace_and_reports_a_failure() -> None:
    served: list[str] = []
    fail = {"now": False}

    async def board(request: web.Request) -> web.Response:
        served.append(request.path)
        if fail["now"]:
            return web.Response(status=404)
        return web.Response(body=b"x" * 3_000_000, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/latest/boards/1", board)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    loop = asyncio.get_running_loop()
    try:
        sink = board_cards.SinkLoad(port, 20.0, "0")
        sink.__enter__()
        await asyncio.sleep(1.5)
        await loop.run_in_executor(None, sink.__exit__, None, None, None)
        assert sink.failed is None
        assert 10 <= sink.done <= 40 and sink.done == len(served)  # paced at about 20 a second
        fail["now"] = True
        sink = board_cards.SinkLoad(port, 20.0, "0")
        sink.__enter__()
        await asyncio.sleep(0.3)
        await loop.run_in_executor(None, sink.__exit__, None, None, None)
        assert sink.failed is not None and "status 404" in sink.failed and sink.done == 0
    finally:
        await runner.cleanup()


def test_the_realistic_board_is_the_same_json_for_the_same_seed_with_what_makes_scanning_hard() -> None:
    body = realistic_board_bytes(200, seed=5)
    assert body == realistic_board_bytes(200, seed=5) and body != realistic_board_bytes(200, seed=6)
    board = json.loads(body)
    cards = board["cards"]
    assert len(cards) == 200 and [card["id"] for card in cards] == list(range(1, 201))
    text = body.decode()
    assert "\\u" in text and "\\n" in text and '\\"' in text and "\\\\" in text and "\\t" in text  # escapes
    assert any(ord(ch) > 0x7F for ch in text)  # non-ASCII written as itself
    assert any(card["checklists"] and card["checklists"][0]["items"] for card in cards)  # arrays in objects in arrays
    assert any(card["custom_properties"]["risk"]["matrix"] for card in cards)
    assert sum(len(card["description"]) for card in cards) / len(cards) > 150  # descriptions of several sentences


def test_every_figure_comes_with_its_rounds_and_each_ratio_is_against_the_same_boards_round() -> None:
    samples = {("pass-through", "own"): [{"rps": 10.0, "cpu_ms_per_board": 4.0, "upstream_cpu_ms_per_board": 1.0,
                                          "p99_ms": 1.0, "requests": 50}] * 2,
               ("capped, cold", "own"): [{"rps": 12.0, "cpu_ms_per_board": 3.0, "upstream_cpu_ms_per_board": 0.5,
                                          "p99_ms": 1.0, "requests": 60},
                                         {"rps": 8.0, "cpu_ms_per_board": 5.0, "upstream_cpu_ms_per_board": 2.0,
                                          "p99_ms": 1.0, "requests": 40}]}
    rows = board_cards.throughput_rows(samples)
    capped = rows[("capped, cold", "own")]
    assert capped["vs_pass_through_rounds"] == [1.2, 0.8] and capped["cpu_vs_pass_through_rounds"] == [0.75, 1.25]
    assert capped["upstream_cpu_ms_rounds"] == [0.5, 2.0] and capped["both_cpu_ms_rounds"] == [3.5, 7.0]
    assert capped["requests"] == 100 and capped["rps"] == 10.0
    assert board_cards.fmt_spread([3.0, 1.0, 2.0], 1, " ms") == "2.0 ms (1.0–3.0)"


@pytest.mark.skipif(shutil.which("nginx") is None, reason="needs nginx")
def test_the_nginx_upstream_serves_each_board_from_its_file_under_a_private_temp_dir(tmp_path: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-board-cards-test-", dir=tmp_path))
    work.chmod(0o755)
    bodies = {"own": b'{"cards":[1]}', "realistic": b'{"cards":["\\u00e9"]}'}
    port = free_port()
    proc = board_cards.start_nginx_upstream(work, port, bodies, [])
    try:
        board_cards.wait_port(port, proc=proc)
        for name, body in bodies.items():
            assert board_cards.fetch(port, board_cards.board_path(name)) == len(body)
    finally:
        board_cards.stop([proc])


def test_the_upstreams_cpu_counts_its_children() -> None:
    """nginx with a master process, or any upstream that forks: the CPU its children spend is the upstream's."""
    child = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 15
        while benchlib.family_cpu_seconds(parent.pid) - benchlib.cpu_seconds(parent.pid) < 0.25:
            assert time.monotonic() < deadline, "the child's CPU was not counted"
            time.sleep(0.05)
    finally:
        for pid in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        parent.kill()
        parent.wait()
