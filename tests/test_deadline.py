"""core/deadline.py: a deadline moved on every request, kept with one timer."""

from __future__ import annotations

import asyncio

from gateway.core.deadline import Deadline


async def test_moving_the_deadline_later_makes_no_timer_and_it_fires_once_at_the_end() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = Deadline(loop, lambda: fired.append(loop.time()))
    start = loop.time()
    deadline.set(0.05)
    first = deadline.timer
    deadline.set(0.08)
    assert deadline.timer is first and first is not None and not first.cancelled()
    for _ in range(5):
        await asyncio.sleep(0.02)
        deadline.set(0.05)  # the timer that fires early sets itself again for the deadline
    await asyncio.sleep(0.2)
    assert len(fired) == 1
    assert fired[0] - start >= 0.1 + 0.05 - 0.01  # five moves 20 ms apart, then the last 50 ms
    assert deadline.timer is None


async def test_an_earlier_deadline_moves_the_timer_and_a_cleared_one_never_fires() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    deadline = Deadline(loop, lambda: fired.append("expired"))
    deadline.set(10.0)
    late = deadline.timer
    deadline.set(0.02)
    assert deadline.timer is not late and late is not None and late.cancelled()
    await asyncio.sleep(0.06)
    assert fired == ["expired"]
    deadline.set(0.02)
    deadline.clear()
    await asyncio.sleep(0.06)
    assert fired == ["expired"]  # the timer fired and found no deadline
    deadline.set(0.02)
    deadline.cancel()
    assert deadline.timer is None
    await asyncio.sleep(0.06)
    assert fired == ["expired"]
