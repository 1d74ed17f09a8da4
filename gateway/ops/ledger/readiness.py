"""Migration readiness, per client and behaviour, from the ledger's per-client rollups: is it ``ready`` (no deprecated
call for ``usage.readiness.quiet_days``), still ``calling`` before its company's date, ``overdue`` (calling after
it, kept working by an exemption, a bridge or its company's setting), or ``blocked`` (its calls are refused); with
its first and last call, requests, trend, the rule that decided its latest calls, an example of them, and what changes
for it next (the rollout plan, for that client). The outreach list (``gateway outreach``), ``/deprecations``, the
status page and a client's own view (``self_service``) are all this, cut or filtered. Pure: the rows come from
``store.Store.readiness``; it runs in the ledger's reader thread or the command line.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...config.ledger import ClientNames, NamedClient
from ...rollout.plan import RolloutPlan, Schedule
from ..usage import DAY, refused

__all__ = ("STATES", "Change", "ClientReadiness", "LedgerClient", "Readiness", "State", "build", "days_from",
           "plan_changes")

State = Literal["blocked", "overdue", "calling", "ready"]
# Most urgent first: the order of the outreach list.
STATES: tuple[State, ...] = ("blocked", "overdue", "calling", "ready")
_RANK = {state: i for i, state in enumerate(STATES)}
_MAX_CHANGES = 20  # a client's own schedule lists at most this many changes ahead


def _iso(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class Change:
    """A change of a client's phase (or of its bridge) at an instant, and what brings it."""

    at: float
    phase: str
    why: str
    bridge: bool = False  # its bridge applies from then

    def to_json(self) -> dict[str, Any]:
        return {"at": _iso(self.at), "phase": self.phase, "why": self.why, "bridge": self.bridge}


@dataclass(slots=True)
class ClientReadiness:
    """One client (token fingerprint; ``""``: requests without a token) of one company on one behaviour."""

    tenant: str
    behaviour: str
    client: str
    user_agent: str
    state: State
    first_call: float
    last_call: float
    requests: int
    last_7_days: int
    previous_7_days: int
    refused_7_days: int
    last_decision: str
    rule: str  # "" for rows from before the rollups kept it
    example: str  # method and route template; "" likewise
    last_refused: float | None
    phase: str  # the phase its next call gets now
    next: Change | None
    named: NamedClient | None = None

    @property
    def internal(self) -> bool:
        return self.named is not None and self.named.internal

    @property
    def trend(self) -> str:
        """``new``, ``stopped``, ``rising``, ``falling``, ``steady`` (the last 7 days against the 7 before), or
        ``quiet`` (no call in either)."""
        last, before = self.last_7_days, self.previous_7_days
        if not last and not before:
            return "quiet"
        if not before:
            return "new"
        if not last:
            return "stopped"
        ratio = last / before
        return "rising" if ratio > 1.25 else "falling" if ratio < 0.8 else "steady"

    @property
    def previewing(self) -> bool:
        """It asked for a later phase itself (a client testing its migration): it is migrating."""
        return self.rule == "preview" or "(preview)" in self.last_decision

    @property
    def shadowed(self) -> bool:
        """A shadow window decided a later phase for its latest call (recorded as what it would have done)."""
        return self.rule == "shadow" or self.last_decision.startswith("would_")

    def sort_key(self) -> tuple[Any, ...]:
        soon = self.next.at if self.next is not None else math.inf
        if self.state == "ready":
            return (_RANK[self.state], self.internal, -self.last_call, self.tenant, self.client, self.behaviour)
        return (_RANK[self.state], self.internal, soon, -self.last_7_days, -self.requests, self.tenant, self.client,
                self.behaviour)

    def to_json(self) -> dict[str, Any]:
        named = self.named
        return {
            "tenant": self.tenant, "behaviour": self.behaviour, "client": self.client or None,
            "name": named.name if named is not None else None, "owner": named.owner if named is not None else None,
            "internal": self.internal, "user_agent": self.user_agent or None, "state": self.state,
            "first_call": _iso(self.first_call), "last_call": _iso(self.last_call), "requests": self.requests,
            "last_7_days": self.last_7_days, "previous_7_days": self.previous_7_days, "trend": self.trend,
            "refused_7_days": self.refused_7_days,
            "last_decision": self.last_decision, "rule": self.rule or None, "example": self.example or None,
            "last_refused": _iso(self.last_refused), "previewing": self.previewing, "shadowed": self.shadowed,
            "phase": self.phase, "next": self.next.to_json() if self.next is not None else None,
        }


@dataclass(slots=True)
class Readiness:
    """Every client seen in the window, most urgent first, and the count of external clients per company, behaviour
    and state (internal clients are counted apart: a caller of the platform's own that never stops would keep the
    totals above zero for ever)."""

    at: float  # the rollout's clock: what "next" is measured from
    generated: float  # the wall clock: what the window and quiet_days are measured from
    since: float
    quiet_days: int
    window_days: int
    clients: list[ClientReadiness] = field(default_factory=list)

    def totals(self) -> dict[str, dict[str, dict[str, int]]]:
        """External clients per company, behaviour and state (every state present, zeros included)."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for entry in self.clients:
            if entry.internal:
                continue
            per = out.setdefault(entry.tenant, {}).setdefault(entry.behaviour, dict.fromkeys(STATES, 0))
            per[entry.state] += 1
        return {tenant: dict(sorted(per.items())) for tenant, per in sorted(out.items())}

    def still_calling(self) -> int:
        """External clients (each token of each company once) with a deprecated call within quiet_days."""
        return len({(e.tenant, e.client) for e in self.clients if not e.internal and e.state != "ready"})

    def internal_clients(self) -> int:
        return len({(e.tenant, e.client) for e in self.clients if e.internal})

    def to_json(self, top: int | None = None, *, ready: bool = True) -> dict[str, Any]:
        """``top``: at most this many clients listed (the totals count every one); ``ready``: list ready ones."""
        return {
            "at": _iso(self.at), "generated": _iso(self.generated), "since": _iso(self.since),
            "quiet_days": self.quiet_days, "window_days": self.window_days,
            "still_calling": self.still_calling(), "internal_clients": self.internal_clients(),
            "totals": self.totals(), "clients_in_window": len(self.clients),
            "to_contact": sum(1 for e in self.clients if e.state != "ready"),
            "clients": [e.to_json() for e in self._listed(top, ready)],
        }

    def _listed(self, top: int | None, ready: bool) -> list[ClientReadiness]:
        listed = [e for e in self.clients if ready or e.state != "ready"]
        return listed if top is None else listed[:top]


def days_from(wall: float) -> int:
    """The first UTC day a trend reads (the last 7 days, today included, and the 7 before them)."""
    today = int(wall) - int(wall) % DAY
    return today - 13 * DAY


class LedgerClient:
    """A client as the ledger knows it, for the rollout engine: its fingerprint, its latest User-Agent, and when it
    was first seen (a freeze's "seen before")."""

    __slots__ = ("headers", "fingerprint", "first_seen")

    def __init__(self, fingerprint: str, agent: str, first_seen: float) -> None:
        self.headers: Mapping[str, str] = {"User-Agent": agent} if agent else {}
        self.fingerprint: str | None = fingerprint or None
        self.first_seen = first_seen

    def previewed(self, behaviour: str) -> str | None:
        return None  # what it asks to preview is its own request's choice, not its schedule's

    def seen_before(self, tenant: str, behaviour: str, at: float) -> bool | None:
        return self.first_seen < at


def _per_client(schedule: Schedule, client: LedgerClient, now: float) -> bool:
    """Whether the schedule has a rule that may decide for this client apart from its company."""
    if schedule.ramps or schedule.freeze is not None:
        return client.fingerprint is not None
    return any(exempt.matches(client.headers, client.fingerprint) for exempt in schedule.exemptions)


def plan_changes(schedule: Schedule, client: LedgerClient, tenant: str, now: float, limit: int = 1
                 ) -> tuple[str, list[Change]]:
    """The client's phase at ``now`` and the next ``limit`` changes of its phase or bridge after it: at each
    boundary of its schedule (dates, brownouts, shadows, ramps, a freeze) and each end of an exemption."""
    current = schedule.resolve(now, client, tenant)
    phases = schedule.behaviour.phases
    instants = sorted({*schedule.boundaries(), *(e.until for e in schedule.exemptions)})
    changes: list[Change] = []
    state = (current.index, current.bridge)
    for at in instants[bisect.bisect_right(instants, now):]:
        later = schedule.resolve(at, client, tenant)
        if (later.index, later.bridge) == state:
            continue
        changes.append(Change(at, phases[later.index], _why(schedule, client, tenant, at), later.bridge))
        state = (later.index, later.bridge)
        if len(changes) >= limit:
            break
    return phases[current.index], changes


def _why(schedule: Schedule, client: LedgerClient, tenant: str, at: float) -> str:
    """Why the client's phase or bridge changes at ``at``, an exemption of its that ends then first."""
    why = schedule.explain(at, client, tenant).why
    ending = [e.name for e in schedule.exemptions if e.until == at and e.matches(client.headers, client.fingerprint)]
    return f"exemption {ending[0]!r} ends; {why}" if ending else why


class _Plans:
    """The plan's answers, each worked out once per schedule: the company's phase and next change now, and the
    instant its calendar reaches the behaviour's last phase (``None``: never; ``-inf``: from the start)."""

    def __init__(self, plan: RolloutPlan, now: float) -> None:
        self.plan = plan
        self.now = now
        self._company: dict[int, tuple[str, Change | None]] = {}
        self._due: dict[int, float | None] = {}

    def company(self, schedule: Schedule) -> tuple[str, Change | None]:
        found = self._company.get(id(schedule))
        if found is None:
            decided = schedule.resolve(self.now)
            upcoming = schedule.next_change(self.now)
            change = None if upcoming is None else Change(upcoming[0], upcoming[1].phase, upcoming[1].why,
                                                          schedule.bridge_default)
            found = self._company[id(schedule)] = (decided.phase, change)
        return found

    def due(self, schedule: Schedule) -> float | None:
        key = id(schedule)
        if key not in self._due:
            last = len(schedule.behaviour.phases) - 1
            at = next((step.at for step in schedule.steps if step.index == last), None)
            self._due[key] = -math.inf if at is None and schedule.base == last else at
        return self._due[key]


def build(state_rows: Iterable[Sequence[Any]], trend_rows: Iterable[Sequence[Any]], *, plan: RolloutPlan,
          names: ClientNames, wall: float, now: float, quiet_days: int, window_days: int) -> Readiness:
    """Readiness from ``Store.readiness``'s rows (the state since ``wall - window_days``, the trend from
    ``days_from(wall)``): ``wall`` is the ledger's clock (the window, quiet_days), ``now`` the rollout's (phases,
    dates, what changes next). A company or behaviour the plan no longer has is left out."""
    trend = {(tenant, client, behaviour): (int(last), int(before), int(no))
             for tenant, client, behaviour, last, before, no in trend_rows}
    quiet = wall - quiet_days * DAY
    plans = _Plans(plan, now)
    out = Readiness(now, wall, wall - window_days * DAY, quiet_days, window_days)
    for (tenant, client, behaviour, first, last, requests, decision, agent, example, rule,
         last_refused) in state_rows:
        schedule = plan.schedules.get(tenant, {}).get(behaviour)
        if schedule is None:
            continue
        who = LedgerClient(client, agent, float(first))
        phase, upcoming = _phase_and_next(plans, schedule, who, tenant, now)
        last = float(last)
        state = _state(last, decision, plans.due(schedule), quiet=quiet, now=now)
        recent = trend.get((tenant, client, behaviour), (0, 0, 0))
        out.clients.append(ClientReadiness(
            tenant, behaviour, client, agent, state, float(first), last, int(requests), *recent, decision, rule,
            example, float(last_refused) or None, phase, upcoming, names.find(client or None, agent)))
    out.clients.sort(key=ClientReadiness.sort_key)
    return out


def _phase_and_next(plans: _Plans, schedule: Schedule, who: LedgerClient, tenant: str, now: float
                    ) -> tuple[str, Change | None]:
    """The client's phase and its next change: its own when the rollout may treat it apart, else its company's."""
    if not _per_client(schedule, who, now):
        return plans.company(schedule)
    phase, changes = plan_changes(schedule, who, tenant, now)
    return phase, changes[0] if changes else None


def _state(last: float, decision: str, due: float | None, *, quiet: float, now: float) -> State:
    """Ready (no call since ``quiet``), blocked (its last call refused), overdue (still calling after the final
    phase's date), else calling."""
    if last < quiet:
        return "ready"
    if refused(decision):
        return "blocked"
    if due is not None and due <= now and last >= due:
        return "overdue"
    return "calling"
