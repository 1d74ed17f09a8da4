"""The plan explained: lines for ``gateway rollout`` and JSON for the admin ``/rollout``."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .plan import Client, Ramp, RolloutPlan, Schedule

if TYPE_CHECKING:
    from .plan import _Exempt

__all__ = ("describe", "describe_client", "report")


def _fmt(ts: float, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(ts, tz).isoformat()


def describe(plan: RolloutPlan, now: dt.datetime, tenants: Iterable[str] | None = None) -> list[str]:
    """Human-readable lines: per tenant and behaviour, the phase at ``now``, why, and the next change."""
    lines: list[str] = []
    stamp = now.timestamp()
    for tenant in tenants if tenants is not None else plan.schedules:
        tz_name = plan.timezones[tenant]
        tz = zoneinfo.ZoneInfo(tz_name)
        lines.append(f"tenant {tenant} (timezone {tz_name}, local time {now.astimezone(tz).isoformat()})")
        for name, schedule in plan.schedules[tenant].items():
            lines += _behaviour_lines(name, schedule, stamp, tz)
    return lines


def _behaviour_lines(name: str, schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    decision = schedule.decide(stamp)
    return [f"  {name}: {decision.phase} [{decision.kind}] {decision.why}", _next_line(schedule, stamp, tz),
            *_brownouts(schedule, stamp, tz), *_stages(schedule, stamp, tz), *_bridge_lines(schedule, stamp, tz),
            *_signal_lines(schedule, stamp, tz)]


def _next_line(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> str:
    upcoming = schedule.next_change(stamp)
    if upcoming is None:
        return "    next change: none scheduled"
    at, later = upcoming
    return f"    next change: {later.phase} at {_fmt(at, tz)} ({later.why})"


def _brownouts(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    return [f"    brownout ({'now' if window.start <= stamp else 'scheduled'}): "
            f"{schedule.behaviour.phases[window.index]} from {_fmt(window.start, tz)} to {_fmt(window.end, tz)}"
            for window in schedule.windows if window.end > stamp]


def _shadow_lines(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    phases = schedule.behaviour.phases
    return [f"    shadow ({'now' if window.start <= stamp else 'scheduled'}): {phases[window.index]} decided for "
            f"every request but not applied, from {_fmt(window.start, tz)} to {_fmt(window.end, tz)}"
            for window in schedule.shadows if window.end > stamp]


def _bridge_lines(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    """The bridge's state for the company, then each exemption (what it keeps, its bridge)."""
    bridge = schedule.behaviour.bridge
    lines = []
    if bridge is not None:
        lines.append(f"    bridge {bridge}: {_bridge_state(schedule, stamp, schedule.decide(stamp).index)}")
    lines += [_exemption_line(schedule, exempt, stamp, tz) for exempt in schedule.exemptions]
    return lines


def _exemption_line(schedule: Schedule, exempt: _Exempt, stamp: float, tz: dt.tzinfo) -> str:
    """What an exemption keeps, until when, and whether it keeps the behaviour's bridge on."""
    bridge = schedule.behaviour.bridge
    state = "active" if stamp < exempt.until else "expired"
    keeps = schedule.behaviour.phases[exempt.index]
    line = f"    exemption {exempt.name!r} ({state}): {exempt.client} keeps at most {keeps}"
    if exempt.bridge is not None and bridge is not None:
        line += f", bridge {bridge} {'on' if exempt.bridge else 'off'}"
    return f"{line} until {_fmt(exempt.until, tz)}"


def _signal_lines(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    lines = []
    for flag in schedule.behaviour.signals:
        start = schedule.signals[flag.name]
        if start is None:
            lines.append(f"    {flag.label}: {flag.unset}")
        else:
            lines.append(f"    {flag.label}: {'since' if start <= stamp else 'from'} {_fmt(start, tz)} ({flag.name})")
    return lines


def _stages(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    """The staged rollout's lines of one schedule: shadows, ramps, the freeze, the preview."""
    phases = schedule.behaviour.phases
    lines = _shadow_lines(schedule, stamp, tz)
    lines += [_ramp_line(schedule, ramp, stamp, tz) for ramp in schedule.ramps]
    freeze = schedule.freeze
    if freeze is not None:
        lines.append(_freeze_line(phases[freeze.index], freeze.at, stamp, tz))
    if schedule.preview is not None:
        lines.append(f"    preview: a client may ask for a later phase now with the {schedule.preview} header")
    return lines


def _freeze_line(phase: str, at: float, stamp: float, tz: dt.tzinfo) -> str:
    return (f"    freeze: {'since' if at <= stamp else 'from'} {_fmt(at, tz)}, a client first seen after it gets "
            f"{phase} at once; one seen before keeps its schedule")


def _ramp_line(schedule: Schedule, ramp: Ramp, stamp: float, tz: dt.tzinfo) -> str:
    steps = ", then ".join(f"{share:g}% of clients from {_fmt(at, tz)}" for at, share in ramp.steps)
    at_date = next((s.at for s in schedule.steps if s.index == ramp.index), None)
    everyone = f", everyone from {_fmt(at_date, tz)}" if at_date is not None else ""
    now = ramp.share(stamp)
    return (f"    ramp ({f'now {now:g}%' if now else 'not started'}): {schedule.behaviour.phases[ramp.index]} for "
            f"{steps}{everyone} (chosen by a keyed hash of the token fingerprint)")


def describe_client(plan: RolloutPlan, now: dt.datetime, tenant: str, client: Client, who: str) -> list[str]:
    """Where one client stands at ``now`` for each dated behaviour of ``tenant``, and why."""
    stamp = now.timestamp()
    lines = [f"client {who} of tenant {tenant}"]
    for name, schedule in plan.schedules[tenant].items():
        lines += _client_lines(name, schedule, stamp, tenant, client, plan.timezones[tenant])
    return lines


def _client_lines(name: str, schedule: Schedule, stamp: float, tenant: str, client: Client,
                  timezone: str) -> list[str]:
    """One behaviour's lines of ``describe_client``."""
    explained = schedule.explain(stamp, client, tenant)
    decision = schedule.resolve(stamp, client, tenant)
    line = f"  {name}: {explained.phase} [{explained.kind}] {explained.why}"
    if explained.shadow is not None:
        line += f"; shadow: {explained.shadow} decided, not applied"
    lines = [line]
    if schedule.behaviour.bridge is not None:
        lines.append(f"    bridge {schedule.behaviour.bridge}: {'on' if decision.bridge else 'off'} for this client")
    return lines + _company_next(schedule, stamp, explained.index, timezone)


def _company_next(schedule: Schedule, stamp: float, index: int, timezone: str) -> list[str]:
    """The company's next change, when it moves the client past its phase ``index``."""
    upcoming = schedule.next_change(stamp)
    if upcoming is None or upcoming[1].index <= index:
        return []
    at = dt.datetime.fromtimestamp(upcoming[0], zoneinfo.ZoneInfo(timezone)).isoformat()
    return [f"    next for the company: {upcoming[1].phase} at {at}"]


def _bridge_state(schedule: Schedule, stamp: float, index: int) -> str:
    """What the bridge does at ``stamp`` for the company, whose phase is ``index``: on or off, and, when on, whether
    that phase is one it acts in, and if not, for which exempted clients it still does."""
    behaviour = schedule.behaviour
    if not schedule.bridge_default:
        return "off for the company" + _others(any(e.bridge for e in schedule.exemptions))
    phase = behaviour.phases[index]
    if phase in behaviour.bridge_phases:
        return f"on for the company, acting in its phase {phase}" + _others(
            any(e.bridge is False for e in schedule.exemptions))
    return _idle_or_kept(" or ".join(behaviour.bridge_phases), phase, _kept_in_bridge_phases(schedule, stamp, index))


def _kept_in_bridge_phases(schedule: Schedule, stamp: float, index: int) -> list[str]:
    """The exemptions in force at ``stamp`` that keep their clients before phase ``index``, in one the bridge acts
    in, and leave the bridge on for them."""
    behaviour = schedule.behaviour
    return [e.name for e in schedule.exemptions if stamp < e.until and e.index < index and e.bridge is not False
            and behaviour.phases[e.index] in behaviour.bridge_phases]


def _others(some: bool) -> str:
    return " (exemptions below may say otherwise for a client)" if some else ""


def _idle_or_kept(phases: str, phase: str, kept: list[str]) -> str:
    """The bridge, on for the company but in a phase it does not act in: for the clients exemptions ``kept`` in one
    of its ``phases``, if any."""
    if not kept:
        return f"on for the company, but idle in its phase {phase}: it acts in {phases} only, where no client is"
    names = ", ".join(repr(name) for name in kept)
    plural = len(kept) > 1
    return (f"on for the company, but in its phase {phase} it acts only for the clients that exemption"
            f"{'s' if plural else ''} {names} keep{'' if plural else 's'} at {phases}")


def report(plan: RolloutPlan, now: dt.datetime) -> dict[str, Any]:
    """The phases in force at ``now`` as JSON-ready data (admin ``/rollout``): per tenant and behaviour."""
    stamp = now.timestamp()
    out: dict[str, Any] = {"at": now.isoformat(), "tenants": {}}
    for tenant, schedules in plan.schedules.items():
        behaviours = {name: _behaviour_report(schedule, stamp) for name, schedule in schedules.items()}
        out["tenants"][tenant] = {"timezone": plan.timezones[tenant], "behaviours": behaviours}
    return out


def _behaviour_report(schedule: Schedule, stamp: float) -> dict[str, Any]:
    decision = schedule.decide(stamp)
    upcoming = schedule.next_change(stamp)
    return {
                **({"bridge": {"name": schedule.behaviour.bridge, "on": schedule.bridge_default}}
                   if schedule.behaviour.bridge is not None else {}),
        "phase": decision.phase,
        "kind": decision.kind,
        "why": decision.why,
        "shadow": decision.shadow,
        "ramp": None if (ramp := schedule.ramp_share(stamp)) is None else {"phase": ramp[0], "share": ramp[1]},
        "freeze": None if schedule.freeze is None else {
            "from": dt.datetime.fromtimestamp(schedule.freeze.at, dt.UTC).isoformat(),
            "phase": schedule.behaviour.phases[schedule.freeze.index]},
        "next_change": None
        if upcoming is None
        else {"at": dt.datetime.fromtimestamp(upcoming[0], dt.UTC).isoformat(), "phase": upcoming[1].phase},
    }
