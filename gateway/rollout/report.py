"""The plan explained: lines for ``gateway rollout`` and JSON for the admin ``/rollout``."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable
from typing import Any

from .plan import RolloutPlan, Schedule

__all__ = ("describe", "report")


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
            bridge = schedule.behaviour.bridge
            if bridge is not None:
                lines.append(f"    bridge {bridge}: {_bridge_state(schedule, stamp, decision.index)}")
            for exempt in schedule.exemptions:
                state = "active" if stamp < exempt.until else "expired"
                keeps = schedule.behaviour.phases[exempt.index]
                line = f"    exemption {exempt.name!r} ({state}): {exempt.client} keeps at most {keeps}"
                if exempt.bridge is not None and bridge is not None:
                    line += f", bridge {bridge} {'on' if exempt.bridge else 'off'}"
                lines.append(f"{line} until {_fmt(exempt.until, tz)}")
            for flag in schedule.behaviour.signals:
                start = schedule.signals[flag.name]
                if start is None:
                    lines.append(f"    {flag.label}: {flag.unset}")
                else:
                    state = "since" if start <= stamp else "from"
                    lines.append(f"    {flag.label}: {state} {_fmt(start, tz)} ({flag.name})")
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
                "next_change": None
                if upcoming is None
                else {"at": dt.datetime.fromtimestamp(upcoming[0], dt.UTC).isoformat(), "phase": upcoming[1].phase},
            }
        out["tenants"][tenant] = {"timezone": plan.timezones[tenant], "behaviours": behaviours}
    return out
