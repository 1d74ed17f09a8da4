"""What "now" is for the gateway, and the date-flag engine that decides which phase of each deprecation applies.

Production reads the real clock. Staging and tests fix it with ``rollout.now`` in the config or the
``GATEWAY_NOW`` environment variable (ISO 8601); no request header can change it.

One mechanism serves every dated behaviour (spec, "Limits" 2-3 and "Versioning" 3-5): a behaviour is an ordered
list of phases and the date flags that move it from one phase to the next. A date is the instant its day begins
in the configured timezone. For each tenant, the phase at an instant comes from the dates (global, or the
tenant's override), then brownout windows (a later phase applies early for a while), then exemptions (a client
named by its token's fingerprint or a header keeps an earlier phase until a date). ``RolloutPlan`` is built once
from the config; asking it for a decision costs a few comparisons of POSIX timestamps.

The upload guard asks ``RolloutPlan.forbids_legacy_uploads(tenant, now, headers)``.
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..ops.observability import token_fingerprint

if TYPE_CHECKING:
    from ..ops.observability import Metrics

__all__ = (
    "BEHAVIOURS",
    "Behaviour",
    "Brownout",
    "Clock",
    "Decision",
    "Exemption",
    "FixedClock",
    "RolloutConfig",
    "RolloutPlan",
    "Schedule",
    "SystemClock",
    "TenantRollout",
    "clock_from_config",
    "describe",
    "parse_instant",
    "report",
    "rollout_problems",
)


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


# --- Behaviours -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Behaviour:
    """Phases in order; ``flags[i]`` is the date flag that moves the behaviour from ``phases[i]`` to ``phases[i+1]``."""

    name: str
    phases: tuple[str, ...]
    flags: tuple[str, ...]

    def index(self, phase: str) -> int:
        return self.phases.index(phase)


BOARD_CARDS = Behaviour("board_cards", ("full", "capped", "removed"), ("board_cards_cap", "board_cards_removal"))
LEGACY_UPLOADS = Behaviour("legacy_uploads", ("allowed", "forbidden"), ("forbid_legacy_uploads",))
BEHAVIOURS: Mapping[str, Behaviour] = {b.name: b for b in (BOARD_CARDS, LEGACY_UPLOADS)}
# Date flags that move no phase: the board route's Deprecation/Link headers start on this date.
SIGNAL_FLAGS = ("board_cards_announcement",)
# Spec, "Limits" 2-3.
DEFAULT_DATES: Mapping[str, dt.date | None] = {
    "board_cards_announcement": None,
    "board_cards_cap": dt.date(2026, 10, 1),
    "board_cards_removal": dt.date(2026, 11, 1),
    "forbid_legacy_uploads": None,
}


# --- Configuration ----------------------------------------------------------------------------------------------


def _check_timezone(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {value!r}") from None
    return value


def _check_behaviour_phase(behaviour: str, phase: str | None, *, allow_last: bool, allow_first: bool) -> str:
    known = BEHAVIOURS.get(behaviour)
    if known is None:
        raise ValueError(f"unknown behaviour {behaviour!r} (known: {', '.join(BEHAVIOURS)})")
    if phase is None:
        return known.phases[-1] if allow_last else known.phases[0]
    if phase not in known.phases:
        raise ValueError(f"unknown phase {phase!r} of {behaviour} (phases: {', '.join(known.phases)})")
    if not allow_last and phase == known.phases[-1]:
        raise ValueError(f"phase {phase!r} is the last one of {behaviour}: nothing to keep")
    if not allow_first and phase == known.phases[0]:
        raise ValueError(f"phase {phase!r} is the first one of {behaviour}: a brownout applies a later phase")
    return phase


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Brownout(_Model):
    """A window during which a later phase of a behaviour already applies. Times without an offset are local."""

    behaviour: str = "board_cards"
    phase: str | None = None  # default: the behaviour's last phase
    start: dt.datetime
    end: dt.datetime

    @model_validator(mode="after")
    def _valid(self) -> Brownout:
        object.__setattr__(
            self, "phase", _check_behaviour_phase(self.behaviour, self.phase, allow_last=True, allow_first=False)
        )
        if (self.start.tzinfo is None) != (self.end.tzinfo is None):
            raise ValueError("start and end must both have an offset, or both have none")
        if self.end <= self.start:
            raise ValueError(f"the window ends ({self.end.isoformat()}) before it starts ({self.start.isoformat()})")
        return self


class HeaderMatch(_Model):
    name: str = Field(pattern=r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
    value: str | None = None  # the whole value, exactly
    prefix: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> HeaderMatch:
        if (self.value is None) == (self.prefix is None):
            raise ValueError("give exactly one of value or prefix")
        return self

    def matches(self, value: str | None) -> bool:
        if value is None:
            return False
        return value == self.value if self.prefix is None else value.startswith(self.prefix)


class Exemption(_Model):
    """A client that keeps an earlier phase of a behaviour until a date."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=64)
    behaviour: str = "board_cards"
    phase: str | None = None  # default: the behaviour's first phase
    until: dt.date
    # What the access log shows as "client": the first 12 hex digits of SHA-256 of the Authorization header.
    token_fingerprint: str | None = Field(default=None, pattern=r"^[0-9a-f]{12}$")
    header: HeaderMatch | None = None

    @model_validator(mode="after")
    def _valid(self) -> Exemption:
        object.__setattr__(
            self, "phase", _check_behaviour_phase(self.behaviour, self.phase, allow_last=False, allow_first=True)
        )
        if self.token_fingerprint is None and self.header is None:
            raise ValueError("an exemption names its client: token_fingerprint, header, or both")
        if self.behaviour == LEGACY_UPLOADS.name and self.header is not None:
            raise ValueError(
                "legacy_uploads is a security setting: exempt a client by token_fingerprint only (any client can send "
                "a header)"
            )
        return self


class TenantRollout(_Model):
    """Per-tenant overrides: every date, the timezone, brownouts (replacing the global ones), extra exemptions."""

    timezone: str | None = None
    board_cards_announcement: dt.date | None = None
    board_cards_cap: dt.date | None = None
    board_cards_removal: dt.date | None = None
    forbid_legacy_uploads: dt.date | None = None
    brownouts: list[Brownout] | None = None  # None: the global list; [] : none for this tenant
    exemptions: list[Exemption] = []

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str | None) -> str | None:
        return _check_timezone(value)


class RolloutConfig(_Model):
    timezone: str = "UTC"
    now: dt.datetime | None = None
    board_cards_announcement: dt.date | None = None
    board_cards_cap: dt.date = DEFAULT_DATES["board_cards_cap"]  # type: ignore[assignment]
    board_cards_removal: dt.date = DEFAULT_DATES["board_cards_removal"]  # type: ignore[assignment]
    forbid_legacy_uploads: dt.date | None = None
    brownouts: list[Brownout] = []
    exemptions: list[Exemption] = []

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        _check_timezone(value)
        return value

    @property
    def tzinfo(self) -> dt.tzinfo:
        return zoneinfo.ZoneInfo(self.timezone)


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


# --- The plan: schedules built once, decisions per request --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """The phase of one behaviour for one request (or for the tenant at large when no client is given)."""

    behaviour: str
    phase: str
    index: int
    kind: str  # default | date | override | setting | brownout | exemption
    why: str


@dataclass(frozen=True, slots=True)
class _Step:
    at: float  # POSIX timestamp
    index: int  # phase from this instant on
    flag: str
    date: dt.date
    source: str  # "default", "rollout" or "tenant override"
    kind: str  # what a decision by this step is: "override" (a tenant's own date) or "date"


@dataclass(frozen=True, slots=True)
class _Window:
    start: float
    end: float
    index: int
    label: str


@dataclass(frozen=True, slots=True)
class _Exempt:
    name: str
    index: int
    until: float
    until_label: str
    fingerprint: str | None
    header: HeaderMatch | None

    def matches(self, headers: Mapping[str, str], fingerprint: str | None) -> bool:
        """``fingerprint``: the request's token fingerprint (computed once per request by the caller)."""
        if self.fingerprint is not None and fingerprint != self.fingerprint:
            return False
        return self.header is None or self.header.matches(headers.get(self.header.name))

    @property
    def client(self) -> str:
        parts = []
        if self.fingerprint is not None:
            parts.append(f"token fingerprint {self.fingerprint}")
        if self.header is not None:
            how = f"= {self.header.value!r}" if self.header.prefix is None else f"starting {self.header.prefix!r}"
            parts.append(f"header {self.header.name} {how}")
        return " and ".join(parts)


def _ts(value: dt.datetime) -> float:
    return value.timestamp()


def _midnight(day: dt.date, tz: dt.tzinfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0), tzinfo=tz)


def _fmt(ts: float, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(ts, tz).isoformat()


class Schedule:
    """One behaviour of one tenant: dated steps, brownout windows and exemptions, as timestamps."""

    __slots__ = ("behaviour", "base", "base_why", "base_kind", "steps", "windows", "exemptions", "_times", "_by_token",
                 "vary")

    def __init__(
        self,
        behaviour: Behaviour,
        base: int,
        base_kind: str,
        base_why: str,
        steps: Sequence[_Step],
        windows: Sequence[_Window],
        exemptions: Sequence[_Exempt],
    ) -> None:
        self.behaviour = behaviour
        self.base = base
        self.base_kind = base_kind
        self.base_why = base_why
        self.steps = tuple(sorted(steps, key=lambda s: s.at))
        self._times = [s.at for s in self.steps]
        self.windows = tuple(windows)
        self.exemptions = tuple(exemptions)
        # Headers that decide an exemption: a response that depends on them says so in Vary.
        names = {e.header.name for e in exemptions if e.header is not None}
        self._by_token = any(e.fingerprint is not None for e in exemptions)
        if self._by_token:
            names.add("Authorization")
        self.vary = tuple(sorted(names))

    def _resolve(
        self, now: float, headers: Mapping[str, str] | None
    ) -> tuple[int, str, _Step | _Window | _Exempt | None]:
        """The phase index in force, its kind, and what put it in force (None: the base phase)."""
        i = bisect.bisect_right(self._times, now)
        cause: _Step | _Window | _Exempt | None = None
        if i:
            cause = self.steps[i - 1]
            index, kind = cause.index, cause.kind
        else:
            index, kind = self.base, self.base_kind
        for window in self.windows:
            if window.start <= now < window.end and window.index > index:
                index, kind, cause = window.index, "brownout", window
        if headers is not None and self.exemptions:
            fingerprint = token_fingerprint(headers.get("Authorization")) if self._by_token else None
            for exempt in self.exemptions:
                if now < exempt.until and exempt.index < index and exempt.matches(headers, fingerprint):
                    return exempt.index, "exemption", exempt
        return index, kind, cause

    def decide(self, now: float, headers: Mapping[str, str] | None = None) -> Decision:
        index, kind, cause = self._resolve(now, headers)
        if isinstance(cause, _Exempt):
            why = f"exemption {cause.name!r} ({cause.client}) until {cause.until_label}"
        elif isinstance(cause, _Window):
            why = f"brownout {cause.label}"
        elif cause is not None:
            why = f"{cause.flag} {cause.date} ({cause.source}) reached"
        elif self.steps:
            first = self.steps[0]
            why = f"{self.base_why}before {first.flag} {first.date} ({first.source})"
        else:
            why = self.base_why.rstrip("; ") or "no date set"
        return Decision(self.behaviour.name, self.behaviour.phases[index], index, kind, why)

    def phase_and_kind(self, now: float, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        """``decide()``'s index and kind without building the explanation: the per-request path."""
        index, kind, _ = self._resolve(now, headers)
        return index, kind

    def phase_index(self, now: float, headers: Mapping[str, str] | None = None) -> int:
        return self.phase_and_kind(now, headers)[0]

    def boundaries(self) -> list[float]:
        times = {s.at for s in self.steps}
        for w in self.windows:
            times.update((w.start, w.end))
        return sorted(times)

    def next_change(self, now: float) -> tuple[float, Decision] | None:
        """The next instant at which the tenant-wide phase changes (exemptions aside), and the decision then."""
        current = self.decide(now).index
        for at in self.boundaries():
            if at > now:
                later = self.decide(at)
                if later.index != current:
                    return at, later
        return None

    def flag_instant(self, flag: str) -> float | None:
        return next((s.at for s in self.steps if s.flag == flag), None)


def _effective_date(own: TenantRollout, rollout: RolloutConfig, flag: str) -> tuple[dt.date | None, str]:
    """A date flag for one tenant, and where it comes from: its own override, else the rollout section's."""
    value = getattr(own, flag)
    if value is not None:
        return value, "tenant override"
    value = getattr(rollout, flag)
    return value, ("default" if value == DEFAULT_DATES[flag] else "rollout")


class RolloutPlan:
    """Every tenant's schedules, built once from the config (and again on reload)."""

    def __init__(self, schedules: Mapping[str, Mapping[str, Schedule]], signals: Mapping[str, Mapping[str, float | None]],
                 timezones: Mapping[str, str]) -> None:
        self.schedules = schedules
        self.signals = signals  # tenant -> signal flag -> instant (None: from the start)
        self.timezones = timezones

    @classmethod
    def from_config(cls, config: Any) -> RolloutPlan:
        """``config`` is a ``GatewayConfig`` (typed loosely: config.py imports this module)."""
        rollout: RolloutConfig = config.rollout
        schedules: dict[str, dict[str, Schedule]] = {}
        signals: dict[str, dict[str, float | None]] = {}
        timezones: dict[str, str] = {}
        for tenant_config in config.tenants:
            tenant = tenant_config.resolve()
            own: TenantRollout = tenant_config.rollout
            tz_name = own.timezone or rollout.timezone
            tz = zoneinfo.ZoneInfo(tz_name)
            global_tz = rollout.tzinfo
            timezones[tenant.name] = tz_name

            brownouts = [(b, global_tz) for b in rollout.brownouts] if own.brownouts is None else [
                (b, tz) for b in own.brownouts
            ]
            exemptions = [(e, global_tz) for e in rollout.exemptions] + [(e, tz) for e in own.exemptions]
            per: dict[str, Schedule] = {}
            for behaviour in BEHAVIOURS.values():
                base, base_kind, base_why = 0, "default", ""
                steps: list[_Step] = []
                applicable = True
                if behaviour is LEGACY_UPLOADS:
                    if tenant.forbid_legacy_uploads:
                        base, base_kind, base_why = 1, "setting", "company setting forbid_legacy_uploads is on"
                        applicable = False
                    elif not tenant.restricted_file_access:
                        base_kind, base_why = "setting", "restricted file access is off, so uploads cannot be forbidden"
                        applicable = False
                    else:
                        base_kind, base_why = "setting", "company setting forbid_legacy_uploads is off; "
                windows = []
                if applicable:
                    for i, flag in enumerate(behaviour.flags):
                        day, source = _effective_date(own, rollout, flag)
                        if day is not None:
                            kind = "override" if source == "tenant override" else "date"
                            steps.append(_Step(_ts(_midnight(day, tz)), i + 1, flag, day, source, kind))
                    for b, btz in brownouts:
                        if b.behaviour == behaviour.name:
                            start = b.start if b.start.tzinfo else b.start.replace(tzinfo=btz)
                            end = b.end if b.end.tzinfo else b.end.replace(tzinfo=btz)
                            label = f"{start.isoformat()} to {end.isoformat()}"
                            windows.append(_Window(_ts(start), _ts(end), behaviour.index(b.phase or ""), label))
                exempts = [
                    _Exempt(e.name, behaviour.index(e.phase or ""), _ts(_midnight(e.until, etz)), str(e.until),
                            e.token_fingerprint, e.header)
                    for e, etz in exemptions
                    if e.behaviour == behaviour.name
                ]
                per[behaviour.name] = Schedule(behaviour, base, base_kind, base_why, steps, windows, exempts)
            schedules[tenant.name] = per
            signals[tenant.name] = {}
            for flag in SIGNAL_FLAGS:
                day, _ = _effective_date(own, rollout, flag)
                signals[tenant.name][flag] = None if day is None else _ts(_midnight(day, tz))
        return cls(schedules, signals, timezones)

    def schedule(self, tenant: str, behaviour: str) -> Schedule:
        return self.schedules[tenant][behaviour]

    def decide(self, tenant: str, behaviour: str, now: dt.datetime,
               headers: Mapping[str, str] | None = None) -> Decision:
        return self.schedules[tenant][behaviour].decide(now.timestamp(), headers)

    def forbids_legacy_uploads(self, tenant: str, now: dt.datetime, headers: Mapping[str, str] | None = None) -> bool:
        """Whether the company's forbid-legacy-uploads setting is in force for this request at ``now``."""
        return self.schedules[tenant][LEGACY_UPLOADS.name].phase_index(now.timestamp(), headers) == 1

    def publish(self, metrics: Metrics, now: float, *, clear: bool = False) -> None:
        """Set ``gateway_rollout_phase``: 1 for each tenant's phase in force at ``now``, 0 for the others.

        ``clear`` first drops every series (on a (re)build, so tenants no longer configured disappear).
        """
        gauge = metrics.rollout_phase
        if clear:
            gauge.clear()
        for tenant, per in self.schedules.items():
            for name, schedule in per.items():
                current = schedule.phase_index(now)
                for i, phase in enumerate(schedule.behaviour.phases):
                    gauge.labels(tenant, name, phase).set(1 if i == current else 0)


# --- Cross-checks that need the global section and the tenants together --------------------------------------------


def rollout_problems(config: Any) -> list[str]:
    """Order of the effective dates per tenant, and what the forbid date and brownouts require; each with its path."""
    rollout: RolloutConfig = config.rollout
    problems: list[str] = []
    pairs = (("board_cards_announcement", "board_cards_cap", False), ("board_cards_cap", "board_cards_removal", True))

    def in_order(a: dt.date | None, b: dt.date | None, strict: bool) -> bool:
        return a is None or b is None or (a < b if strict else a <= b)

    def after(strict: bool) -> str:
        return "after" if strict else "on or after"

    for early, late, strict in pairs:
        a, b = getattr(rollout, early), getattr(rollout, late)
        if not in_order(a, b, strict):
            problems.append(f"rollout.{late}: {b} must be {after(strict)} {early} ({a})")
    for i, tenant_config in enumerate(config.tenants):
        own: TenantRollout = tenant_config.rollout
        where = f"tenants[{i}].rollout"
        for early, late, strict in pairs:
            a_own, b_own = getattr(own, early), getattr(own, late)
            a, b = _effective_date(own, rollout, early)[0], _effective_date(own, rollout, late)[0]
            if in_order(a, b, strict) or (a_own is None and b_own is None):
                continue
            if b_own is not None:
                origin = "" if a_own is not None else ", from rollout"
                problems.append(f"{where}.{late}: {b} must be {after(strict)} {early} ({a}{origin})")
            else:
                before = "before" if strict else "on or before"
                problems.append(f"{where}.{early}: {a} must be {before} {late} ({b}, from rollout)")
        tenant = tenant_config.resolve()
        if own.forbid_legacy_uploads is not None:
            if not tenant.restricted_file_access:
                problems.append(f"{where}.forbid_legacy_uploads: needs restricted_file_access on for this company")
            elif tenant.forbid_legacy_uploads:
                problems.append(
                    f"{where}.forbid_legacy_uploads: the company's forbid_legacy_uploads setting is already on; set "
                    "forbid_legacy_uploads: false on the tenant to turn it on by date"
                )
        for j, brownout in enumerate(own.brownouts or ()):
            if brownout.behaviour == LEGACY_UPLOADS.name and not tenant.restricted_file_access:
                problems.append(
                    f"{where}.brownouts[{j}]: legacy_uploads cannot be forbidden without restricted_file_access"
                )
    return problems


def describe(plan: RolloutPlan, now: dt.datetime, tenants: Iterable[str] | None = None) -> list[str]:
    """Human-readable lines: per tenant and behaviour, the phase at ``now``, why, and the next change."""
    lines: list[str] = []
    stamp = now.timestamp()
    for tenant in tenants if tenants is not None else plan.schedules:
        tz_name = plan.timezones[tenant]
        tz = zoneinfo.ZoneInfo(tz_name)
        lines.append(f"tenant {tenant} (timezone {tz_name}, local time {now.astimezone(tz).isoformat()})")
        for name, schedule in plan.schedules[tenant].items():
            decision = schedule.decide(stamp)
            lines.append(f"  {name}: {decision.phase} [{decision.kind}] {decision.why}")
            upcoming = schedule.next_change(stamp)
            if upcoming is None:
                lines.append("    next change: none scheduled")
            else:
                at, later = upcoming
                lines.append(f"    next change: {later.phase} at {_fmt(at, tz)} ({later.why})")
            for window in schedule.windows:
                if window.end > stamp:
                    state = "now" if window.start <= stamp else "scheduled"
                    lines.append(f"    brownout ({state}): {schedule.behaviour.phases[window.index]} "
                                 f"from {_fmt(window.start, tz)} to {_fmt(window.end, tz)}")
            for exempt in schedule.exemptions:
                state = "active" if stamp < exempt.until else "expired"
                lines.append(f"    exemption {exempt.name!r} ({state}): {exempt.client} keeps at most "
                             f"{schedule.behaviour.phases[exempt.index]} until {_fmt(exempt.until, tz)}")
            if name == BOARD_CARDS.name:
                announced = plan.signals[tenant]["board_cards_announcement"]
                if announced is None:
                    lines.append("    Deprecation and Link headers: on every board response")
                else:
                    state = "since" if announced <= stamp else "from"
                    lines.append(f"    Deprecation and Link headers: {state} {_fmt(announced, tz)} "
                                 "(board_cards_announcement)")
    return lines


def report(plan: RolloutPlan, now: dt.datetime) -> dict[str, Any]:
    """The phases in force at ``now`` as JSON-ready data (admin ``/rollout``): per tenant and behaviour."""
    stamp = now.timestamp()
    out: dict[str, Any] = {"at": now.isoformat(), "tenants": {}}
    for tenant, schedules in plan.schedules.items():
        behaviours: dict[str, Any] = {}
        for name, schedule in schedules.items():
            decision = schedule.decide(stamp)
            upcoming = schedule.next_change(stamp)
            behaviours[name] = {
                "phase": decision.phase,
                "kind": decision.kind,
                "why": decision.why,
                "next_change": None
                if upcoming is None
                else {"at": dt.datetime.fromtimestamp(upcoming[0], dt.UTC).isoformat(), "phase": upcoming[1].phase},
            }
        out["tenants"][tenant] = {"timezone": plan.timezones[tenant], "behaviours": behaviours}
    return out
