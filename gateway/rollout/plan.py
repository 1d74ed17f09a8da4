"""The date-flag engine: which phase of each dated behaviour applies, per tenant, at an instant, for a client.

One mechanism serves every dated behaviour: an ordered list of phases and the date flags between them, declared by
the policy that owns it (``behaviour.Behaviour``); a date is the instant its day begins in the configured timezone.
For a client the phase comes from, in order: the dates (global, or the tenant's own), brownouts, a ramp, a freeze,
exemptions, a preview; a shadow window decides the next phase beside it without applying it (docs/rollout.md).
``RolloutPlan`` is built once from the config; a tenant's schedules are built when first asked for, and tenants
with the same settings share them.
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import hmac
import zoneinfo
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

from ..core.decision import Decision, Kind
from ..core.http import token_fingerprint
from .behaviour import Base, Behaviour, DateFlag
from .config import Brownout, HeaderMatch, RolloutConfig, Shadow, TenantRollout

if TYPE_CHECKING:
    from ..core.tenants import Tenant

__all__ = ("Client", "Explained", "Ramp", "RolloutPlan", "Schedule", "effective_date")

_TWO_64 = float(1 << 64)
_T = TypeVar("_T")


class Client(Protocol):
    """What the engine reads of the client a decision is for (``request.RequestClient``)."""

    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def fingerprint(self) -> str | None: ...
    def previewed(self, behaviour: str) -> str | None:
        """The phase the client asks to preview (``""``: the last one), or None."""
    def seen_before(self, tenant: str, behaviour: str, at: float) -> bool | None:
        """Whether the client made a call on ``behaviour`` before ``at``; None: it cannot be told now."""


@dataclass(frozen=True, slots=True)
class Explained:
    """A decision with its explanation, for people (``gateway rollout``, ``/rollout``, the status page)."""

    behaviour: str
    phase: str
    index: int
    kind: Kind
    why: str
    shadow: str | None = None  # the phase a shadow window decides now, if any


@dataclass(frozen=True, slots=True)
class _Step:
    at: float  # POSIX timestamp
    index: int  # phase from this instant on
    flag: str
    date: dt.date
    source: str  # "default", "rollout" or "tenant override"
    kind: Kind  # what a decision by this step is: a tenant's own date (override) or the rollout's (date)


@dataclass(frozen=True, slots=True)
class _Window:
    start: float
    end: float
    index: int
    label: str


@dataclass(frozen=True, slots=True)
class Ramp:
    """A phase reaching a share of clients before its date: (from, share in percent) steps, rising."""

    index: int
    steps: tuple[tuple[float, float], ...]
    key: bytes

    def share(self, now: float) -> float:
        i = bisect.bisect_right([at for at, _ in self.steps], now)
        return self.steps[i - 1][1] if i else 0.0

    def takes(self, behaviour: str, fingerprint: str, share: float) -> bool:
        """Whether the client's place (a keyed hash of its fingerprint, the same everywhere) falls in ``share``."""
        digest = hmac.new(self.key, f"{behaviour}:{self.index}:{fingerprint}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8]) / _TWO_64 * 100.0 < share


@dataclass(frozen=True, slots=True)
class _Freeze:
    at: float
    index: int  # the behaviour's last phase
    date: dt.date


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


class _Resolved(NamedTuple):
    phase: int
    kind: Kind
    cause: _Step | _Window | Ramp | _Freeze | _Exempt | None  # None: the base phase
    shadow: int | None
    unplaced: bool


class Schedule:
    """One behaviour of one tenant (shared by every tenant with the same settings): dated steps, brownout and shadow
    windows, ramps, a freeze and exemptions, as timestamps."""

    __slots__ = ("behaviour", "base", "base_why", "base_kind", "steps", "windows", "shadows", "ramps", "freeze",
                 "exemptions", "signals", "_times", "_by_token", "_bridging", "bridge_default", "preview", "vary")

    def __init__(self, behaviour: Behaviour, base: Base, steps: Sequence[_Step], windows: Sequence[_Window],
                 exemptions: Sequence[_Exempt], signals: Mapping[str, float | None], bridge: bool = False, *,
                 shadows: Sequence[_Window] = (), ramps: Sequence[Ramp] = (), freeze: _Freeze | None = None,
                 preview: str | None = None) -> None:
        self.behaviour = behaviour
        self.base = base.index
        self.base_kind = Kind(base.kind)
        self.base_why = base.why
        self.steps = tuple(sorted(steps, key=lambda s: s.at))
        self._times = [s.at for s in self.steps]
        self.windows = tuple(windows)
        self.shadows = tuple(shadows)
        self.ramps = tuple(ramps)
        self.freeze = freeze
        self.exemptions = tuple(exemptions)
        self.signals = dict(signals)  # signal flag -> instant (None: from the start)
        self.preview = preview  # the header a client previews a later phase with (None: off)
        self._by_token = any(e.fingerprint is not None for e in exemptions) or bool(ramps) or freeze is not None
        self._bridging = any(e.bridge is not None for e in exemptions)
        self.bridge_default = bridge  # the tenant's setting of the behaviour's bridge
        self.vary = _vary(exemptions, self._by_token, preview)

    # --- one client's phase ---------------------------------------------------------------------------------------

    def _dated(self, now: float) -> tuple[int, Kind, _Step | _Window | None]:
        """The phase the calendar puts in force for the whole company: dates, then brownouts."""
        i = bisect.bisect_right(self._times, now)
        cause: _Step | _Window | None = None
        if i:
            cause = self.steps[i - 1]
            index, kind = cause.index, cause.kind
        else:
            index, kind = self.base, self.base_kind
        for window in self.windows:
            if window.start <= now < window.end and window.index > index:
                index, kind, cause = window.index, Kind.BROWNOUT, window
        return index, kind, cause

    def _resolve(self, now: float, client: Client | None, tenant: str = "") -> _Resolved:
        index, kind, cause = self._dated(now)
        resolved = _Resolved(index, kind, cause, None, False)
        if client is not None:
            resolved = self._for_client(now, client, tenant, resolved)
        for window in self.shadows:
            if window.start <= now < window.end and window.index > resolved.phase:
                return resolved._replace(shadow=window.index)
        return resolved

    def _for_client(self, now: float, client: Client, tenant: str, resolved: _Resolved) -> _Resolved:
        fingerprint = client.fingerprint if self._by_token else None
        if fingerprint is not None:
            resolved = self._frozen(now, client, tenant, self._ramped(now, fingerprint, resolved))
        resolved = self._exempted(now, client, fingerprint, resolved)
        return self._previewed(client, resolved) if self.preview is not None else resolved

    def _ramped(self, now: float, fingerprint: str, resolved: _Resolved) -> _Resolved:
        for ramp in self.ramps:
            share = ramp.share(now)
            if ramp.index > resolved.phase and share and ramp.takes(self.behaviour.name, fingerprint, share):
                resolved = resolved._replace(phase=ramp.index, kind=Kind.RAMP, cause=ramp)
        return resolved

    def _exempted(self, now: float, client: Client, fingerprint: str | None, resolved: _Resolved) -> _Resolved:
        for exempt in self.exemptions:
            if now < exempt.until and exempt.index < resolved.phase and exempt.matches(client.headers, fingerprint):
                return resolved._replace(phase=exempt.index, kind=Kind.EXEMPTION, cause=exempt)
        return resolved

    def _previewed(self, client: Client, resolved: _Resolved) -> _Resolved:
        wanted = client.previewed(self.behaviour.name)
        if wanted is None:
            return resolved
        phases = self.behaviour.phases
        later = phases.index(wanted) if wanted in phases else len(phases) - 1
        return resolved._replace(phase=later, kind=Kind.PREVIEW, cause=None) if later > resolved.phase else resolved

    def _frozen(self, now: float, client: Client, tenant: str, resolved: _Resolved) -> _Resolved:
        freeze = self.freeze
        if freeze is None or now < freeze.at or freeze.index <= resolved.phase:
            return resolved
        seen = client.seen_before(tenant, self.behaviour.name, freeze.at)
        if seen is None:
            # Cannot be placed while the record is unavailable: a security behaviour takes the stricter answer, a
            # compatibility one the answer that breaks nothing.
            if not self.behaviour.security:
                return resolved._replace(unplaced=True)
            return resolved._replace(phase=freeze.index, kind=Kind.FREEZE, cause=freeze, unplaced=True)
        return resolved if seen else resolved._replace(phase=freeze.index, kind=Kind.FREEZE, cause=freeze)

    def resolve(self, now: float, client: Client | None = None, tenant: str = "") -> Decision:
        """The phase for one client (the per-request path: no explanation is built)."""
        r = self._resolve(now, client, tenant)
        return Decision(self.behaviour.name, r.phase, self.behaviour.phases[r.phase], r.kind, r.shadow,
                        self._bridge_for(now, client), self.vary, r.unplaced,
                        r.cause.name if isinstance(r.cause, _Exempt) else None)

    def bridge(self, now: float, headers: Mapping[str, str]) -> bool:
        """Whether this request gets the behaviour's migration bridge: the first exemption in force that matches the
        client and sets ``bridge`` decides, else the tenant's setting."""
        if not self._bridging:
            return self.bridge_default
        fingerprint = token_fingerprint(headers.get("Authorization")) if self._by_token else None
        return self._exempt_bridge(now, headers, fingerprint)

    def _bridge_for(self, now: float, client: Client | None) -> bool:
        if not self._bridging or client is None:
            return self.bridge_default
        return self._exempt_bridge(now, client.headers, client.fingerprint if self._by_token else None)

    def _exempt_bridge(self, now: float, headers: Mapping[str, str], fingerprint: str | None) -> bool:
        for exempt in self.exemptions:
            if exempt.bridge is not None and now < exempt.until and exempt.matches(headers, fingerprint):
                return exempt.bridge
        return self.bridge_default

    # --- explained, for people ------------------------------------------------------------------------------------

    def explain(self, now: float, client: Client | None = None, tenant: str = "") -> Explained:
        r = self._resolve(now, client, tenant)
        phases = self.behaviour.phases
        return Explained(self.behaviour.name, phases[r.phase], r.phase, r.kind, self._why(r, client),
                         None if r.shadow is None else phases[r.shadow])

    def _why(self, r: _Resolved, client: Client | None) -> str:
        if r.kind is Kind.PREVIEW:
            return f"the client asked for it ({self.preview} header)"
        if r.cause is None:
            return self._why_undated()
        return _cause_why(r.cause, r.unplaced, self.behaviour.phases)

    def _why_undated(self) -> str:
        """Why the company is in its base phase: before the first date, or no date at all."""
        if self.steps:
            first = self.steps[0]
            return f"{self.base_why}before {first.flag} {first.date} ({first.source})"
        return self.base_why.rstrip("; ") or "no date set"

    def decide(self, now: float, headers: Mapping[str, str] | None = None) -> Explained:
        """The phase for a request with these headers (or the company at large), explained."""
        return self.explain(now, None if headers is None else HeaderClient(headers))

    def phase_and_kind(self, now: float, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        r = self._resolve(now, None if headers is None else HeaderClient(headers))
        return r.phase, r.kind

    def phase_index(self, now: float, headers: Mapping[str, str] | None = None) -> int:
        return self.phase_and_kind(now, headers)[0]

    # --- the calendar ---------------------------------------------------------------------------------------------

    def boundaries(self) -> list[float]:
        """Every instant the rollout may change at: dated steps, brownout and shadow windows, ramps' steps, a
        freeze."""
        times = {s.at for s in self.steps}
        for w in (*self.windows, *self.shadows):
            times.update((w.start, w.end))
        for ramp in self.ramps:
            times.update(at for at, _ in ramp.steps)
        if self.freeze is not None:
            times.add(self.freeze.at)
        return sorted(times)

    def next_change(self, now: float) -> tuple[float, Explained] | None:
        """The next instant at which the tenant-wide phase changes (per-client rules aside), and the decision then."""
        current = self._dated(now)[0]
        for at in self.boundaries():
            if at > now and self._dated(at)[0] != current:
                return at, self.explain(at)
        return None

    def flag_instant(self, flag: str) -> float | None:
        return next((s.at for s in self.steps if s.flag == flag), None)

    def ramp_share(self, now: float) -> tuple[str, float] | None:
        """The phase a ramp gives a share of clients now, and the share (percent); None outside any ramp."""
        index = self._dated(now)[0]
        for ramp in self.ramps:
            share = ramp.share(now)
            if share and ramp.index > index:
                return self.behaviour.phases[ramp.index], share
        return None


class HeaderClient:
    """A client known by its request headers alone (no preview, no record of it): for ``decide`` and the tools."""

    __slots__ = ("headers", "_fingerprint")

    def __init__(self, headers: Mapping[str, str], fingerprint: str | None = None) -> None:
        self.headers = headers
        self._fingerprint = fingerprint

    @property
    def fingerprint(self) -> str | None:
        if self._fingerprint is None:
            self._fingerprint = token_fingerprint(self.headers.get("Authorization"))
        return self._fingerprint

    def previewed(self, behaviour: str) -> str | None:
        return None

    def seen_before(self, tenant: str, behaviour: str, at: float) -> bool | None:
        return True  # a client the tools are asked about is placed by what they are told: known


def effective_date(own: TenantRollout, rollout: RolloutConfig, flag: DateFlag) -> tuple[dt.date | None, str]:
    """A date flag for one tenant, and where it comes from: its own override, else the rollout section's."""
    value = own.dates().get(flag.name)
    if value is not None:
        return value, "tenant override"
    value = rollout.dates().get(flag.name, flag.default)
    return value, ("default" if value == flag.default else "rollout")


def _vary(exemptions: Sequence[_Exempt], by_token: bool, preview: str | None) -> tuple[str, ...]:
    """Headers that decide a phase for one client: a response that depends on them says so in Vary."""
    names = {e.header.name for e in exemptions if e.header is not None}
    if by_token:
        names.add("Authorization")
    if preview is not None:
        names.add(preview)
    return tuple(sorted(names))


def _cause_why(cause: _Step | _Window | Ramp | _Freeze | _Exempt, unplaced: bool, phases: Sequence[str]) -> str:
    """Why a dated cause put the client in its phase."""
    if isinstance(cause, _Exempt):
        return f"exemption {cause.name!r} ({cause.client}) until {cause.until_label}"
    if isinstance(cause, _Freeze):
        return (f"freeze from {cause.date}: the client was "
                + ("not placed (the usage ledger is unavailable)" if unplaced else "first seen after it"))
    if isinstance(cause, Ramp):
        return f"in the ramp's share of clients that get {phases[cause.index]} before its date"
    if isinstance(cause, _Window):
        return f"brownout {cause.label}"
    return f"{cause.flag} {cause.date} ({cause.source}) reached"


class _Builder:
    """Builds one tenant's schedule of one behaviour; identical settings give the same (shared) schedule."""

    def __init__(self, rollout: RolloutConfig, behaviours: Mapping[str, Behaviour]) -> None:
        self.rollout = rollout
        self.behaviours = behaviours
        self.global_tz = rollout.tzinfo
        self.key = rollout.ramp_key.encode()
        self.preview = rollout.preview.header if rollout.preview.enabled else None
        self._shared: dict[tuple[object, ...], Schedule] = {}
        self._quick: dict[tuple[str, int, Base, bool], Schedule] = {}

    def schedule(self, tenant: Tenant, own: TenantRollout, behaviour: Behaviour) -> Schedule:
        base = behaviour.base_of(tenant)
        bridge = behaviour.bridge_of(tenant) if behaviour.bridge_of is not None else False
        # Companies that set no rollout overrides share one (frozen) TenantRollout: theirs is found without working
        # out their dates (the plan holds every ``own`` while it lives, so an id is not reused meanwhile).
        quick = (behaviour.name, id(own), base, bridge)
        shared = self._quick.get(quick)
        if shared is None:
            shared = self._quick[quick] = self._shared_schedule(own, behaviour, base, bridge)
        return shared

    def _shared_schedule(self, own: TenantRollout, behaviour: Behaviour, base: Base, bridge: bool) -> Schedule:
        tz_name = own.timezone or self.rollout.timezone
        key = self._same_settings(own, behaviour, base, bridge, tz_name)
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = self._build(own, behaviour, base, bridge, zoneinfo.ZoneInfo(tz_name))
        return shared

    def _same_settings(self, own: TenantRollout, behaviour: Behaviour, base: Base, bridge: bool, tz_name: str
                       ) -> tuple[object, ...]:
        """What makes two companies' schedules of a behaviour one: their dates, time zone and own lists."""
        days = tuple(effective_date(own, self.rollout, flag) for flag in behaviour.all_flags())
        own_lists = (own.brownouts, own.shadows, own.ramps, own.freezes)
        return (behaviour.name, base, tz_name, days, tuple(None if x is None else tuple(x) for x in own_lists),
                tuple(own.exemptions), bridge)

    def _build(self, own: TenantRollout, behaviour: Behaviour, base: Base, bridge: bool, tz: dt.tzinfo) -> Schedule:
        exempts, signals = self._exempts(own, behaviour, tz), self._signals(own, behaviour, tz)
        if not base.dated:  # a phase the company's own setting fixes has no dates, nothing to shadow or ramp to
            return Schedule(behaviour, base, [], [], exempts, signals, bridge, preview=self.preview)
        steps = self._steps(own, behaviour, tz)
        return Schedule(behaviour, base, steps, self._brownouts(own, behaviour, tz), exempts, signals, bridge,
                        shadows=self._shadows(own, behaviour, base, steps, tz), ramps=self._ramps(own, behaviour, tz),
                        freeze=self._freeze(own, behaviour, tz), preview=self.preview)

    def _brownouts(self, own: TenantRollout, behaviour: Behaviour, tz: dt.tzinfo) -> list[_Window]:
        return [self._window(b, b.phase or behaviour.phases[-1], behaviour, btz)
                for b, btz in self._listed(self.rollout.brownouts, own.brownouts, tz) if b.behaviour == behaviour.name]

    def _freeze(self, own: TenantRollout, behaviour: Behaviour, tz: dt.tzinfo) -> _Freeze | None:
        mine = behaviour.name
        return next((_Freeze(_midnight(f.start, ftz), len(behaviour.phases) - 1, f.start)
                     for f, ftz in self._listed(self.rollout.freezes, own.freezes, tz) if f.behaviour == mine), None)

    def _exempts(self, own: TenantRollout, behaviour: Behaviour, tz: dt.tzinfo) -> list[_Exempt]:
        return [
            _Exempt(e.name, behaviour.index(e.phase or behaviour.phases[0]), _midnight(e.until, etz), str(e.until),
                    e.token_fingerprint, e.header, e.bridge)
            for e, etz in [(e, self.global_tz) for e in self.rollout.exemptions] + [(e, tz) for e in own.exemptions]
            if e.behaviour == behaviour.name
        ]

    def _signals(self, own: TenantRollout, behaviour: Behaviour, tz: dt.tzinfo) -> dict[str, float | None]:
        return {flag.name: None if (day := effective_date(own, self.rollout, flag)[0]) is None else _midnight(day, tz)
                for flag in behaviour.signals}

    def _steps(self, own: TenantRollout, behaviour: Behaviour, tz: dt.tzinfo) -> list[_Step]:
        steps = []
        for i, flag in enumerate(behaviour.flags):
            day, source = effective_date(own, self.rollout, flag)
            if day is not None:
                kind = Kind.OVERRIDE if source == "tenant override" else Kind.DATE
                steps.append(_Step(_midnight(day, tz), i + 1, flag.name, day, source, kind))
        return steps

    def _shadows(self, own: TenantRollout, behaviour: Behaviour, base: Base, steps: list[_Step], tz: dt.tzinfo
                 ) -> list[_Window]:
        dated = Schedule(behaviour, base, steps, (), (), {})
        shadows = []
        for shadow, stz in self._listed(self.rollout.shadows, own.shadows, tz):
            if shadow.behaviour == behaviour.name:
                start = _instant(shadow.start, stz)
                phase = shadow.phase or behaviour.phases[min(dated._dated(start)[0] + 1, len(behaviour.phases) - 1)]
                shadows.append(self._window(shadow, phase, behaviour, stz))
        return shadows

    def _ramps(self, own: TenantRollout, behaviour: Behaviour, tz: dt.tzinfo) -> list[Ramp]:
        return [Ramp(behaviour.index(ramp.phase),
                     tuple((_midnight(step.start, rtz), step.share) for step in ramp.steps), self.key)
                for ramp, rtz in self._listed(self.rollout.ramps, own.ramps, tz) if ramp.behaviour == behaviour.name]

    def _listed(self, global_list: Sequence[_T], own_list: Sequence[_T] | None, tz: dt.tzinfo
                ) -> list[tuple[_T, dt.tzinfo]]:
        """The tenant's own list (its timezone) where it has one, else the global one (the global timezone)."""
        if own_list is None:
            return [(item, self.global_tz) for item in global_list]
        return [(item, tz) for item in own_list]

    @staticmethod
    def _window(item: Brownout | Shadow, phase: str, behaviour: Behaviour, tz: dt.tzinfo) -> _Window:
        start, end = _instant(item.start, tz), _instant(item.end, tz)
        label = (f"{dt.datetime.fromtimestamp(start, tz).isoformat()} to "
                 f"{dt.datetime.fromtimestamp(end, tz).isoformat()}")
        return _Window(start, end, behaviour.index(phase), label)


class _TenantSchedules(Mapping[str, Schedule]):
    """One tenant's schedules, each built when first asked for."""

    __slots__ = ("_builder", "_tenant", "_own", "_built")

    def __init__(self, builder: _Builder, tenant: Tenant, own: TenantRollout) -> None:
        self._builder = builder
        self._tenant = tenant
        self._own = own
        self._built: dict[str, Schedule] = {}

    def __getitem__(self, behaviour: str) -> Schedule:
        built = self._built.get(behaviour)
        if built is None:
            known = self._builder.behaviours[behaviour]
            built = self._built[behaviour] = self._builder.schedule(self._tenant, self._own, known)
        return built

    def __iter__(self) -> Iterator[str]:
        return iter(self._builder.behaviours)

    def __len__(self) -> int:
        return len(self._builder.behaviours)


class _Schedules(Mapping[str, Mapping[str, Schedule]]):
    """Every tenant's schedules, by tenant name, built when first asked for."""

    __slots__ = ("_builder", "_tenants", "_made", "behaviours")

    def __init__(self, builder: _Builder, tenants: Sequence[tuple[Tenant, TenantRollout]]) -> None:
        self._builder = builder
        self._tenants = {tenant.name: (tenant, own) for tenant, own in tenants}
        self._made: dict[str, _TenantSchedules] = {}
        self.behaviours = builder.behaviours

    def shared(self) -> dict[str, dict[Schedule, list[str]]]:
        """Per behaviour, each schedule in the plan and the tenants that have it, in the config's order (one pass
        over the tenants, without their own objects)."""
        builder = self._builder
        out: dict[str, dict[Schedule, list[str]]] = {}
        for name, known in builder.behaviours.items():
            groups = out[name] = {}
            for tenant, own in self._tenants.values():
                schedule = builder.schedule(tenant, own, known)
                found = groups.get(schedule)
                if found is None:
                    groups[schedule] = [tenant.name]
                else:
                    found.append(tenant.name)
        return out

    def __getitem__(self, name: str) -> _TenantSchedules:
        made = self._made.get(name)
        if made is None:
            tenant, own = self._tenants[name]
            made = self._made[name] = _TenantSchedules(self._builder, tenant, own)
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._tenants)

    def __len__(self) -> int:
        return len(self._tenants)


class RolloutPlan:
    """Every tenant's schedules (built when first asked for), from the config (and again on reload)."""

    def __init__(self, schedules: _Schedules, timezones: Mapping[str, str], preview: str | None = None) -> None:
        self.schedules: Mapping[str, Mapping[str, Schedule]] = schedules
        self._all = schedules
        self.timezones = timezones
        self.preview = preview  # the header a client previews a later phase with (None: off)
        self._shared: dict[str, dict[Schedule, list[str]]] | None = None

    @classmethod
    def build(cls, rollout: RolloutConfig, tenants: Sequence[tuple[Tenant, TenantRollout]],
              behaviours: Mapping[str, Behaviour]) -> RolloutPlan:
        timezones = {tenant.name: own.timezone or rollout.timezone for tenant, own in tenants}
        builder = _Builder(rollout, behaviours)
        return cls(_Schedules(builder, tenants), timezones, builder.preview)

    @property
    def behaviours(self) -> Mapping[str, Behaviour]:
        return self._all.behaviours

    def schedule(self, tenant: str, behaviour: str) -> Schedule:
        return self.schedules[tenant][behaviour]

    def decide(self, tenant: str, behaviour: str, now: dt.datetime,
               headers: Mapping[str, str] | None = None) -> Explained:
        return self.schedules[tenant][behaviour].decide(now.timestamp(), headers)

    def phase_samples(self, now: float, tenants: Iterable[str]) -> Iterator[tuple[str, str, str, float]]:
        """``gateway_rollout_phase`` at ``now``: (tenant, behaviour, phase, 1 for the phase in force else 0), for
        every dated behaviour and phase of ``tenants`` in this plan (a tenant no longer configured has none)."""
        schedules = self.schedules
        for tenant in tenants:
            per = schedules.get(tenant)
            for name, schedule in per.items() if per is not None else ():
                current = schedule.phase_index(now)
                for i, phase in enumerate(schedule.behaviour.phases):
                    yield tenant, name, phase, 1.0 if i == current else 0.0

    def phase_counts(self, now: float) -> Iterator[tuple[str, str, int]]:
        """(behaviour, phase, how many tenants are in it at ``now``) for every dated behaviour and phase."""
        for name, groups in self.shared().items():
            phases = self.behaviours[name].phases
            tally = [0] * len(phases)
            for schedule, tenants in groups.items():
                tally[schedule.phase_index(now)] += len(tenants)
            for phase, count in zip(phases, tally, strict=True):
                yield name, phase, count

    def shared(self) -> dict[str, dict[Schedule, list[str]]]:
        """Per behaviour, each distinct schedule of the plan and the tenants that have it (worked out once)."""
        shared = self._shared
        if shared is None:
            shared = self._shared = self._all.shared()
        return shared


def _instant(value: dt.datetime, tz: dt.tzinfo) -> float:
    """An instant of the config: one without an offset is read in ``tz``."""
    return (value if value.tzinfo else value.replace(tzinfo=tz)).timestamp()
