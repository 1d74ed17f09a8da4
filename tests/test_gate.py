"""The tenant's gate alone (gateway/proxy/gate.py): turns up to the bound, waiters served in order of arrival, a wait
bounded by its timeout that leaves nothing behind. Through sockets: tests/integration/test_one_road.py and the
``upstream.max_concurrent_per_tenant`` tests."""

from __future__ import annotations

import asyncio

from gateway.proxy.gate import Gate


async def test_turns_up_to_the_bound_then_none_without_waiting() -> None:
    gate = Gate(2)
    assert gate.try_enter() and await gate.enter(1.0)
    assert gate.busy == 2
    assert not gate.try_enter()
    assert not await gate.enter(0)  # no wait asked for: refused at once
    gate.leave()
    assert gate.busy == 1 and gate.try_enter()


async def test_a_turn_given_back_goes_to_the_first_waiter_in_order_of_arrival() -> None:
    gate = Gate(1)
    assert gate.try_enter()
    order: list[str] = []

    async def wait(name: str) -> None:
        assert await gate.enter(5.0)
        order.append(name)

    first = asyncio.create_task(wait("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    assert not gate.try_enter()  # someone waits: a newcomer does not jump the queue even when a turn frees
    gate.leave()
    await first
    assert order == ["first"] and gate.busy == 1  # the turn passed on: still one busy
    gate.leave()
    await second
    assert order == ["first", "second"] and gate.busy == 1
    gate.leave()
    assert gate.busy == 0


async def test_a_wait_that_times_out_gets_no_turn_and_leaves_no_waiter() -> None:
    gate = Gate(1)
    assert gate.try_enter()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await gate.enter(0.05)
    assert loop.time() - started >= 0.05
    assert not gate._waiters
    gate.leave()
    assert gate.busy == 0 and gate.try_enter()


async def test_a_cancelled_waiter_is_skipped_and_its_turn_goes_to_the_next() -> None:
    gate = Gate(1)
    assert gate.try_enter()
    gone = asyncio.create_task(gate.enter(5.0))
    stays = asyncio.create_task(gate.enter(5.0))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    gate.leave()
    assert await stays is True
    assert gate.busy == 1 and not gate._waiters
