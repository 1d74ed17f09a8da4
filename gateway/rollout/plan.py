"""The date-flag engine: which phase of each dated behaviour applies, per tenant, at an instant, for a request.

One mechanism serves every dated behaviour (spec, "Limits" 2-3 and "Versioning" 3-5): a behaviour is an ordered
list of phases and the date flags that move it from one phase to the next (declared by the policy that owns it,
``behaviour.Behaviour``). A date is the instant its day begins in the configured timezone. For each tenant, the phase
at an instant comes from the dates (global, or the tenant's override), then brownout windows (a later phase applies
early for a while), then exemptions (a client named by its token's fingerprint or a header keeps an earlier phase
until a date). ``RolloutPlan`` is built once from the config; asking it for a decision costs a few comparisons of
POSIX timestamps.
"""

from __future__ import annotations

import bisect
import datetime as dt
import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.http import token_fingerprint
from .behaviour import Behaviour, DateFlag
from .config import HeaderMatch, RolloutConfig, TenantRollout

if TYPE_CHECKING:
    from ..core.tenants import Tenant

__all__ = ("Decision", "RolloutPlan", "Schedule", "effective_date")


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
    bridge: bool | None = None

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


def _midnight(day: dt.date, tz: dt.tzinfo) -> float:
    return dt.datetime.combine(day, dt.time(0), tzinfo=tz).timestamp()


class Schedule:
    """One behaviour of one tenant: dated steps, brownout windows and exemptions, as timestamps."""

    __slots__ = ("behaviour", "base", "base_why", "base_kind", "steps", "windows", "exemptions", "signals", "_times",
                 "_by_token", "_bridging", "bridge_default", "vary")

    def __init__(
        self,
        behaviour: Behaviour,
        base: int,
        base_kind: str,
        base_why: str,
        steps: Sequence[_Step],
        windows: Sequence[_Window],
        exemptions: Sequence[_Exempt],
        signals: Mapping[str, float | None],
        bridge: bool = False,
    ) -> None:
        self.behaviour = behaviour
        self.base = base
        self.base_kind = base_kind
        self.base_why = base_why
        self.steps = tuple(sorted(steps, key=lambda s: s.at))
        self._times = [s.at for s in self.steps]
        self.windows = tuple(windows)
        self.exemptions = tuple(exemptions)
        self.signals = dict(signals)  # signal flag -> instant (None: from the start)
        # Headers that decide an exemption: a response that depends on them says so in Vary.
        names = {e.header.name for e in exemptions if e.header is not None}
        self._by_token = any(e.fingerprint is not None for e in exemptions)
        self._bridging = any(e.bridge is not None for e in exemptions)
        self.bridge_default = bridge  # the tenant's setting of the behaviour's bridge
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

    def bridge(self, now: float, headers: Mapping[str, str]) -> bool:
        """Whether this request gets the behaviour's migration bridge: the first exemption in force that matches the
        client and sets ``bridge`` decides, else the tenant's setting."""
        default = self.bridge_default
        if not self._bridging:
            return default
        fingerprint = token_fingerprint(headers.get("Authorization")) if self._by_token else None
        for exempt in self.exemptions:
            if exempt.bridge is not None and now < exempt.until and exempt.matches(headers, fingerprint):
                return exempt.bridge
        return default

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


def effective_date(own: TenantRollout, rollout: RolloutConfig, flag: DateFlag) -> tuple[dt.date | None, str]:
    """A date flag for one tenant, and where it comes from: its own override, else the rollout section's."""
    value = own.dates().get(flag.name)
    if value is not None:
        return value, "tenant override"
    value = rollout.dates().get(flag.name, flag.default)
    return value, ("default" if value == flag.default else "rollout")


class RolloutPlan:
    """Every tenant's schedules, built once from the config (and again on reload)."""

    def __init__(self, schedules: Mapping[str, Mapping[str, Schedule]], timezones: Mapping[str, str]) -> None:
        self.schedules = schedules
        self.timezones = timezones

    @classmethod
    def build(
        cls,
        rollout: RolloutConfig,
        tenants: Sequence[tuple[Tenant, TenantRollout]],
        behaviours: Mapping[str, Behaviour],
    ) -> RolloutPlan:
        schedules: dict[str, dict[str, Schedule]] = {}
        timezones: dict[str, str] = {}
        global_tz = rollout.tzinfo
        for tenant, own in tenants:
            tz_name = own.timezone or rollout.timezone
            tz = zoneinfo.ZoneInfo(tz_name)
            timezones[tenant.name] = tz_name
            brownouts = [(b, global_tz) for b in rollout.brownouts] if own.brownouts is None else [
                (b, tz) for b in own.brownouts
            ]
            exemptions = [(e, global_tz) for e in rollout.exemptions] + [(e, tz) for e in own.exemptions]
            per: dict[str, Schedule] = {}
            for behaviour in behaviours.values():
                base = behaviour.base_of(tenant)
                steps: list[_Step] = []
                windows: list[_Window] = []
                if base.dated:
                    for i, flag in enumerate(behaviour.flags):
                        day, source = effective_date(own, rollout, flag)
                        if day is not None:
                            kind = "override" if source == "tenant override" else "date"
                            steps.append(_Step(_midnight(day, tz), i + 1, flag.name, day, source, kind))
                    for b, btz in brownouts:
                        if b.behaviour == behaviour.name:
                            start = b.start if b.start.tzinfo else b.start.replace(tzinfo=btz)
                            end = b.end if b.end.tzinfo else b.end.replace(tzinfo=btz)
                            label = f"{start.isoformat()} to {end.isoformat()}"
                            phase = b.phase or behaviour.phases[-1]
                            windows.append(_Window(start.timestamp(), end.timestamp(), behaviour.index(phase), label))
                exempts = [
                    _Exempt(e.name, behaviour.index(e.phase or behaviour.phases[0]), _midnight(e.until, etz),
                            str(e.until), e.token_fingerprint, e.header, e.bridge)
                    for e, etz in exemptions
                    if e.behaviour == behaviour.name
                ]
                signals = {}
                for flag in behaviour.signals:
                    day, _ = effective_date(own, rollout, flag)
                    signals[flag.name] = None if day is None else _midnight(day, tz)
                bridge = behaviour.bridge_of(tenant) if behaviour.bridge_of is not None else False
                per[behaviour.name] = Schedule(behaviour, base.index, base.kind, base.why, steps, windows, exempts,
                                               signals, bridge)
            schedules[tenant.name] = per
        return cls(schedules, timezones)

    def schedule(self, tenant: str, behaviour: str) -> Schedule:
        return self.schedules[tenant][behaviour]

    def decide(self, tenant: str, behaviour: str, now: dt.datetime,
               headers: Mapping[str, str] | None = None) -> Decision:
        return self.schedules[tenant][behaviour].decide(now.timestamp(), headers)

    def phase_samples(self, now: float) -> Iterator[tuple[str, str, str, float]]:
        """``gateway_rollout_phase`` at ``now``: (tenant, behaviour, phase, 1 for the phase in force else 0), for
        every tenant, dated behaviour and phase of this plan (a tenant no longer configured has none)."""
        for tenant, per in self.schedules.items():
            for name, schedule in per.items():
                current = schedule.phase_index(now)
                for i, phase in enumerate(schedule.behaviour.phases):
                    yield tenant, name, phase, 1.0 if i == current else 0.0
