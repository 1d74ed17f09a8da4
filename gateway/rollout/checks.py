"""Config checks of the rollout sections against the behaviours the policies declare, each problem with its path."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..core.keys import UNKNOWN_KEY, did_you_mean
from .behaviour import Behaviour, DateFlag
from .config import Exemption, Ramp, RolloutConfig, Shadow, TenantRollout
from .plan import effective_date

if TYPE_CHECKING:
    from ..core.tenants import Tenant

__all__ = ("rollout_problems",)


def _phase_problem(behaviours: Mapping[str, Behaviour], name: str, phase: str | None, *, brownout: bool,
                   bridge: bool = False) -> str | None:
    known = behaviours.get(name)
    if known is None:
        return f"unknown behaviour {name!r} (known: {', '.join(behaviours)})"
    return None if phase is None else _phase_rule(known, name, phase, brownout=brownout, bridge=bridge)


def _phase_rule(known: Behaviour, name: str, phase: str, *, brownout: bool, bridge: bool) -> str | None:
    """A phase a brownout applies must be a later one; one an exemption keeps (without a bridge), not the last."""
    if phase not in known.phases:
        return f"unknown phase {phase!r} of {name} (phases: {', '.join(known.phases)})"
    if brownout and phase == known.phases[0]:
        return f"phase {phase!r} is the first one of {name}: a brownout applies a later phase"
    if not brownout and not bridge and phase == known.phases[-1]:
        return f"phase {phase!r} is the last one of {name}: nothing to keep"
    return None


def _date_problems(section: RolloutConfig | TenantRollout, where: str, flags: Mapping[str, dt.date | None],
                   is_global: bool) -> list[str]:
    problems = [_date_problem(section, key, value, flags, is_global) for key, value in section.dates().items()]
    return [f"{where}.{key}: {problem}" for key, problem in problems if problem is not None]


def _date_problem(section: RolloutConfig | TenantRollout, key: str, value: dt.date | None,
                  flags: Mapping[str, dt.date | None], is_global: bool) -> tuple[str, str | None]:
    """A date flag's key and what is wrong with it (None: nothing): an unknown one, or a global null that would
    drop its default."""
    if key not in flags:
        return key, f"{UNKNOWN_KEY}{did_you_mean(key, [*flags, *type(section).model_fields])}"
    if is_global and value is None and flags[key] is not None:
        return key, f"Input should be a valid date (the default is {flags[key]})"
    return key, None


def _later_phases(section: RolloutConfig | TenantRollout, where: str, behaviours: Mapping[str, Behaviour]
                  ) -> list[str]:
    """Brownouts, shadows and ramps: each names a known behaviour and, where it names one, a later phase."""
    problems = []
    for name in ("brownouts", "shadows", "ramps"):
        for j, item in enumerate(getattr(section, name) or ()):
            problem = _phase_problem(behaviours, item.behaviour, item.phase, brownout=True)
            if problem:
                problems.append(f"{where}.{name}[{j}]: {problem}")
    return problems


def _freeze_problems(section: RolloutConfig | TenantRollout, where: str, behaviours: Mapping[str, Behaviour]
                     ) -> list[str]:
    problems = []
    seen: set[str] = set()
    for j, freeze in enumerate(section.freezes or ()):
        problem = _freeze_problem(behaviours, freeze.behaviour, seen)
        if problem:
            problems.append(f"{where}.freezes[{j}]: {problem}")
    return problems


def _freeze_problem(behaviours: Mapping[str, Behaviour], name: str, seen: set[str]) -> str | None:
    """A freeze names a known behaviour, one not frozen before in the list (``seen``, to which it is added)."""
    problem = _phase_problem(behaviours, name, None, brownout=False)
    if problem is None and name in seen:
        problem = f"a second freeze of {name}: one per behaviour"
    seen.add(name)
    return problem


def _exemption_problems(section: RolloutConfig | TenantRollout, where: str, behaviours: Mapping[str, Behaviour]
                        ) -> list[str]:
    problems = []
    for j, exemption in enumerate(section.exemptions):
        problem = _phase_problem(behaviours, exemption.behaviour, exemption.phase, brownout=False,
                                 bridge=exemption.bridge is not None) or _by_header(behaviours, exemption)
        if problem:
            problems.append(f"{where}.exemptions[{j}]: {problem}")
    return problems


def _by_header(behaviours: Mapping[str, Behaviour], exemption: Exemption) -> str | None:
    """A security behaviour's exemption must name its client by token: any client can send a header."""
    known = behaviours.get(exemption.behaviour)
    if known is not None and known.security and exemption.header is not None:
        return (f"{known.name} is a security setting: exempt a client by token_fingerprint only (any client "
                "can send a header)")
    return None


def _section_problems(section: RolloutConfig | TenantRollout, where: str, behaviours: Mapping[str, Behaviour],
                      flags: Mapping[str, dt.date | None], *, is_global: bool) -> list[str]:
    return [*_date_problems(section, where, flags, is_global), *_later_phases(section, where, behaviours),
            *_freeze_problems(section, where, behaviours), *_exemption_problems(section, where, behaviours)]


# (earlier flag, later flag, strictly later)
_Pair = tuple[DateFlag, DateFlag, bool]


def _in_order(a: dt.date | None, b: dt.date | None, strict: bool) -> bool:
    return a is None or b is None or (a < b if strict else a <= b)


def _after(strict: bool) -> str:
    return "after" if strict else "on or after"


def _ordered_pairs(behaviours: Mapping[str, Behaviour]) -> list[_Pair]:
    """The flags that must come in order: each signal on or before a behaviour's first flag, its flags rising."""
    return [pair for b in behaviours.values() for pair in (
        *((signal, b.flags[0], False) for signal in b.signals),
        *((b.flags[i], b.flags[i + 1], True) for i in range(len(b.flags) - 1)),
    )]


def _global_order(rollout: RolloutConfig, pairs: list[_Pair]) -> list[str]:
    dates = rollout.dates()
    problems = []
    for early, late, strict in pairs:
        a, b = dates.get(early.name, early.default), dates.get(late.name, late.default)
        if not _in_order(a, b, strict):
            problems.append(f"rollout.{late.name}: {b} must be {_after(strict)} {early.name} ({a})")
    return problems


def _tenant_order(rollout: RolloutConfig, own: TenantRollout, pairs: list[_Pair], where: str) -> list[str]:
    """A tenant's effective dates in order; the problem named at the date the tenant itself set."""
    own_dates = own.dates()
    problems = []
    for early, late, strict in pairs:
        a_own, b_own = own_dates.get(early.name), own_dates.get(late.name)
        a, b = effective_date(own, rollout, early)[0], effective_date(own, rollout, late)[0]
        if not _in_order(a, b, strict) and (a_own is not None or b_own is not None):
            problems.append(_order_problem(where, (early, a, a_own is not None), (late, b, b_own is not None), strict))
    return problems


_Dated = tuple[DateFlag, dt.date | None, bool]  # a flag, its effective date, whether the tenant set it


def _order_problem(where: str, early: _Dated, late: _Dated, strict: bool) -> str:
    """Two of a tenant's dates out of order, named at the later one when the tenant set it, else at the earlier."""
    (early_flag, a, a_own), (late_flag, b, b_own) = early, late
    if b_own:
        origin = "" if a_own else ", from rollout"
        return f"{where}.{late_flag.name}: {b} must be {_after(strict)} {early_flag.name} ({a}{origin})"
    before = "before" if strict else "on or before"
    return f"{where}.{early_flag.name}: {a} must be {before} {late_flag.name} ({b}, from rollout)"


def _tenant_checks(tenant: Tenant, own: TenantRollout, behaviours: Mapping[str, Behaviour], where: str
                   ) -> list[str]:
    """What each behaviour requires of a tenant (its own check, given the tenant's own flags and brownouts)."""
    problems: list[str] = []
    own_dates = own.dates()
    for behaviour in behaviours.values():
        if behaviour.check_tenant is not None:
            problems += behaviour.check_tenant(tenant, _own_flags(behaviour, own_dates), list(own.brownouts or ()),
                                               where)
    return problems


def _own_flags(behaviour: Behaviour, own_dates: Mapping[str, dt.date | None]) -> dict[str, dt.date | None]:
    """The tenant's own dates of the behaviour's flags."""
    names = {flag.name for flag in behaviour.all_flags()}
    return {name: day for name, day in own_dates.items() if name in names}


def rollout_problems(
    rollout: RolloutConfig,
    tenants: Sequence[tuple[Tenant, TenantRollout]],
    behaviours: Mapping[str, Behaviour],
) -> list[str]:
    """Known flags and phases, the order of the effective dates per tenant, and what each behaviour requires of a
    tenant; each with its path."""
    flags = {flag.name: flag.default for b in behaviours.values() for flag in b.all_flags()}
    pairs = _ordered_pairs(behaviours)
    problems = [*_section_problems(rollout, "rollout", behaviours, flags, is_global=True),
                *_global_order(rollout, pairs)]
    reported: set[str] = set()
    for i, (tenant, own) in enumerate(tenants):
        where = f"tenants[{i}].rollout"
        problems += _section_problems(own, where, behaviours, flags, is_global=False)
        problems += _tenant_order(rollout, own, pairs, where)
        problems += _dated_problems(rollout, tenant, own, behaviours, where, reported)
        problems += _tenant_checks(tenant, own, behaviours, where)
    return problems


def _phase_date(own: TenantRollout, rollout: RolloutConfig, behaviour: Behaviour, phase: str) -> dt.date | None:
    """The date a phase comes into force for a tenant (None: no date)."""
    index = behaviour.phases.index(phase)
    return effective_date(own, rollout, behaviour.flags[index - 1])[0] if index > 0 else None


def _dated_problems(rollout: RolloutConfig, tenant: Tenant, own: TenantRollout, behaviours: Mapping[str, Behaviour],
                    where: str, reported: set[str]) -> list[str]:
    """Shadows and ramps against the phase dates in force for a tenant: a shadow ends by its phase's date, a ramp's
    steps come before it. The tenant's own list is reported at its path, the global one at ``rollout``, once (naming
    the first tenant it concerns: ``reported`` keeps what was said)."""
    problems: list[str] = []
    tz = zoneinfo.ZoneInfo(own.timezone or rollout.timezone)
    for name in ("shadows", "ramps"):
        own_list = getattr(own, name)
        if own_list is None:
            problems += _global_problems(name, rollout, tenant, own, behaviours, reported)
        else:
            problems += [f"{where}.{name}[{j}]: {problem}"
                         for j, problem in _item_problems(own_list, behaviours, tenant, own, rollout, tz)]
    return problems


def _global_problems(name: str, rollout: RolloutConfig, tenant: Tenant, own: TenantRollout,
                     behaviours: Mapping[str, Behaviour], reported: set[str]) -> list[str]:
    """The global list ``name`` against a tenant's dates: each problem reported once, naming this tenant."""
    problems = []
    for j, problem in _item_problems(getattr(rollout, name), behaviours, tenant, own, rollout, rollout.tzinfo):
        said = f"rollout.{name}[{j}]: {problem}"
        if said not in reported:
            reported.add(said)
            problems.append(f"{said} (tenant {tenant.name})")
    return problems


def _item_problems(items: Sequence[Shadow | Ramp], behaviours: Mapping[str, Behaviour], tenant: Tenant,
                   own: TenantRollout, rollout: RolloutConfig, tz: dt.tzinfo) -> list[tuple[int, str]]:
    """The shadows' or ramps' problems with the tenant's phase dates, by index in their list."""
    found = []
    for j, item in enumerate(items):
        problem = _item_problem(item, behaviours, tenant, own, rollout, tz)
        if problem:
            found.append((j, problem))
    return found


def _item_problem(item: Shadow | Ramp, behaviours: Mapping[str, Behaviour], tenant: Tenant, own: TenantRollout,
                  rollout: RolloutConfig, tz: dt.tzinfo) -> str | None:
    behaviour = behaviours.get(item.behaviour)
    if behaviour is None or (item.phase is not None and item.phase not in behaviour.phases):
        return None  # reported by the section's checks
    if isinstance(item, Ramp):
        return _ramp_problem(item, behaviour, own, rollout)
    return _shadow_problem(item, behaviour, tenant, own, rollout, tz)


def _ramp_problem(ramp: Ramp, behaviour: Behaviour, own: TenantRollout, rollout: RolloutConfig) -> str | None:
    day = _phase_date(own, rollout, behaviour, ramp.phase)
    last = ramp.steps[-1].start
    if day is not None and last >= day:
        return (f"the ramp's last step ({last}) must come before {ramp.phase}'s own date ({day}): everyone has the "
                "phase from then")
    return None


def _shadow_problem(shadow: Shadow, behaviour: Behaviour, tenant: Tenant, own: TenantRollout,
                    rollout: RolloutConfig, tz: dt.tzinfo) -> str | None:
    phase = shadow.phase or _next_phase(shadow, behaviour, tenant, own, rollout, tz)
    day = None if phase is None else _phase_date(own, rollout, behaviour, phase)
    if day is None:
        return None
    if _aware(shadow.end, tz) > _tenant_midnight(day, own, rollout):
        return (f"the shadow window ends ({shadow.end.isoformat()}) after {phase}'s own date ({day}): from then the "
                "phase applies")
    return None


def _tenant_midnight(day: dt.date, own: TenantRollout, rollout: RolloutConfig) -> dt.datetime:
    """The start of ``day`` in the tenant's time zone (the rollout's when it sets none)."""
    return dt.datetime.combine(day, dt.time(0), tzinfo=zoneinfo.ZoneInfo(own.timezone or rollout.timezone))


def _next_phase(shadow: Shadow, behaviour: Behaviour, tenant: Tenant, own: TenantRollout, rollout: RolloutConfig,
                tz: dt.tzinfo) -> str | None:
    """The phase a shadow without one decides: the one after the phase the dates put in force when it starts."""
    base = behaviour.base_of(tenant)
    index = base.index
    if base.dated:
        index += _flags_reached(behaviour, own, rollout, _aware(shadow.start, tz).date())
    return behaviour.phases[index + 1] if index + 1 < len(behaviour.phases) else None


def _flags_reached(behaviour: Behaviour, own: TenantRollout, rollout: RolloutConfig, day: dt.date) -> int:
    """How many of the behaviour's dated steps the tenant's dates put in force by ``day``."""
    return sum(1 for flag in behaviour.flags if (date := effective_date(own, rollout, flag)[0]) and date <= day)


def _aware(moment: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """``moment``, placed in ``tz`` when it has no offset of its own."""
    return moment if moment.tzinfo else moment.replace(tzinfo=tz)
