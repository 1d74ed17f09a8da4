"""The status page's data (admin ``/status.json``, and what ``/status`` renders): per company, each dated behaviour's
timeline and its requests per day from the usage ledger; per deprecated behaviour, the clients in the window; the
config in force, the last reload, the ledger's state and the build. Nothing that another admin endpoint does not
already serve; times are laid out for people once, here, so the renderers only place them."""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import json
import time
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..rollout import Clock, FixedClock, RolloutPlan, Schedule

if TYPE_CHECKING:
    from ..config import LoadedConfig

__all__ = ("ConfigHistory", "config_digest", "shown_config", "status_data")

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
    two processes serving the same configuration show the same digest. (A fraction of a millisecond: computed when
    asked, by the admin endpoints only.)"""
    text = json.dumps(shown_config(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


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
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min"
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


def _changes(schedule: Schedule) -> list[float]:
    """What the rollout is: the dates that change a phase, and brownout windows."""
    out: list[float] = [s.at for s in schedule.steps]
    for w in schedule.windows:
        out += [w.start, w.end]
    return out


def _others(schedule: Schedule) -> list[float]:
    """Dated events around it: signals (announcement) and the ends of exemptions."""
    return [e.until for e in schedule.exemptions] + [at for at in schedule.signals.values() if at is not None]


def _range(plan: RolloutPlan, now: float, usage_days: Sequence[float] = ()) -> _Range:
    schedules = [s for per in plan.schedules.values() for s in per.values()]
    core = [now, *usage_days, *(at for s in schedules for at in _changes(s))]
    low, high = min(core), max(core)
    if high - low < _MIN_SPAN:
        middle = (low + high) / 2
        low, high = middle - _MIN_SPAN / 2, middle + _MIN_SPAN / 2
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


def _ticks(scale: _Range) -> list[dict[str, Any]]:
    """Round dates (UTC) every day, week, month, quarter, year, decade...: at most _MAX_TICKS. The label's form
    follows the step (2026-10-05, 2026-10, 2026)."""
    days = (scale.end - scale.start) / _DAY
    unit, count = next(((u, c) for u, c in _STEPS if days / (_STEP_DAYS[u] * c) < _MAX_TICKS), _STEPS[-1])
    first = dt.datetime.fromtimestamp(scale.start, dt.UTC)
    out: list[dict[str, Any]] = []
    if unit == "day":
        # Whole days; steps of 7 and 14 fall on Mondays.
        moment = dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
        if count >= 7:
            moment += dt.timedelta(days=(7 - moment.weekday()) % 7)
        while moment.timestamp() <= scale.end:
            out.append({"pct": scale.pct(moment.timestamp()), "label": moment.strftime("%Y-%m-%d")})
            moment += dt.timedelta(days=count)
        return out
    if unit == "month":
        year, month = first.year, first.month + 1
        while (month - 1) % count:
            month += 1
        while True:
            year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
            ts = dt.datetime(year, month, 1, tzinfo=dt.UTC).timestamp()
            if ts > scale.end:
                return out
            out.append({"pct": scale.pct(ts), "label": f"{year}-{month:02d}"})
            month += count
    year = (first.year // count + 1) * count
    while True:
        ts = calendar.timegm((year, 1, 1, 0, 0, 0))
        if ts > scale.end:
            return out
        out.append({"pct": scale.pct(ts), "label": str(year)})
        year += count


def _state(start: float, end: float | None, now: float) -> str:
    if end is None:
        return "past" if start <= now else "ahead"
    if end <= now:
        return "past"
    return "now" if start <= now else "ahead"


def _date(ts: float, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d")


def _behaviour(schedule: Schedule, now: float, tz: dt.tzinfo, scale: _Range) -> dict[str, Any]:
    behaviour = schedule.behaviour
    phases = behaviour.phases
    count = len(phases)
    decision = schedule.decide(now)
    upcoming = schedule.next_change(now)
    # The phase by dates alone; brownouts are drawn over it.
    segments: list[tuple[float | None, float | None, int]] = []
    start: float | None = None
    index = schedule.base
    for step in schedule.steps:
        if step.index != index:
            segments.append((start, step.at, index))
            start, index = step.at, step.index
    segments.append((start, None, index))
    base_why = schedule.base_why.rstrip("; ")
    # The date (or the base) that puts the phase in force now, brownouts and exemptions aside.
    passed = sum(1 for step in schedule.steps if step.at <= now)

    def dated_state(position: int) -> str:  # 0: the base, i: the i-th step
        return "now" if position == passed else ("past" if position < passed else "ahead")

    events: list[dict[str, Any]] = [{
        "at": None, "when": "from the start", "kind": "base", "state": dated_state(0),
        "phase": phases[schedule.base], "severity": _severity(schedule.base, count),
        "text": f"{phases[schedule.base]} ({schedule.base_kind}{': ' + base_why if base_why else ''})",
    }]
    markers = []
    for flag in behaviour.signals:
        at = schedule.signals.get(flag.name)
        if at is None:
            events.append({"at": None, "when": "always", "kind": "signal", "state": "past", "phase": None,
                           "severity": None, "text": f"{flag.label}: {flag.unset}"})
            continue
        events.append({"at": at, "when": _local(at, tz), "kind": "signal", "state": _state(at, None, now),
                       "phase": None, "severity": None, "text": f"{flag.label} from here ({flag.name})"})
        markers.append({"pct": scale.pct(at), "kind": "signal", "far": scale.far(at), "date": _date(at, tz),
                        "name": flag.name, "label": f"{flag.name} {_local(at, tz)}"})
    for position, step in enumerate(schedule.steps, 1):
        events.append({"at": step.at, "when": _local(step.at, tz), "kind": "date", "state": dated_state(position),
                       "phase": phases[step.index], "severity": _severity(step.index, count),
                       "text": f"{step.flag} {step.date} ({step.source}): {phases[step.index]}"})
        markers.append({"pct": scale.pct(step.at), "kind": "date", "far": scale.far(step.at),
                        "date": _date(step.at, tz), "name": step.flag,
                        "label": f"{step.flag}: {phases[step.index]} from {_local(step.at, tz)}"})
    brownouts = []
    for window in schedule.windows:
        state = _state(window.start, window.end, now)
        text = f"brownout: {phases[window.index]} until {_local(window.end, tz)}"
        events.append({"at": window.start, "when": _local(window.start, tz), "kind": "brownout", "state": state,
                       "phase": phases[window.index], "severity": _severity(window.index, count), "text": text})
        brownouts.append({"from_pct": scale.pct(window.start), "to_pct": scale.pct(window.end), "state": state,
                          "phase": phases[window.index], "severity": _severity(window.index, count),
                          "label": f"brownout {phases[window.index]}: {_local(window.start, tz)} to "
                                   f"{_local(window.end, tz)}"})
    exemptions = []
    for exempt in schedule.exemptions:
        state = "now" if now < exempt.until else "past"
        keeps = phases[exempt.index]
        events.append({"at": exempt.until, "when": _local(exempt.until, tz), "kind": "exemption",
                       "state": "ahead" if state == "now" else "past", "phase": None, "severity": None,
                       "text": f"exemption {exempt.name!r} ends ({exempt.client} kept at most {keeps})"})
        exemptions.append({"name": exempt.name, "client": exempt.client, "phase": keeps, "state": state,
                           "until": _local(exempt.until, tz), "to_pct": scale.pct(exempt.until),
                           "far": scale.far(exempt.until)})
    events.sort(key=lambda e: (e["at"] is not None, e["at"] or 0.0))
    next_change = None
    if upcoming is not None:
        at, later = upcoming
        next_change = {"phase": later.phase, "severity": _severity(later.index, count), "at": _iso(at),
                       "when": _local(at, tz), "in": _duration_label(at - now), "why": later.why}
    return {
        "name": behaviour.name,
        "phases": list(phases),
        "phase": decision.phase,
        "severity": _severity(decision.index, count),
        "kind": decision.kind,
        "why": decision.why,
        "next": next_change,
        "segments": [
            {"from_pct": scale.pct(a, 0.0), "to_pct": scale.pct(b, 100.0), "phase": phases[i],
             "severity": _severity(i, count)}
            for a, b, i in segments
        ],
        "brownouts": brownouts,
        "markers": markers,
        "exemptions": exemptions,
        "events": [{k: v for k, v in event.items() if k != "at"} for event in events],
        "chart": None,
    }


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


def _chart(days: Mapping[int, int], scale: _Range) -> dict[str, Any] | None:
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
    bars = []
    for start, requests in sorted(bins.items()):
        end = _bin_end(start, unit)
        label = dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%d" if unit != "month" else "%Y-%m")
        bars.append({"from_pct": scale.pct(start), "to_pct": scale.pct(end),
                     "height_pct": round(requests / peak * 100, 2), "requests": requests,
                     "label": f"{'week of ' if unit == 'week' else ''}{label}: {requests:,} requests"})
    first, last = min(days), max(days)
    return {"unit": unit, "peak": peak, "total": sum(days.values()), "bars": bars,
            "first": dt.datetime.fromtimestamp(first, dt.UTC).strftime("%Y-%m-%d"),
            "last": dt.datetime.fromtimestamp(last, dt.UTC).strftime("%Y-%m-%d")}


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
) -> dict[str, Any]:
    """``usage``: the ledger's report over the page's window (``Store.report``'s shape, most recently seen first),
    None when it could not be read (``usage_problem`` says why); ``daily``: (tenant, behaviour, day, requests)
    rows for the charts; ``ledger``: ``Ledger.status()`` (None when the ledger is off)."""
    wall = time.time() if wall is None else wall
    moment = clock.now()
    now = moment.timestamp()
    utc = dt.UTC
    per_day: dict[tuple[str, str], dict[int, int]] = {}
    for tenant_name, behaviour_name, day, requests in daily:
        per_day.setdefault((tenant_name, behaviour_name), {})[day] = requests
    days = [day for _, _, day, _ in daily]
    scale = _range(plan, now, [min(days), max(days) + _DAY] if days else [])
    behaviours = usage["behaviours"] if usage is not None else {}
    window = _window_label(usage, wall) if usage is not None else ""
    tenants = []
    for tenant, schedules in plan.schedules.items():
        tz = zoneinfo.ZoneInfo(plan.timezones[tenant])
        blocks = []
        for schedule in schedules.values():
            block = _behaviour(schedule, now, tz, scale)
            block["chart"] = _chart(per_day.get((tenant, schedule.behaviour.name), {}), scale)
            blocks.append(block)
        tenants.append({
            "name": tenant,
            "timezone": plan.timezones[tenant],
            "local_now": _local(now, tz),
            "behaviours": blocks,
            "usage": [
                {"behaviour": name, "decisions": _most_first(decisions)}
                for name, report in sorted(behaviours.items())
                if (decisions := report["by_tenant"].get(tenant))
            ],
        })
    last = history.last_reload
    policies = []
    for name, report in sorted(behaviours.items()):
        rows = []
        for row in report["top_clients"]:
            seen = float(row["last_seen"])
            stopped = wall - seen > _STOPPED
            rows.append({
                "client": row["client"],
                "tenant": row["tenant"],
                "user_agent": row["user_agent"],
                "requests": row["requests"],
                "decisions": ", ".join(f"{d} {n}" for d, n in _most_first(row["decisions"])),
                "first_seen": _local(float(row["first_seen"]), utc),
                "last_seen": ("not seen since " if stopped else "") + _local(seen, utc),
                "last_seen_ago": _ago(wall - seen),
                "stopped": stopped,
            })
        policies.append({
            "name": name,
            "requests": report["requests"],
            "by_decision": _most_first(report["by_decision"]),
            "untracked": report["untracked_clients_requests"],
            "clients": report["clients"],
            "variants": report["variants"],
            "rows": rows,
        })
    return {
        "generated_at": _iso(wall),
        "generated": _local(wall, utc),
        "now": {"iso": moment.isoformat(), "label": _local(now, utc), "fixed": isinstance(clock, FixedClock)},
        "build": {"version": __version__},
        "config": {
            "source": config.source,
            "digest": config_digest(config),
            "loaded": _local(history.loaded_at, utc),
            "loaded_ago": _ago(wall - history.loaded_at),
            "last_reload": None if last is None else {
                "result": last.result, "at": _local(last.at, utc), "ago": _ago(wall - last.at),
                "problems": last.problems,
            },
            "reloads": {"success": history.successes, "failure": history.failures},
        },
        "ledger": None if ledger is None else _ledger(ledger, wall),
        "timeline": {"now_pct": scale.pct(now), "ticks": _ticks(scale), "start": _local(scale.start, utc),
                     "end": _local(scale.end, utc)},
        "tenants": tenants,
        "usage": {"window": window, "problem": usage_problem, "policies": policies},
    }


def _window_label(usage: Mapping[str, Any], wall: float) -> str:
    since = dt.datetime.fromisoformat(usage["since"]).timestamp()
    until = dt.datetime.fromisoformat(usage["until"]).timestamp()
    if until >= wall:
        return f"since {_local(since, dt.UTC)} ({_duration_label(wall - since)})"
    return f"{_local(since, dt.UTC)} to {_local(until, dt.UTC)}"


def _ledger(status: Mapping[str, Any], wall: float) -> dict[str, Any]:
    written = status["last_written"]
    return {
        "database": status["database"],
        "state": status["state"],
        "since": _local(status["since"], dt.UTC),
        "since_ago": _ago(wall - status["since"]),
        "error": status["error"],
        "written": "" if written is None else _ago(wall - written),
        "pending": status["pending"],
        "dropped": status["dropped"],
        "notice": status.get("notice") or "",
        "refused": "" if not status.get("refused") else (
            f"{status['refused']} request(s) whose rows the database refused, left out ({status.get('refused_why')})"),
        "flush_interval": f"{status['flush_interval']:g} s",
        "retention_days": status["retention_days"],
    }
