"""bench/board_cards.py's floor row: the sink that reads boards on the gateway's CPU, and the CPU shares read from
/proc/stat."""

from __future__ import annotations

import asyncio

from aiohttp import web

from tests.bench_testlib import load
from tests.gateway_testlib import free_port

board_cards = load("board_cards")


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
