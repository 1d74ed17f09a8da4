"""The status page's data (admin ``/status.json``, and what ``/status`` renders): per company, each dated behaviour as
a timeline with the phase in force and the next change; per deprecated behaviour, the requests in the usage window
and the top clients; the config in force, the last reload and the build.

Everything here is already served by another admin endpoint: the config as ``/config`` shows it (its digest is of
that), phases, brownouts and exemptions as ``/config`` and ``/rollout`` give them, clients as ``/deprecations``
lists them (token fingerprints, never tokens), the version and the reloads as ``/metrics`` counts them. A failed
reload is shown with the number of its problems, not their text (that is in the log).

Times are laid out for people once, here (each company's timezone), so the page's renderers (``status_page``: the
server's HTML and the page's script) only place them.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class _Range:
    start: float
    end: float

    def pct(self, ts: float | None, default: float = 0.0) -> float:
        if ts is None:
            return default
        return round(min(100.0, max(0.0, (ts - self.start) / (self.end - self.start) * 100)), 3)


def _instants(schedule: Schedule) -> list[float]:
    out: list[float] = [s.at for s in schedule.steps]
    for w in schedule.windows:
        out += [w.start, w.end]
    out += [e.until for e in schedule.exemptions]
    out += [at for at in schedule.signals.values() if at is not None]
    return out


def _range(plan: RolloutPlan, now: float) -> _Range:
    """One scale for every timeline of the page, so companies line up: every dated instant and now, padded."""
    instants = [now, *(at for per in plan.schedules.values() for s in per.values() for at in _instants(s))]
    start, end = min(instants), max(instants)
    if end - start < 60 * _DAY:
        middle = (start + end) / 2
        start, end = middle - 30 * _DAY, middle + 30 * _DAY
    pad = (end - start) * 0.06
    return _Range(start - pad, end + pad)


def _ticks(scale: _Range) -> list[dict[str, Any]]:
    """Month boundaries (every 1, 3, 6 or 12 months: at most 12 ticks), in UTC."""
    first = dt.datetime.fromtimestamp(scale.start, dt.UTC)
    months = (scale.end - scale.start) / (30.44 * _DAY)
    step = next((m for m in (1, 3, 6, 12) if months / m <= 12), 24)
    year, month = first.year, first.month + 1
    if month > 12:
        year, month = year + 1, 1
    while (month - 1) % step:
        month += 1
        if month > 12:
            year, month = year + 1, 1
    out: list[dict[str, Any]] = []
    while True:
        ts = dt.datetime(year, month, 1, tzinfo=dt.UTC).timestamp()
        if ts > scale.end:
            return out
        out.append({"pct": scale.pct(ts), "label": f"{year}-{month:02d}"})
        month += step
        while month > 12:
            year, month = year + 1, month - 12


def _state(start: float, end: float | None, now: float) -> str:
    if end is None:
        return "past" if start <= now else "ahead"
    if end <= now:
        return "past"
    return "now" if start <= now else "ahead"


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
        markers.append({"pct": scale.pct(at), "kind": "signal", "label": f"{flag.name} {_local(at, tz)}"})
    for position, step in enumerate(schedule.steps, 1):
        events.append({"at": step.at, "when": _local(step.at, tz), "kind": "date", "state": dated_state(position),
                       "phase": phases[step.index], "severity": _severity(step.index, count),
                       "text": f"{step.flag} {step.date} ({step.source}): {phases[step.index]}"})
        markers.append({"pct": scale.pct(step.at), "kind": "date",
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
                           "until": _local(exempt.until, tz), "to_pct": scale.pct(exempt.until)})
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
    }


# --- the page's data --------------------------------------------------------------------------------------------


def status_data(
    *,
    config: LoadedConfig,
    plan: RolloutPlan,
    clock: Clock,
    history: ConfigHistory,
    usage: Mapping[str, Any],
    usage_sources: Sequence[str] = (),
    usage_failed: Mapping[str, str] | None = None,
    wall: float | None = None,
) -> dict[str, Any]:
    """``usage``: the usage report as ``fleet.collect`` merges it (one process's, or its workers'), every field
    present; ``usage_sources`` and
    ``usage_failed``: the workers that answered and those that did not (empty for a single process)."""
    wall = time.time() if wall is None else wall
    moment = clock.now()
    now = moment.timestamp()
    utc = dt.UTC
    scale = _range(plan, now)
    tenants = []
    for tenant, schedules in plan.schedules.items():
        tz = zoneinfo.ZoneInfo(plan.timezones[tenant])
        tenants.append({
            "name": tenant,
            "timezone": plan.timezones[tenant],
            "local_now": _local(now, tz),
            "behaviours": [_behaviour(s, now, tz, scale) for s in schedules.values()],
            "usage": [
                {"policy": policy, "decisions": _most_first(decisions)}
                for policy, report in sorted(usage.items())
                if (decisions := report["by_tenant"].get(tenant))
            ],
        })
    last = history.last_reload
    window = max((float(r["window_seconds"]) for r in usage.values()), default=float(config.model.usage.window_seconds))
    policies = []
    for name, report in sorted(usage.items()):
        rows = []
        for row in report["top_clients"]:
            seen = float(row["last_seen"])
            rows.append({
                "client": row["client"],
                "tenant": row["tenant"],
                "user_agent": row["user_agent"],
                "requests": row["requests"],
                "requests_max": row.get("requests_max"),  # only where the merge could not make the count exact
                "decisions": ", ".join(f"{d} {n}" for d, n in _most_first(row["decisions"])),
                "last_seen": _local(seen, utc) if seen else "",
                "last_seen_ago": _ago(wall - seen) if seen else "",
            })
        policies.append({
            "name": name,
            "requests": report["requests"],
            "by_decision": _most_first(report["by_decision"]),
            "untracked": report["untracked_clients_requests"],
            "clients": report["clients"],
            "exact": report["top_clients_exact"],
            "unlisted_max": report["unlisted_max"],
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
        "workers": {"answered": list(usage_sources), "failed": dict(usage_failed or {})},
        "timeline": {"now_pct": scale.pct(now), "ticks": _ticks(scale), "start": _local(scale.start, utc),
                     "end": _local(scale.end, utc)},
        "tenants": tenants,
        "usage": {"window": _duration_label(window), "policies": policies},
    }
