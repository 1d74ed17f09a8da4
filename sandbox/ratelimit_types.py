"""A token's requests in the current one-second window (the rate limit's state: ``sandbox.ratelimit``)."""

from __future__ import annotations

import math

__all__ = ["RateWindows"]


class RateWindows:
    """Per token: the current window's start and the requests it took (tokens of windows past are dropped)."""

    def __init__(self) -> None:
        self.windows: dict[str, tuple[int, int]] = {}

    def take(self, token: str, limit: int, now: float) -> tuple[bool, int, float]:
        """Whether the request is within the limit, the requests the window still takes, its seconds left."""
        second = math.floor(now)
        start, used = self.windows.get(token, (second, 0))
        if start != second:
            self.windows = {t: w for t, w in self.windows.items() if w[0] == second}
            start, used = second, 0
        reset = second + 1 - now
        if used >= limit:
            return False, 0, reset
        self.windows[token] = (start, used + 1)
        return True, limit - used - 1, reset
