"""A bound on the requests one tenant has in flight to its upstream, with a bounded wait for a turn.

Entering costs a comparison when there is room (no task, no timer: the common case); only a request that finds the
bound reached waits, in order of arrival, for at most ``timeout``.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ("Gate",)


class Gate:
    __slots__ = ("limit", "busy", "_waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_enter(self) -> bool:
        if self.busy < self.limit and not self._waiters:
            self.busy += 1
            return True
        return False

    async def enter(self, timeout: float) -> bool:
        """Wait for a turn (at most ``timeout`` seconds); False when none came."""
        if self.try_enter():
            return True
        if timeout <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await _handed(waiter, timeout)
        finally:
            self._forget(waiter)

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def leave(self) -> None:
        """Give the turn to the first waiter still waiting, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on: busy is unchanged
                return
        self.busy -= 1


async def _handed(waiter: asyncio.Future[None], timeout: float) -> bool:
    """Whether ``waiter`` was handed a turn within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            await waiter
    except TimeoutError:
        return waiter.done() and not waiter.cancelled()  # handed a turn just as the wait ran out: keep it
    return True
