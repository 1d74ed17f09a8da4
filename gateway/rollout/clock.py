"""What "now" is for the gateway.

Production reads the real clock. Staging and tests fix it with ``rollout.now`` in the config or the ``GATEWAY_NOW``
environment variable (ISO 8601); no request header can change it.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .config import RolloutConfig

__all__ = ("Clock", "FixedClock", "SystemClock", "clock_from_config", "parse_instant")


class Clock(Protocol):
    def now(self) -> dt.datetime: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class FixedClock:
    def __init__(self, instant: dt.datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("a fixed clock needs an instant with a timezone")
        self.instant = instant

    def now(self) -> dt.datetime:
        return self.instant


def parse_instant(text: str, tz: dt.tzinfo = dt.UTC) -> dt.datetime:
    """ISO 8601 date or date-time; a value without an offset is read in ``tz``."""
    value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo is not None else value.replace(tzinfo=tz)


def clock_from_config(rollout: RolloutConfig, environ: Mapping[str, str] = os.environ) -> Clock:
    """``GATEWAY_NOW`` wins over ``rollout.now``; without either, the real clock."""
    fixed = environ.get("GATEWAY_NOW")
    if fixed:
        try:
            return FixedClock(parse_instant(fixed, rollout.tzinfo))
        except ValueError:
            raise ValueError(f"GATEWAY_NOW: not an ISO 8601 instant: {fixed!r}") from None
    if rollout.now is not None:
        now = rollout.now if rollout.now.tzinfo else rollout.now.replace(tzinfo=rollout.tzinfo)
        return FixedClock(now)
    return SystemClock()
