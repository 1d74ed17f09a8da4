"""A deadline that moves on every request and is rarely reached, kept with one timer: the timer is moved only when
the deadline comes earlier, and set again when it fires before the deadline (aiohttp's keep-alive timer works the same
way). Moving the deadline costs no timer of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ("Deadline",)


class Deadline:
    __slots__ = ("_at", "_loop", "_on_expire", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expire: Callable[[], object]) -> None:
        self._loop = loop
        self._on_expire = on_expire
        self._at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def set(self, timeout: float) -> None:
        """``on_expire`` is called ``timeout`` seconds from now, unless the deadline is set again or cleared first."""
        at = self._at = self._loop.time() + timeout
        timer = self._timer
        if timer is None or at < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer_at = at
            self._timer = self._loop.call_at(at, self._fired)

    def clear(self) -> None:
        """No deadline (the timer, if any, fires and finds nothing to do)."""
        self._at = None

    def cancel(self) -> None:
        """No deadline and no timer: for a connection that is gone."""
        self._at = None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    @property
    def timer(self) -> asyncio.TimerHandle | None:
        return self._timer

    def _fired(self) -> None:
        self._timer = None
        at = self._at
        if at is None:
            return
        if self._loop.time() < at:
            self._timer_at = at
            self._timer = self._loop.call_at(at, self._fired)
            return
        self._at = None
        self._on_expire()
