"""The plan explained: lines for ``gateway rollout`` and JSON for the admin ``/rollout``."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable
from typing import Any

from .plan import Client, Ramp, RolloutPlan, Schedule

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


def _bridge_lines(schedule: Schedule, stamp: float, tz: dt.tzinfo) -> list[str]:
    """The bridge's state for the company, then each exemption (what it keeps, its bridge)."""
    bridge = schedule.behaviour.bridge
    lines = []
    if bridge is not None:
        lines.append(f"    bridge {bridge}: {_bridge_state(schedule, stamp, schedule.decide(stamp).index)}")
    for exempt in schedule.exemptions:
        state = "active" if stamp < exempt.until else "expired"
        keeps = schedule.behaviour.phases[exempt.index]
        line = f"    exemption {exempt.name!r} ({state}): {exempt.client} keeps at most {keeps}"
        if exempt.bridge is not None and bridge is not None:
            line += f", bridge {bridge} {'on' if exempt.bridge else 'off'}"
        lines.append(f"{line} until {_fmt(exempt.until, tz)}")
    return lines


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
    lines = [f"    shadow ({'now' if window.start <= stamp else 'scheduled'}): {phases[window.index]} decided for "
             f"every request but not applied, from {_fmt(window.start, tz)} to {_fmt(window.end, tz)}"
             for window in schedule.shadows if window.end > stamp]
    lines += [_ramp_line(schedule, ramp, stamp, tz) for ramp in schedule.ramps]
    freeze = schedule.freeze
    if freeze is not None:
        lines.append(f"    freeze: {'since' if freeze.at <= stamp else 'from'} {_fmt(freeze.at, tz)}, a client first "
                     f"seen after it gets {phases[freeze.index]} at once; one seen before keeps its schedule")
    if schedule.preview is not None:
        lines.append(f"    preview: a client may ask for a later phase now with the {schedule.preview} header")
    return lines


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
        explained = schedule.explain(stamp, client, tenant)
        decision = schedule.resolve(stamp, client, tenant)
        line = f"  {name}: {explained.phase} [{explained.kind}] {explained.why}"
        if explained.shadow is not None:
            line += f"; shadow: {explained.shadow} decided, not applied"
        lines.append(line)
        if schedule.behaviour.bridge is not None:
            lines.append(f"    bridge {schedule.behaviour.bridge}: {'on' if decision.bridge else 'off'} for this client")
        upcoming = schedule.next_change(stamp)
        if upcoming is not None and upcoming[1].index > explained.index:
            at = dt.datetime.fromtimestamp(upcoming[0], zoneinfo.ZoneInfo(plan.timezones[tenant])).isoformat()
            lines.append(f"    next for the company: {upcoming[1].phase} at {at}")
    return lines


def _bridge_state(schedule: Schedule, stamp: float, index: int) -> str:
    """What the bridge does at ``stamp`` for the company, whose phase is ``index``: on or off, and, when on, whether
    that phase is one it acts in, and if not, for which exempted clients it still does."""
    behaviour = schedule.behaviour
    phases = " or ".join(behaviour.bridge_phases)
    others = " (exemptions below may say otherwise for a client)"
    if not schedule.bridge_default:
        return "off for the company" + (others if any(e.bridge for e in schedule.exemptions) else "")
    phase = behaviour.phases[index]
    if phase in behaviour.bridge_phases:
        return f"on for the company, acting in its phase {phase}" + (
            others if any(e.bridge is False for e in schedule.exemptions) else "")
    kept = [e for e in schedule.exemptions if stamp < e.until and e.index < index and e.bridge is not False
            and behaviour.phases[e.index] in behaviour.bridge_phases]
    if not kept:
        return f"on for the company, but idle in its phase {phase}: it acts in {phases} only, where no client is"
    names = ", ".join(repr(e.name) for e in kept)
    return (f"on for the company, but in its phase {phase} it acts only for the clients that exemption"
            f"{'s' if len(kept) > 1 else ''} {names} keep{'' if len(kept) > 1 else 's'} at {phases}")


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
        out["tenants"][tenant] = {"timezone": plan.timezones[tenant], "behaviours": behaviours}
    return out
