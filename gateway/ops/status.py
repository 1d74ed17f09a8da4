"""The status page's data (admin ``/status.json``, and what ``/status`` renders; its shape: ``status_model``): a
summary of every company (how many are in each phase, how many need attention), then a page of companies, those
that need attention first, each dated behaviour's timeline and its requests per day from the usage ledger; per
deprecated behaviour, the clients in the window; the clients to contact (readiness) and each company's count
per state; the config in force, the last reload, the ledger's state and the
build. Nothing that another admin endpoint does not already serve; times are laid out for people once, here, so the
renderer only places them. Built in a thread: at 10,000 companies, the work is per distinct schedule and per
company shown, a pass over the company names aside."""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import json
import time
import weakref
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import __version__
from ..rollout import Clock, FixedClock, RolloutPlan, Schedule
from .status_model import (
    Axis,
    Bar,
    BehaviourCensus,
    BehaviourTimeline,
    Chart,
    ClientRow,
    Company,
    CompanyPage,
    CompanyStates,
    ConfigState,
    ContactRow,
    Event,
    Exemption,
    LedgerState,
    Marker,
    NextChange,
    PhaseCount,
    PolicyUsage,
    RampStep,
    ReadinessSection,
    Segment,
    StatusData,
    Tick,
    UsageLine,
    UsageSection,
    Window,
)

if TYPE_CHECKING:
    from ..config import LoadedConfig

__all__ = ("PAGE_COMPANIES", "CompanyView", "ConfigHistory", "Selection", "config_digest", "readiness_section",
           "select_companies", "shown_config", "status_data")

_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class ReloadAttempt:
    result: str  # success | failure
    at: float
    problems: int  # a failure's number of problems (their text is in the log only)


class ConfigHistory:
    """When the config in force was loaded, and how the last reload (SIGHUP) went: kept by ``gateway serve``."""

    def __init__(self, loaded_at: float | None = None) -> None:
        self.loaded_at = time.time() if loaded_at is None else loaded_at
        self.last_reload: ReloadAttempt | None = None
        self.successes = 0
        self.failures = 0

    def reloaded(self, at: float | None = None) -> None:
        at = time.time() if at is None else at
        self.loaded_at = at
        self.last_reload = ReloadAttempt("success", at, 0)
        self.successes += 1

    def refused(self, problems: int, at: float | None = None) -> None:
        self.last_reload = ReloadAttempt("failure", time.time() if at is None else at, problems)
        self.failures += 1


def shown_config(config: LoadedConfig) -> dict[str, Any]:
    """The config as loaded (secrets as their references, credentials in URLs masked), with the rollout section's
    dates in force: what the admin ``/config`` serves."""
    data = config.shown()
    rollout = data.setdefault("rollout", {})
    for behaviour in config.behaviours.values():
        for flag in behaviour.all_flags():
            if flag.name not in rollout:
                value = config.model.rollout.dates().get(flag.name, flag.default)
                rollout[flag.name] = None if value is None else value.isoformat()
    return data


def config_digest(config: LoadedConfig) -> str:
    """``sha256:`` and the hex SHA-256 of ``/config``'s ``config`` object as canonical JSON (sorted keys, no spaces):
    two processes serving the same configuration show the same digest. Worked out once per config in force (at
    10,000 companies, a tenth of a second), a company at a time."""
    global _digest
    found = _digest
    if found is not None and found[0]() is config:
        return found[1]
    digest = "sha256:" + hashlib.sha256(_canonical(shown_config(config)).encode()).hexdigest()
    _digest = (weakref.ref(config), digest)
    return digest


_digest: tuple[weakref.ref[LoadedConfig], str] | None = None


def _canonical(data: Mapping[str, Any]) -> str:
    """``json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, a list item of the top level
    at a time (the C encoder holds the GIL for a whole call)."""
    parts = []
    for key in sorted(data):
        value = data[key]
        text = ("[" + ",".join(_json(item) for item in value) + "]") if isinstance(value, list) else _json(value)
        parts.append(_json(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- formatting -----------------------------------------------------------------------------------------------


def _local(ts: float, tz: dt.tzinfo) -> str:
    moment = dt.datetime.fromtimestamp(ts, tz)
    return moment.strftime("%Y-%m-%d %H:%M") + (f" {moment.tzname()}" if moment.tzname() else "")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def _duration_label(seconds: float) -> str:
    """``3 d 4 h``, ``5 h 10 min``, ``12 min``, ``45 s``: two units at most."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    # The largest unit present, with the next one when it is not zero (minutes are shown alone).
    units = ((days, "d", hours, "h"), (hours, "h", minutes, "min"), (minutes, "min", 0, ""))
    for amount, unit, more, more_unit in units:
        if amount:
            return f"{amount} {unit} {more} {more_unit}" if more else f"{amount} {unit}"
    return f"{secs} s"


def _ago(seconds: float) -> str:
    return "just now" if seconds < 60 else f"{_duration_label(seconds)} ago"


def _most_first(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """Decisions and their requests, most requests first (then by name)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _severity(index: int, phases: int) -> int:
    """0 (green), 1 (amber), 2 (red): a behaviour's first phase, the ones between, its last."""
    if index == 0:
        return 0
    return 2 if index == phases - 1 else 1


# --- the timelines ----------------------------------------------------------------------------------------------
#
# One axis for every timeline and chart of the page, so that companies line up, readable at any span: it covers the
# rollout (now, every dated change of phase, brownouts, the days the ledger has usage for) and the other dated
# events near it; an event far from it (an exemption until 2099, an announcement years back) is drawn at the axis'
# edge with its date. Its ticks are at most _MAX_TICKS, on round dates, so their labels never overlap.

_MIN_SPAN = 60 * _DAY
_PAD = 0.04
_MAX_TICKS = 8


@dataclass(frozen=True, slots=True)
class _Range:
    start: float
    end: float

    def pct(self, ts: float | None, default: float = 0.0) -> float:
        if ts is None:
            return default
        return round(min(100.0, max(0.0, (ts - self.start) / (self.end - self.start) * 100)), 3)

    def far(self, ts: float | None) -> str | None:
        """``before`` or ``after`` for an instant off the axis (drawn at its edge), else None."""
        if ts is None or self.start <= ts <= self.end:
            return None
        return "before" if ts < self.start else "after"


def _others(schedule: Schedule) -> list[float]:
    """Dated events around it: signals (announcement) and the ends of exemptions."""
    return [e.until for e in schedule.exemptions] + [at for at in schedule.signals.values() if at is not None]


def _core(now: float, usage_days: Sequence[float], schedules: list[Schedule]) -> tuple[float, float]:
    """The span of now, the days with usage and the rollout's changes (the dates that change a phase, brownout and
    shadow windows, ramps' steps, a freeze): at least _MIN_SPAN, around its middle."""
    core = [now, *usage_days, *(at for s in schedules for at in s.boundaries())]
    low, high = min(core), max(core)
    if high - low < _MIN_SPAN:
        middle = (low + high) / 2
        low, high = middle - _MIN_SPAN / 2, middle + _MIN_SPAN / 2
    return low, high


def _range(plan: RolloutPlan, now: float, usage_days: Sequence[float] = ()) -> _Range:
    """Over every company: the plan's distinct schedules (companies alike share theirs)."""
    schedules = [s for groups in plan.shared().values() for s in groups]
    low, high = _core(now, usage_days, schedules)
    reach = high - low  # an event within one span of the rollout widens the axis to it; one further is "far"
    near = [at for s in schedules for at in _others(s) if low - reach <= at <= high + reach]
    low, high = min([low, *near]), max([high, *near])
    pad = (high - low) * _PAD
    return _Range(low - pad, high + pad)


# Tick steps, finest first: (unit, count); the first that gives at most _MAX_TICKS ticks over the span is used.
_STEPS: tuple[tuple[str, int], ...] = (
    ("day", 1), ("day", 2), ("day", 7), ("day", 14), ("month", 1), ("month", 2), ("month", 3), ("month", 6),
    ("year", 1), ("year", 2), ("year", 5), ("year", 10), ("year", 20), ("year", 50), ("year", 100), ("year", 1000),
)
_STEP_DAYS = {"day": 1.0, "month": 30.44, "year": 365.25}


def _ticks(scale: _Range) -> list[Tick]:
    """Round dates (UTC) every day, week, month, quarter, year, decade...: at most _MAX_TICKS. The label's form
    follows the step (2026-10-05, 2026-10, 2026)."""
    days = (scale.end - scale.start) / _DAY
    unit, count = next(((u, c) for u, c in _STEPS if days / (_STEP_DAYS[u] * c) < _MAX_TICKS), _STEPS[-1])
    first = dt.datetime.fromtimestamp(scale.start, dt.UTC)
    ticks = _day_ticks if unit == "day" else _month_ticks if unit == "month" else _year_ticks
    return ticks(scale, first, count)


def _day_ticks(scale: _Range, first: dt.datetime, count: int) -> list[Tick]:
    # Whole days; steps of 7 and 14 fall on Mondays.
    out: list[Tick] = []
    moment = dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    if count >= 7:
        moment += dt.timedelta(days=(7 - moment.weekday()) % 7)
    while moment.timestamp() <= scale.end:
        out.append(Tick(pct=scale.pct(moment.timestamp()), label=moment.strftime("%Y-%m-%d")))
        moment += dt.timedelta(days=count)
    return out


def _month_ticks(scale: _Range, first: dt.datetime, count: int) -> list[Tick]:
    out: list[Tick] = []
    year, month = first.year, first.month + 1
    while (month - 1) % count:
        month += 1
    while True:
        year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
        ts = dt.datetime(year, month, 1, tzinfo=dt.UTC).timestamp()
        if ts > scale.end:
            return out
        out.append(Tick(pct=scale.pct(ts), label=f"{year}-{month:02d}"))
        month += count


def _year_ticks(scale: _Range, first: dt.datetime, count: int) -> list[Tick]:
    out: list[Tick] = []
    year = (first.year // count + 1) * count
    while True:
        ts = calendar.timegm((year, 1, 1, 0, 0, 0))
        if ts > scale.end:
            return out
        out.append(Tick(pct=scale.pct(ts), label=str(year)))
        year += count


def _state(start: float, end: float | None, now: float) -> str:
    if end is None:
        return "past" if start <= now else "ahead"
    if end <= now:
        return "past"
    return "now" if start <= now else "ahead"


def _date(ts: float, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d")


@dataclass(slots=True)
class _Drawn:
    """One behaviour's timeline as it is put together: its events (with their instants, to sort them), markers,
    windows and exemptions."""

    schedule: Schedule
    now: float
    tz: dt.tzinfo
    scale: _Range
    events: list[tuple[float | None, Event]]
    markers: list[Marker]

    @property
    def phases(self) -> tuple[str, ...]:
        return self.schedule.behaviour.phases

    def severity(self, index: int) -> int:
        return _severity(index, len(self.phases))

    def event(self, at: float | None, when: str, kind: str, state: str, index: int | None, text: str) -> None:
        phase, severity = (None, None) if index is None else (self.phases[index], self.severity(index))
        self.events.append((at, Event(when=when, kind=kind, state=state, phase=phase, severity=severity, text=text)))

    def marker(self, at: float, kind: str, name: str, label: str) -> None:
        self.markers.append(Marker(pct=self.scale.pct(at), kind=kind, far=self.scale.far(at),
                                   date=_date(at, self.tz), name=name, label=label))


def _behaviour(schedule: Schedule, now: float, tz: dt.tzinfo, scale: _Range) -> BehaviourTimeline:
    drawn = _Drawn(schedule, now, tz, scale, [], [])
    _dated(drawn)
    _signals(drawn)
    brownouts = _brownouts(drawn)
    shadows = _shadows(drawn)
    ramps = _ramps(drawn)
    _freeze(drawn)
    exemptions = _exemptions(drawn)
    decision = schedule.decide(now)
    drawn.events.sort(key=lambda item: (item[0] is not None, item[0] or 0.0))
    return BehaviourTimeline(
        name=schedule.behaviour.name, phases=list(drawn.phases), phase=decision.phase,
        severity=drawn.severity(decision.index), kind=decision.kind, why=decision.why, next=_next(drawn),
        segments=_segments(drawn), brownouts=brownouts, shadows=shadows, ramps=ramps, markers=drawn.markers,
        exemptions=exemptions,
        events=[event for _, event in drawn.events], chart=None,
    )


def _segments(drawn: _Drawn) -> list[Segment]:
    """The phase by dates alone; brownouts are drawn over it."""
    schedule, scale = drawn.schedule, drawn.scale
    spans: list[tuple[float | None, float | None, int]] = []
    start: float | None = None
    index = schedule.base
    for step in schedule.steps:
        if step.index != index:
            spans.append((start, step.at, index))
            start, index = step.at, step.index
    spans.append((start, None, index))
    return [Segment(from_pct=scale.pct(a, 0.0), to_pct=scale.pct(b, 100.0), phase=drawn.phases[i],
                    severity=drawn.severity(i)) for a, b, i in spans]


def _dated(drawn: _Drawn) -> None:
    """The base phase and each date, marked done, in force (the one that puts the phase in force now, brownouts and
    exemptions aside) or ahead."""
    schedule, tz, phases = drawn.schedule, drawn.tz, drawn.phases
    passed = sum(1 for step in schedule.steps if step.at <= drawn.now)

    def state(position: int) -> str:  # 0: the base, i: the i-th step
        return "now" if position == passed else ("past" if position < passed else "ahead")

    why = schedule.base_why.rstrip("; ")
    drawn.event(None, "from the start", "base", state(0), schedule.base,
                f"{phases[schedule.base]} ({schedule.base_kind}{': ' + why if why else ''})")
    for position, step in enumerate(schedule.steps, 1):
        drawn.event(step.at, _local(step.at, tz), "date", state(position), step.index,
                    f"{step.flag} {step.date} ({step.source}): {phases[step.index]}")
        drawn.marker(step.at, "date", step.flag, f"{step.flag}: {phases[step.index]} from {_local(step.at, tz)}")


def _signals(drawn: _Drawn) -> None:
    for flag in drawn.schedule.behaviour.signals:
        at = drawn.schedule.signals.get(flag.name)
        if at is None:
            drawn.event(None, "always", "signal", "past", None, f"{flag.label}: {flag.unset}")
            continue
        drawn.event(at, _local(at, drawn.tz), "signal", _state(at, None, drawn.now), None,
                    f"{flag.label} from here ({flag.name})")
        drawn.marker(at, "signal", flag.name, f"{flag.name} {_local(at, drawn.tz)}")


def _brownouts(drawn: _Drawn) -> list[Window]:
    return _windows(drawn, drawn.schedule.windows, "brownout", "until", "")


def _shadows(drawn: _Drawn) -> list[Window]:
    return _windows(drawn, drawn.schedule.shadows, "shadow", "decided and recorded, not applied, until",
                    " (recorded, not applied)")


class _PlanWindow(Protocol):
    """A window of a schedule (``Schedule.windows``, ``Schedule.shadows``)."""

    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def index(self) -> int: ...


def _windows(drawn: _Drawn, windows: Sequence[_PlanWindow], kind: str, until: str, note: str) -> list[Window]:
    """Windows in a later phase (``kind``: a brownout applied, a shadow only recorded), each an event and a bar."""
    out = []
    tz, scale = drawn.tz, drawn.scale
    for window in windows:
        state = _state(window.start, window.end, drawn.now)
        phase = drawn.phases[window.index]
        drawn.event(window.start, _local(window.start, tz), kind, state, window.index,
                    f"{kind}: {phase} {until} {_local(window.end, tz)}")
        out.append(Window(from_pct=scale.pct(window.start), to_pct=scale.pct(window.end), state=state, phase=phase,
                          severity=drawn.severity(window.index),
                          label=f"{kind} {phase}{note}: {_local(window.start, tz)} to {_local(window.end, tz)}"))
    return out


def _ramps(drawn: _Drawn) -> list[RampStep]:
    """Each ramp's steps, each until the next, the last until the date that puts its phase in force for everyone."""
    out = []
    schedule = drawn.schedule
    for ramp in schedule.ramps:
        dated = next((step.at for step in schedule.steps if step.index >= ramp.index), None)
        ends = [at for at, _ in ramp.steps[1:]] + [dated]
        out += [_ramp_step(drawn, ramp.index, at, share, end)
                for (at, share), end in zip(ramp.steps, ends, strict=True)]
    return out


def _ramp_step(drawn: _Drawn, index: int, at: float, share: float, end: float | None) -> RampStep:
    """One step of a ramp to the phase ``index``, until ``end`` (None: no date puts that phase in force)."""
    tz, phase = drawn.tz, drawn.phases[index]
    state = _state(at, end, drawn.now)
    until = f" until {_local(end, tz)}" if end is not None else ""
    drawn.event(at, _local(at, tz), "ramp", state, index, f"ramp: {share:g}% of clients {phase}{until}")
    return RampStep(from_pct=drawn.scale.pct(at), to_pct=drawn.scale.pct(end, 100.0), share=share, state=state,
                    phase=phase, severity=drawn.severity(index),
                    label=f"ramp: {share:g}% of clients {phase} from {_local(at, tz)}{until}")


def _freeze(drawn: _Drawn) -> None:
    freeze = drawn.schedule.freeze
    if freeze is None:
        return
    tz, phase = drawn.tz, drawn.phases[freeze.index]
    drawn.event(freeze.at, _local(freeze.at, tz), "freeze", _state(freeze.at, None, drawn.now), freeze.index,
                f"freeze: a client first seen from here gets {phase} at once")
    drawn.marker(freeze.at, "freeze", "freeze", f"freeze: new clients {phase} from {_local(freeze.at, tz)}")


def _exemptions(drawn: _Drawn) -> list[Exemption]:
    out = []
    tz, scale = drawn.tz, drawn.scale
    for exempt in drawn.schedule.exemptions:
        state = "now" if drawn.now < exempt.until else "past"
        keeps = drawn.phases[exempt.index]
        drawn.event(exempt.until, _local(exempt.until, tz), "exemption", "ahead" if state == "now" else "past", None,
                    f"exemption {exempt.name!r} ends ({exempt.client} kept at most {keeps})")
        out.append(Exemption(name=exempt.name, client=exempt.client, phase=keeps, state=state,
                             until=_local(exempt.until, tz), to_pct=scale.pct(exempt.until),
                             far=scale.far(exempt.until)))
    return out


def _next(drawn: _Drawn) -> NextChange | None:
    upcoming = drawn.schedule.next_change(drawn.now)
    if upcoming is None:
        return None
    at, later = upcoming
    change: NextChange = {"phase": later.phase, "severity": drawn.severity(later.index), "at": _iso(at),
                          "when": _local(at, drawn.tz), "in": _duration_label(at - drawn.now), "why": later.why}
    return change


# --- the usage charts -------------------------------------------------------------------------------------------


def _bin_start(day: int, unit: str) -> int:
    if unit == "day":
        return day
    if unit == "week":  # Mondays (1970-01-05 was one)
        return day - (day // 86400 - 4) % 7 * 86400
    moment = dt.datetime.fromtimestamp(day, dt.UTC)
    return calendar.timegm((moment.year, moment.month, 1, 0, 0, 0))


def _bin_end(start: int, unit: str) -> int:
    if unit == "day":
        return start + 86400
    if unit == "week":
        return start + 7 * 86400
    moment = dt.datetime.fromtimestamp(start, dt.UTC)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


def _chart(days: Mapping[int, int], scale: _Range) -> Chart | None:
    """Requests per day (UTC) as bars on the page's axis; per week or per month when days would be under a pixel
    or two wide. None when there is nothing."""
    if not days:
        return None
    span = (scale.end - scale.start) / _DAY
    unit = "day" if span <= 150 else "week" if span <= 3 * 366 else "month"
    bins: dict[int, int] = {}
    for day, requests in days.items():
        start = _bin_start(day, unit)
        bins[start] = bins.get(start, 0) + requests
    peak = max(bins.values())
    bars = [_bar(start, requests, unit, peak, scale) for start, requests in sorted(bins.items())]
    first, last = min(days), max(days)
    return Chart(unit=unit, peak=peak, total=sum(days.values()), bars=bars,
                 first=dt.datetime.fromtimestamp(first, dt.UTC).strftime("%Y-%m-%d"),
                 last=dt.datetime.fromtimestamp(last, dt.UTC).strftime("%Y-%m-%d"))


def _bar(start: int, requests: int, unit: str, peak: int, scale: _Range) -> Bar:
    """One bin's bar: its height against the chart's peak, its label the bin's first day (its month)."""
    label = dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%d" if unit != "month" else "%Y-%m")
    return Bar(from_pct=scale.pct(start), to_pct=scale.pct(_bin_end(start, unit)),
               height_pct=round(requests / peak * 100, 2), requests=requests,
               label=f"{'week of ' if unit == 'week' else ''}{label}: {requests:,} requests")


# --- which companies the page shows -------------------------------------------------------------------------------

# Companies per page: their timelines are the page's weight (a few kB each).
PAGE_COMPANIES = 20
# A change of phase this close needs attention from a company whose clients still use the behaviour, and this
# close from any company.
_AHEAD = 30 * _DAY
_SOON = 7 * _DAY


@dataclass(frozen=True, slots=True)
class CompanyView:
    """The page's choice of companies, from its query: ``company`` (a part of the name, any case), ``phase``
    (``behaviour:phase``: the companies in it now) and ``page`` (from 1)."""

    company: str = ""
    phase: str = ""
    page: int = 1

    @classmethod
    def of(cls, params: Mapping[str, str]) -> CompanyView:
        """ValueError naming a bad parameter (400)."""
        company = params.get("company", "").strip()
        if len(company) > 64:
            raise ValueError("company must be at most 64 characters (a part of a company's name)")
        phase = params.get("phase", "").strip()
        if phase and (len(phase) > 130 or phase.count(":") != 1):
            raise ValueError("phase must be behaviour:phase, as the page's summary links it")
        return cls(company, phase, _page(params.get("page", "1")))


def _page(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 1 <= len(text) <= 6 and int(text) >= 1):
        raise ValueError("page must be an integer from 1")
    return int(text)


@dataclass(frozen=True, slots=True)
class Selection:
    """The companies of one page, in order, with why each needs attention; and what the page says of the rest."""

    names: list[str]
    attention: dict[str, list[str]]
    page: CompanyPage


def select_companies(plan: RolloutPlan, now: float, usage: Mapping[str, Any] | None, view: CompanyView,
                     per_page: int = PAGE_COMPANIES) -> Selection:
    """Every company of the plan counted per phase; those the view keeps, the ones that need attention first (the
    config's order among equals); the view's page of them. ``usage``: the ledger's report over the page's window."""
    needs = _needs(plan, now, usage)
    census, in_phase = _census(plan, now, view.phase)
    kept = _kept(plan.timezones, view.company.lower(), in_phase)
    kept.sort(key=lambda name: needs[name][0] if name in needs else len(_RANKS))
    pages = max(1, -(-len(kept) // per_page))
    first = (min(view.page, pages) - 1) * per_page
    names = kept[first:first + per_page]
    page = CompanyPage(total=len(plan.timezones), attention=len(needs), census=census, company=view.company,
                       phase=view.phase, matching=len(kept), page=min(view.page, pages), pages=pages,
                       first=first + 1 if names else 0, last=first + len(names))
    return Selection(names, {name: needs[name][1] for name in names if name in needs}, page)


def _kept(companies: Iterable[str], wanted: str, in_phase: set[str] | None) -> list[str]:
    """The companies whose name holds ``wanted`` (lowercase; empty: every one), of ``in_phase`` (None: any)."""
    return [name for name in companies
            if (not wanted or wanted in name.lower()) and (in_phase is None or name in in_phase)]


# Why a company needs attention, most pressing first (the index is its rank).
_RANKS = ("affected", "change ahead", "in use", "change soon")


def _needs(plan: RolloutPlan, now: float, usage: Mapping[str, Any] | None) -> dict[str, tuple[int, list[str]]]:
    """The companies that need attention: (rank, reasons, most pressing first). Worked out per distinct schedule,
    then per company only where it used deprecated behaviour in the window or its schedule changes soon."""
    used = _by_tenant(usage)
    found: dict[str, list[tuple[int, str]]] = {}
    for behaviour, groups in plan.shared().items():
        by_tenant = used.get(behaviour, {})
        for schedule, tenants in groups.items():
            _say_why(found, _reason(behaviour, schedule, now), tenants, by_tenant)
    return {tenant: (min(rank for rank, _ in said), [text for _, text in sorted(said)])
            for tenant, said in found.items()}


def _by_tenant(usage: Mapping[str, Any] | None) -> dict[str, Mapping[str, Mapping[str, int]]]:
    """Per behaviour, each company's requests by decision in the window (none when the ledger was not read)."""
    return {name: report["by_tenant"] for name, report in usage["behaviours"].items()} if usage is not None else {}


def _say_why(found: dict[str, list[tuple[int, str]]], reason: Callable[[int], tuple[int, str] | None],
             tenants: Iterable[str], by_tenant: Mapping[str, Mapping[str, int]]) -> None:
    """Each company of one schedule that needs attention: its reason, from its requests in the window."""
    for tenant in tenants:
        said = reason(sum(by_tenant.get(tenant, {}).values()))
        if said is not None:
            found.setdefault(tenant, []).append(said)


def _reason(behaviour: str, schedule: Schedule, now: float) -> Callable[[int], tuple[int, str] | None]:
    """For one schedule: requests in the window -> (rank, why), or None when that needs no attention."""
    index = schedule.phase_index(now)
    phases = schedule.behaviour.phases
    upcoming = schedule.next_change(now)
    ahead = None if upcoming is None else upcoming[0] - now
    change = "" if upcoming is None else f"{upcoming[1].phase} in {_duration_label(upcoming[0] - now)}"

    def why(requests: int) -> tuple[int, str] | None:
        used = f"{behaviour}: {requests:,} request{'' if requests == 1 else 's'} in the window"
        if requests and index == len(phases) - 1:
            return 0, f"{used}, {phases[index]} now"
        if requests and ahead is not None and ahead <= _AHEAD:
            return 1, f"{used}, {change}"
        if requests:
            return 2, used
        if ahead is not None and ahead <= _SOON:
            return 3, f"{behaviour}: {change}"
        return None

    return why


def _census(plan: RolloutPlan, now: float, wanted: str) -> tuple[list[BehaviourCensus], set[str] | None]:
    """Every company counted per behaviour and phase; the companies of the ``wanted`` one (None: no filter)."""
    census: list[BehaviourCensus] = []
    chosen: set[str] | None = None if not wanted else set()
    for behaviour, groups in plan.shared().items():
        phases = plan.behaviours[behaviour].phases
        counts = [0] * len(phases)
        for schedule, tenants in groups.items():
            index = schedule.phase_index(now)
            counts[index] += len(tenants)
            if chosen is not None and wanted == f"{behaviour}:{phases[index]}":
                chosen.update(tenants)
        census.append(_behaviour_census(behaviour, phases, counts))
    return census, chosen


def _behaviour_census(behaviour: str, phases: Sequence[str], counts: list[int]) -> BehaviourCensus:
    return BehaviourCensus(name=behaviour, phases=[
        PhaseCount(phase=phase, severity=_severity(i, len(phases)), companies=counts[i],
                   filter=f"{behaviour}:{phase}") for i, phase in enumerate(phases)])


# --- readiness: the clients to contact -------------------------------------------------------------------------




def _stamp(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def _next_text(upcoming: Mapping[str, Any] | None, now: float) -> str:
    if upcoming is None:
        return "no change scheduled"
    at = _stamp(upcoming["at"])
    return (f"{upcoming['phase']} at {_local(at, dt.UTC)}, in {_duration_label(at - now)}: {upcoming['why']}"
            + ("; its bridge applies" if upcoming["bridge"] else ""))


def _notes(row: Mapping[str, Any]) -> str:
    notes = []
    if row["previewing"]:
        notes.append("previews a later phase (testing its migration)")
    if row["shadowed"]:
        notes.append("a shadow window records what the next phase would do to it")
    if row["refused_7_days"] and row["state"] != "blocked":
        notes.append(f"{row['refused_7_days']} of its calls refused in the last 7 days")
    return "; ".join(notes)


def readiness_section(ready: Mapping[str, Any] | None, problem: str | None, wall: float, now: float
                      ) -> ReadinessSection:
    """The page's readiness, from ``readiness.Readiness.to_json`` (without its ready clients); ``problem`` when it
    could not be read."""
    if ready is None:
        return ReadinessSection(problem=problem or "not read", quiet_days=0, window_days=0, still_calling=0,
                                internal_clients=0, companies=[], contacts=[], more=0)
    companies = _company_states(ready["totals"])
    contacts = [_contact_row(row, wall, now) for row in ready["clients"]]
    return ReadinessSection(problem=None, quiet_days=ready["quiet_days"], window_days=ready["window_days"],
                            still_calling=ready["still_calling"], internal_clients=ready["internal_clients"],
                            companies=companies, contacts=contacts, more=ready["to_contact"] - len(contacts))


def _company_states(totals: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[CompanyStates]:
    """External clients per company and behaviour, by state."""
    return [CompanyStates(tenant=tenant, behaviour=behaviour, blocked=counts["blocked"], overdue=counts["overdue"],
                          calling=counts["calling"], ready=counts["ready"])
            for tenant, per in totals.items() for behaviour, counts in per.items()]


def _contact_row(row: Mapping[str, Any], wall: float, now: float) -> ContactRow:
    """A client to contact: its last call against the wall clock, its next change against the rollout's."""
    last = _stamp(row["last_call"])
    return ContactRow(
        tenant=row["tenant"], behaviour=row["behaviour"], client=row["client"], name=row["name"],
        owner=row["owner"], internal=row["internal"], user_agent=row["user_agent"], state=row["state"],
        example=row["example"], rule=row["rule"], last_call=_local(last, dt.UTC), last_call_ago=_ago(wall - last),
        trend=row["trend"], recent=f"{row['last_7_days']} in the last 7 days, {row['previous_7_days']} the 7 before",
        next=_next_text(row["next"], now), notes=_notes(row))


# --- the page's data --------------------------------------------------------------------------------------------

_STOPPED = _DAY  # a client not seen for longer is shown as "not seen since"


def status_data(
    *,
    config: LoadedConfig,
    plan: RolloutPlan,
    clock: Clock,
    history: ConfigHistory,
    usage: Mapping[str, Any] | None,
    daily: Sequence[tuple[str, str, int, int]] = (),
    ledger: Mapping[str, Any] | None = None,
    usage_problem: str | None = None,
    wall: float | None = None,
    selection: Selection | None = None,
    readiness: Mapping[str, Any] | None = None,
) -> StatusData:
    """``usage``: the ledger's report over the page's window (``Store.report``'s shape, most recently seen first),
    None when it could not be read (``usage_problem`` says why); ``daily``: (tenant, behaviour, day, requests)
    rows for the charts of the companies shown; ``ledger``: ``Ledger.status()`` (None when the ledger is off);
    ``selection``: the companies shown (``select_companies``; by default the first page); ``readiness``: the clients
    to contact (``Readiness.to_json``, without the ready ones)."""
    wall = time.time() if wall is None else wall
    moment = clock.now()
    now = moment.timestamp()
    if selection is None:
        selection = select_companies(plan, now, usage, CompanyView())
    scale = _range(plan, now, _usage_days(daily))
    return StatusData(
        generated_at=_iso(wall), generated=_local(wall, dt.UTC),
        now={"iso": moment.isoformat(), "label": _local(now, dt.UTC), "fixed": isinstance(clock, FixedClock)},
        build={"version": __version__},
        config=_config_state(config, history, wall),
        ledger=None if ledger is None else _ledger(ledger, wall),
        timeline=Axis(now_pct=scale.pct(now), ticks=_ticks(scale), start=_local(scale.start, dt.UTC),
                      end=_local(scale.end, dt.UTC)),
        companies=selection.page,
        tenants=_companies(plan, now, scale, usage, daily, selection),
        usage=_usage_section(usage, usage_problem, wall),
        readiness=readiness_section(readiness, usage_problem, wall, now),
    )


def _usage_days(daily: Sequence[tuple[str, str, int, int]]) -> list[float]:
    """The span of the charts' days (the last one whole), for the axis; none without any."""
    days = [day for _, _, day, _ in daily]
    return [min(days), max(days) + _DAY] if days else []


def _usage_section(usage: Mapping[str, Any] | None, problem: str | None, wall: float) -> UsageSection:
    return {"window": _window_label(usage, wall) if usage is not None else "", "problem": problem,
            "policies": _policies(usage, wall)}


def _companies(plan: RolloutPlan, now: float, scale: _Range, usage: Mapping[str, Any] | None,
               daily: Sequence[tuple[str, str, int, int]], selection: Selection) -> list[Company]:
    per_day: dict[tuple[str, str], dict[int, int]] = {}
    for tenant_name, behaviour_name, day, requests in daily:
        per_day.setdefault((tenant_name, behaviour_name), {})[day] = requests
    behaviours = usage["behaviours"] if usage is not None else {}
    out = []
    for tenant in selection.names:
        tz = zoneinfo.ZoneInfo(plan.timezones[tenant])
        blocks = []
        for schedule in plan.schedules[tenant].values():
            block = _behaviour(schedule, now, tz, scale)
            block["chart"] = _chart(per_day.get((tenant, schedule.behaviour.name), {}), scale)
            blocks.append(block)
        out.append(Company(
            name=tenant, timezone=plan.timezones[tenant], local_now=_local(now, tz),
            attention=selection.attention.get(tenant, []), behaviours=blocks, usage=_usage_lines(behaviours, tenant)))
    return out


def _usage_lines(behaviours: Mapping[str, Any], tenant: str) -> list[UsageLine]:
    """A company's decisions per behaviour in the window, those it has any of."""
    return [UsageLine(behaviour=name, decisions=_most_first(decisions))
            for name, report in sorted(behaviours.items()) if (decisions := report["by_tenant"].get(tenant))]


def _config_state(config: LoadedConfig, history: ConfigHistory, wall: float) -> ConfigState:
    last = history.last_reload
    return ConfigState(
        source=config.source, digest=config_digest(config), loaded=_local(history.loaded_at, dt.UTC),
        loaded_ago=_ago(wall - history.loaded_at),
        last_reload=None if last is None else {"result": last.result, "at": _local(last.at, dt.UTC),
                                               "ago": _ago(wall - last.at), "problems": last.problems},
        reloads={"success": history.successes, "failure": history.failures},
    )


def _policies(usage: Mapping[str, Any] | None, wall: float) -> list[PolicyUsage]:
    behaviours = usage["behaviours"] if usage is not None else {}
    return [PolicyUsage(name=name, requests=report["requests"], by_decision=_most_first(report["by_decision"]),
                        untracked=report["untracked_clients_requests"], clients=report["clients"],
                        variants=report["variants"], rows=[_client(row, wall) for row in report["top_clients"]])
            for name, report in sorted(behaviours.items())]


def _client(row: Mapping[str, Any], wall: float) -> ClientRow:
    seen = float(row["last_seen"])
    stopped = wall - seen > _STOPPED
    return ClientRow(
        client=row["client"], name=row.get("name"), tenant=row["tenant"], user_agent=row["user_agent"],
        requests=row["requests"],
        decisions=", ".join(f"{d} {n}" for d, n in _most_first(row["decisions"])),
        first_seen=_local(float(row["first_seen"]), dt.UTC),
        last_seen=("not seen since " if stopped else "") + _local(seen, dt.UTC), last_seen_ago=_ago(wall - seen),
        stopped=stopped,
    )


def _window_label(usage: Mapping[str, Any], wall: float) -> str:
    since = dt.datetime.fromisoformat(usage["since"]).timestamp()
    until = dt.datetime.fromisoformat(usage["until"]).timestamp()
    if until >= wall:
        return f"since {_local(since, dt.UTC)} ({_duration_label(wall - since)})"
    return f"{_local(since, dt.UTC)} to {_local(until, dt.UTC)}"


def _ledger(status: Mapping[str, Any], wall: float) -> LedgerState:
    written = status["last_written"]
    return LedgerState(
        database=status["database"],
        state=status["state"],
        since=_local(status["since"], dt.UTC),
        since_ago=_ago(wall - status["since"]),
        error=status["error"],
        written="" if written is None else _ago(wall - written),
        pending=status["pending"],
        dropped=status["dropped"],
        notice=status.get("notice") or "",
        refused="" if not status.get("refused") else (
            f"{status['refused']} request(s) whose rows the database refused, left out ({status.get('refused_why')})"),
        flush_interval=f"{status['flush_interval']:g} s",
        retention_days=status["retention_days"],
    )
