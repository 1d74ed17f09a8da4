"""The usage ledger's reading windows and queries, shared by the admin endpoints, the command line and the store
(no database code here: importing it costs nothing)."""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Literal

from ..usage import HOUR

__all__ = ("DAY", "DEFAULT_SINCE", "Query", "check_name", "iso", "parse_when", "window")

DAY = 86400
DEFAULT_SINCE = "30d"

_RELATIVE = re.compile(r"^\s*(\d{1,6})\s*([hdw])\s*$")
_UNIT = {"h": 3600, "d": DAY, "w": 7 * DAY}
_EARLIEST = 0.0
_LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC).timestamp()
_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")
_NAME_MAX = 64


def parse_when(text: str, now: float, tz: dt.tzinfo = dt.UTC) -> float:
    """``30d``, ``12h``, ``2w`` (that long before ``now``), or an ISO 8601 date or date-time (one without an offset
    is read in ``tz``), within the years 1970 to 9998 (the ledger's times are Unix seconds, and a window's hours must
    have dates). ValueError with a message naming what is accepted."""
    shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
    match = _RELATIVE.match(text)
    if match:
        moment = now - int(match.group(1)) * _UNIT[match.group(2)]
    else:
        try:
            value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
            moment = (value if value.tzinfo is not None else value.replace(tzinfo=tz)).timestamp()
        except (ValueError, OverflowError):
            raise ValueError(f"{shown} is neither a duration (30d, 12h, 2w) nor an ISO 8601 date or time") from None
    if not _EARLIEST <= moment <= _LATEST:
        raise ValueError(f"{shown} is outside the years 1970 to 9998")
    return moment


def check_name(value: str, what: str) -> str:
    """A tenant's or a behaviour's name as a filter: what a name may be (config.schema's names, at most 64
    characters: the ledger's key columns); ValueError saying so."""
    if len(value) > _NAME_MAX or not _NAME.match(value):
        raise ValueError(f"{what} must be a name of at most {_NAME_MAX} characters: lower-case letters, digits, "
                         "'_' and '-', starting with a letter")
    return value


def window(since: float, until: float) -> tuple[int, int]:
    """The whole hours the ledger keeps that cover [since, until): the first hour's start and the end of the last."""
    start = int(math.floor(since / HOUR)) * HOUR
    end = int(math.ceil(until / HOUR)) * HOUR
    return start, max(end, start + HOUR)


@dataclass(frozen=True, slots=True)
class Query:
    since: int  # whole hours (``window``)
    until: int
    tenant: str | None = None
    behaviour: str | None = None
    top: int | None = 20  # None: every client
    order: Literal["requests", "recent"] = "requests"


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()
