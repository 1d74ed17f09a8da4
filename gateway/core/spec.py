"""What the service spec and the deprecation standards fix, written once.

- The date from which new companies have both file settings on (spec, "Versioning" 3).
- How a deprecation is signalled to clients: RFC 9745 ``Deprecation`` (an RFC 9651 Date, ``@<epoch seconds>``),
  RFC 8594 ``Sunset`` (an HTTP-date), RFC 8288 ``Link`` with ``rel="successor-version"`` for the replacement and
  ``rel="deprecation"`` for its documentation.
"""

from __future__ import annotations

import datetime as dt
import email.utils

__all__ = (
    "RESTRICTED_BY_DEFAULT_FROM",
    "deprecation_link",
    "deprecation_value",
    "epoch",
    "http_date",
    "successor_link",
)

# Spec, "Versioning" 3: companies created on or after this date have restricted file access and the
# forbid-legacy-uploads setting on from the start. Also the default Deprecation date of the legacy upload routes.
RESTRICTED_BY_DEFAULT_FROM = dt.date(2026, 5, 21)

def epoch(value: dt.datetime | dt.date, tz: dt.tzinfo) -> int:
    """POSIX seconds of an instant; a date is its midnight in ``tz``, a naive date-time is read in ``tz``."""
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return int(value.timestamp())


def deprecation_value(instant: float) -> str:
    """The ``Deprecation`` header's value: an RFC 9651 Date, as RFC 9745 defines it."""
    return f"@{int(instant)}"


def http_date(instant: float) -> str:
    """An HTTP-date (RFC 9110 5.6.7), as RFC 8594's ``Sunset`` header carries it."""
    return email.utils.formatdate(instant, usegmt=True)


def successor_link(target: str) -> str:
    """A ``Link`` header value naming the replacement of a deprecated resource (RFC 9745 section 3)."""
    return f'<{target}>; rel="successor-version"'


def deprecation_link(url: str) -> str:
    """A ``Link`` header value naming the documentation of a deprecation (RFC 9745 section 3)."""
    return f'<{url}>; rel="deprecation"; type="text/html"'
