"""Configuration of one sandbox instance."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

__all__ = ["DEFAULT_TOKEN", "READONLY_TOKEN", "SandboxSettings", "parse_instant"]

DEFAULT_TOKEN = "sandbox-token"
READONLY_TOKEN = "sandbox-readonly"

# One secret per process, so every app built in this process signs alike
# unless a test pins its own.
_PROCESS_SECRET = secrets.token_bytes(32)

MiB = 1024 * 1024

_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_instant(text: str) -> datetime:
    """``2026-11-01`` (00:00Z that day) or an ISO instant with a timezone
    (``2026-11-01T12:00:00Z``, ``...+02:00``). Naive instants are refused:
    the service's dates are instants, not local times."""
    text = text.strip()
    try:
        if _DATE_ONLY.fullmatch(text):
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected a date such as 2026-11-01 or an ISO instant such as "
                         f"2026-11-01T12:00:00Z, got {text!r}") from None
    if moment.utcoffset() is None:
        raise ValueError(f"{text!r} has no timezone; add Z or an offset such as +02:00")
    return moment


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """Everything that makes one sandbox differ from another.

    ``tokens`` are full-access API tokens; ``readonly_tokens`` are also valid
    but every non-GET request made with them answers 403.

    ``cards_cap_from`` / ``cards_removal_from``: from these instants the board
    routes return at most 100 cards / no cards (see README); ``None`` never.
    ``now`` pins the sandbox clock that decides this; ``None`` is real time.
    ``extra_boards`` adds boards 4, 5, ... holding exactly that many cards.
    ``rate_limit``: at most this many requests a second per token (1 or more; 429 over it: ``sandbox.ratelimit``);
    ``None``: no limit.
    """

    tokens: frozenset[str] = frozenset({DEFAULT_TOKEN})
    readonly_tokens: frozenset[str] = frozenset({READONLY_TOKEN})
    signing_secret: bytes = field(default=_PROCESS_SECRET, repr=False)
    signed_link_ttl: int = 300
    seed: int = 20260521
    public_base_url: str | None = None
    gzip_boards: bool = False
    max_retained_file_bytes: int = 64 * MiB
    max_json_body_bytes: int = 1 * MiB
    journal_size: int = 1000
    journal_body_cap: int = 1 * MiB
    cards_cap_from: datetime | None = None
    cards_removal_from: datetime | None = None
    now: datetime | None = None
    extra_boards: tuple[int, ...] = ()
    rate_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("cards_cap_from", "cards_removal_from", "now"):
            value = getattr(self, name)
            if value is not None and value.utcoffset() is None:
                raise ValueError(f"{name} must be timezone-aware")
        if any(count < 0 for count in self.extra_boards):
            raise ValueError("extra_boards sizes must be non-negative")

    def is_valid_token(self, token: str) -> bool:
        return token in self.tokens or token in self.readonly_tokens

    def is_readonly_token(self, token: str) -> bool:
        return token in self.readonly_tokens and token not in self.tokens

    def current_time(self) -> datetime:
        """The sandbox clock: the pinned ``now``, else real time (UTC)."""
        return self.now if self.now is not None else datetime.now(UTC)
