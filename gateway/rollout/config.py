"""The ``rollout`` section of the config and each tenant's ``rollout`` overrides: schema only.

Date flags are the section's other keys (``board_cards_cap: 2026-10-01``): any key not named below must be a date
(or null); which keys exist, which behaviours and phases brownouts and exemptions may name, and how dates must be
ordered is checked against the behaviours the policies declare (``checks.rollout_problems``), not here.

Dates and instants are read from their text by the keys that hold them (``ConfigDate``, ``ConfigInstant``): an
impossible one (``2026-02-30``, ``T25:00``) is a problem of its key, and so is one outside the years the gateway
can place in any timezone.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from .clock import parse_date, parse_instant_value

__all__ = ("Brownout", "ConfigDate", "ConfigInstant", "Exemption", "Freeze", "HeaderMatch", "Preview", "Ramp",
           "RampStep", "RolloutConfig", "Shadow", "TenantRollout", "check_value_or_prefix", "value_or_prefix_matches")

# A calendar date, YYYY-MM-DD (a YAML timestamp stays text: this reads it).
ConfigDate = Annotated[dt.date, BeforeValidator(parse_date)]
# An ISO 8601 date-time (or a date: its midnight); without an offset it is read in the section's timezone.
ConfigInstant = Annotated[dt.datetime, BeforeValidator(parse_instant_value)]

# A brownout or exemption that names no behaviour is about the board route's cards (the first dated behaviour).
DEFAULT_BEHAVIOUR = "board_cards"


def _check_timezone(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file name
        raise ValueError(f"unknown timezone {value[:80]!r}") from None
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class _WithDates(BaseModel):
    """A section whose other keys are date flags."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)
    __pydantic_extra__: dict[str, ConfigDate | None] = Field(init=False)

    def dates(self) -> dict[str, dt.date | None]:
        """The date flags this section sets (null included: a tenant's null means "the rollout section's date")."""
        return dict(self.__pydantic_extra__ or {})


class Brownout(_Model):
    """A window during which a later phase of a behaviour already applies. Times without an offset are local."""

    behaviour: str = DEFAULT_BEHAVIOUR
    phase: str | None = None  # default: the behaviour's last phase
    start: ConfigInstant
    end: ConfigInstant

    @model_validator(mode="after")
    def _valid(self) -> Brownout:
        if (self.start.tzinfo is None) != (self.end.tzinfo is None):
            raise ValueError("start and end must both have an offset, or both have none")
        if self.end <= self.start:
            raise ValueError(f"the window ends ({self.end.isoformat()}) before it starts ({self.start.isoformat()})")
        return self


class Shadow(_Model):
    """A window in which a behaviour's next phase is decided for every request but not applied: traffic goes on as
    before, and each request is recorded as what the phase would have done to it (``would_block``, ``would_cap``,
    ``would_remove``). Times without an offset are local."""

    behaviour: str = DEFAULT_BEHAVIOUR
    phase: str | None = None  # default: the phase after the one the dates put in force when the window starts
    start: ConfigInstant
    end: ConfigInstant

    @model_validator(mode="after")
    def _valid(self) -> Shadow:
        if (self.start.tzinfo is None) != (self.end.tzinfo is None):
            raise ValueError("start and end must both have an offset, or both have none")
        if self.end <= self.start:
            raise ValueError(f"the window ends ({self.end.isoformat()}) before it starts ({self.start.isoformat()})")
        return self


class RampStep(_Model):
    """From ``from`` on, ``share`` percent of the clients (chosen by a keyed hash of their token) get the phase."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, populate_by_name=True)

    share: float = Field(gt=0, lt=100)
    start: ConfigDate = Field(alias="from")


class Ramp(_Model):
    """A phase that reaches a growing share of clients before its date (everyone at the date). Sticky: the same
    client gets the same answer on every replica and after a restart, and raising the share only adds clients."""

    behaviour: str = DEFAULT_BEHAVIOUR
    phase: str
    steps: list[RampStep] = Field(min_length=1, max_length=20)

    @model_validator(mode="after")
    def _rising(self) -> Ramp:
        for before, after in zip(self.steps, self.steps[1:], strict=False):
            if after.start <= before.start:
                raise ValueError(f"steps: {after.start} must be after {before.start} (steps in date order)")
            if after.share <= before.share:
                raise ValueError(f"steps: the share must rise with the dates ({after.share:g} on {after.start} is "
                                 f"not above {before.share:g} on {before.start})")
        return self


class Freeze(_Model):
    """From ``from`` on, a client first seen on the behaviour after that date gets its last phase at once; a client
    seen before keeps its schedule ("seen": a deprecated call recorded by any replica of the fleet)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, populate_by_name=True)

    behaviour: str = DEFAULT_BEHAVIOUR
    start: ConfigDate = Field(alias="from")


class Preview(_Model):
    """A client that sends ``header`` (a behaviour's name, ``name=phase``, several joined by commas, or ``all``) gets
    that behaviour's later phase now: it can test its migration before the date. Only ever later, never earlier."""

    enabled: bool = False
    header: str = Field(default="Gateway-Preview", pattern=r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$", max_length=64)


def check_value_or_prefix(value: str | None, prefix: str | None) -> None:
    """A text matched whole (``value``) or by its beginning (``prefix``): exactly one of the two is given."""
    if (value is None) == (prefix is None):
        raise ValueError("give exactly one of value or prefix")


def value_or_prefix_matches(text: str | None, value: str | None, prefix: str | None) -> bool:
    """Whether ``text`` is ``value`` (when no ``prefix``) or starts with ``prefix``, case-sensitively (docs/rollout.md,
    "How a header matches"); a missing text matches nothing."""
    if text is None:
        return False
    return text == value if prefix is None else text.startswith(prefix)


class HeaderMatch(_Model):
    name: str = Field(pattern=r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
    value: str | None = None  # the whole value, exactly
    prefix: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> HeaderMatch:
        check_value_or_prefix(self.value, self.prefix)
        return self

    def matches(self, value: str | None) -> bool:
        return value_or_prefix_matches(value, self.value, self.prefix)


class Exemption(_Model):
    """A client that keeps an earlier phase of a behaviour until a date."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=64)
    behaviour: str = DEFAULT_BEHAVIOUR
    phase: str | None = None  # default: the behaviour's first phase
    until: ConfigDate
    # What the access log shows as "client": the first 12 hex digits of SHA-256 of the Authorization header.
    token_fingerprint: str | None = Field(default=None, pattern=r"^[0-9a-f]{12}$")
    header: HeaderMatch | None = None
    # Whether this client gets the behaviour's migration bridge (board_cards: card backfill; legacy_uploads: upload
    # upgrade) until the date; None: the tenant's setting (``bridges``). With a bridge set, the phase may be the last
    # one: the exemption then changes the bridge only.
    bridge: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> Exemption:
        if self.token_fingerprint is None and self.header is None:
            raise ValueError("an exemption names its client: token_fingerprint, header, or both")
        return self


class TenantRollout(_WithDates):
    """Per-tenant overrides: any date flag, the timezone, brownouts, shadows, ramps and freezes (each replacing the
    global list), extra exemptions."""

    timezone: str | None = None
    brownouts: list[Brownout] | None = None  # None: the global list; [] : none for this tenant
    shadows: list[Shadow] | None = None
    ramps: list[Ramp] | None = None
    freezes: list[Freeze] | None = None
    exemptions: list[Exemption] = []

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str | None) -> str | None:
        return _check_timezone(value)


class RolloutConfig(_WithDates):
    timezone: str = "UTC"
    now: ConfigInstant | None = None
    brownouts: list[Brownout] = []
    shadows: list[Shadow] = []
    ramps: list[Ramp] = []
    freezes: list[Freeze] = []
    exemptions: list[Exemption] = []
    preview: Preview = Preview()
    # The key of the ramps' hash: a client's place in a ramp cannot be worked out without it (set it as a secret).
    ramp_key: str = Field(default="", max_length=256)

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        _check_timezone(value)
        return value

    @property
    def tzinfo(self) -> dt.tzinfo:
        return zoneinfo.ZoneInfo(self.timezone)
