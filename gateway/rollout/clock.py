"""What "now" is for the gateway.

Production reads the real clock. Staging and tests fix it with ``rollout.now`` in the config or the ``GATEWAY_NOW``
environment variable (ISO 8601); no request header can change it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .config import RolloutConfig

__all__ = ("Clock", "FixedClock", "SystemClock", "clock_from_config", "parse_date", "parse_instant",
           "parse_instant_value")


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


# Dates and instants the gateway can place in any timezone and turn into POSIX seconds (and back) without overflow.
MIN_YEAR, MAX_YEAR = 1970, 9998
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _in_range(day: dt.date, value: object) -> None:
    if not MIN_YEAR <= day.year <= MAX_YEAR:
        raise ValueError(f"{_shown(value)} is outside the years {MIN_YEAR} to {MAX_YEAR}")


def parse_date(value: object) -> dt.date:
    """A calendar date written YYYY-MM-DD (a ``date`` given by code passes as it is). ValueError names what is wrong:
    ``'2026-02-30' is not a date: day is out of range for month``."""
    if isinstance(value, dt.datetime):
        raise ValueError("expected a date (YYYY-MM-DD), not a date and time")
    if isinstance(value, dt.date):
        day = value
    elif isinstance(value, str):
        day = _date_text(value)
    else:
        raise ValueError(f"expected a date (YYYY-MM-DD), got {_kind(value)}")
    _in_range(day, value)
    return day


def _date_text(value: str) -> dt.date:
    text = value.strip()
    if not _DATE_RE.fullmatch(text):
        raise ValueError(f"expected a date (YYYY-MM-DD), got {_shown(value)}")
    try:
        return dt.date.fromisoformat(text)
    except ValueError as err:
        raise ValueError(f"{_shown(value)} is not a date: {err}") from None


def parse_instant_value(value: object) -> dt.datetime:
    """An ISO 8601 date-time, or a date (its midnight); naive when it has no offset (the caller places it)."""
    if isinstance(value, dt.datetime):
        instant = value
    elif isinstance(value, dt.date):
        instant = dt.datetime.combine(value, dt.time())
    elif isinstance(value, str):
        instant = _iso_instant(value)
    else:
        raise ValueError(f"expected a date and time (ISO 8601), got {_kind(value)}")
    _in_range(instant, value)
    if instant.tzinfo is not None:
        _in_range_in_utc(instant, value)
    return instant


def _in_range_in_utc(instant: dt.datetime, value: object) -> None:
    """An instant with an offset must stay within the years once in UTC (9999-12-31T23:00-02:00 does not)."""
    try:
        instant.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"{_shown(value)} is outside the years {MIN_YEAR} to {MAX_YEAR}") from None


def _iso_instant(value: str) -> dt.datetime:
    text = value.strip()
    try:
        return dt.datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "Zz" and text else text)
    except ValueError as err:
        reason = str(err) if not str(err).startswith("Invalid isoformat") else "not ISO 8601"
        raise ValueError(f"{_shown(value)} is not a date and time ({reason}); "
                         f"expected e.g. 2026-10-20T10:00:00 or 2026-10-20T10:00:00+02:00") from None


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({_shown(value)})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def parse_instant(text: str, tz: dt.tzinfo = dt.UTC) -> dt.datetime:
    """ISO 8601 date or date-time; a value without an offset is read in ``tz``. ValueError says what is wrong."""
    value = parse_instant_value(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=tz)


def clock_from_config(rollout: RolloutConfig, environ: Mapping[str, str] = os.environ) -> Clock:
    """``GATEWAY_NOW`` wins over ``rollout.now``; without either, the real clock."""
    fixed = environ.get("GATEWAY_NOW")
    if fixed:
        try:
            return FixedClock(parse_instant(fixed, rollout.tzinfo))
        except ValueError as err:
            raise ValueError(f"GATEWAY_NOW: {err}") from None
    if rollout.now is not None:
        now = rollout.now if rollout.now.tzinfo else rollout.now.replace(tzinfo=rollout.tzinfo)
        return FixedClock(now)
    return SystemClock()
