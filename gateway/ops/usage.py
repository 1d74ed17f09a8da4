"""Who still uses deprecated behaviour: the counts of one process (per behaviour and hour: totals by tenant and
decision, client rows by token fingerprint and User-Agent; per client, an example of its call and the rule that
decided it, at its first request in the batch), updated on the request's path with a few dictionary updates and
held in bounded memory until the usage ledger (``ops.ledger``) takes them. The bounds (``usage.max_clients``,
``ledger.max_pending_clients``): docs/operations.md and docs/configuration.md."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..config.ledger import AGENT_WIDTH
from ..core.decision import Decider, Decision, Kind
from .metrics import NO_TENANT

if TYPE_CHECKING:
    from ..core.route import Route

__all__ = ("DAY", "HOUR", "Batch", "Call", "ClientKey", "Seen", "TotalKey", "UsageCounter", "WhoKey", "counted",
           "refused", "rule_of")

HOUR = 3600
DAY = 86400

# (hour, behaviour, tenant, decision): a total's key
TotalKey = tuple[int, str, str, str]
# (hour, behaviour, tenant, client, user agent, decision): a client row's key
ClientKey = tuple[int, str, str, str, str, str]
# (behaviour, tenant, client): a client of one company on one behaviour
WhoKey = tuple[str, str, str]
# Told of each client row new in a batch: (behaviour, tenant, client, when) (``ledger.known``: a freeze's record)
Seen = Callable[[str, str, str, float], None]


def refused(decision: str) -> bool:
    """Whether a request so decided was refused, breaking its client: the upload guard's ``blocked`` and ``refused``,
    a board answered without its cards (its action ``removed``, or ``backfill_failed``: ``phase:action``); never
    a phase the client asked for itself (a preview). The same rule as SQL: the ledger's migration 0002."""
    if decision == "blocked" or decision == "refused":
        return True
    return decision.endswith((":removed", ":backfill_failed")) and "(preview)" not in decision


def counted(decision: str) -> bool:
    """Whether a request so decided is a deprecated call for readiness: every decision but the upload guard's
    ``passed`` (a request on its routes that uploads nothing)."""
    return decision != "passed"


_CALENDAR = frozenset({Kind.DEFAULT, Kind.SETTING, Kind.DATE, Kind.OVERRIDE})


def rule_of(decision: Decision) -> str:
    """The rule that decided a request's phase, as the ledger keeps it: ``exemption:NAME``, ``brownout``, ``ramp``,
    ``freeze``, ``preview``, ``shadow`` (a shadow window decided a later phase, not applied), or the calendar's
    kind (``date``, ``override``, ``setting``, ``default``; the ledger writes ``bridge`` when the decision shows
    the bridge acted)."""
    if decision.exemption is not None:
        return "exemption:" + decision.exemption
    kind = decision.kind
    if kind in _CALENDAR and decision.shadow is not None:
        return "shadow"
    return kind.value


class Call(Protocol):
    """What the counter reads of a request's call for its client's rollup (``core.exchange.Exchange``)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def route(self) -> Route: ...
    @property
    def rollout(self) -> Decider | None: ...


_EXAMPLES_KEPT = 1000  # method and template pairs whose text is kept to be shared (the routes' are a few dozen)


@dataclass(slots=True)
class Batch:
    """Counts taken from the counter, written by the ledger in one transaction. ``id`` makes the write idempotent:
    a batch whose first attempt committed but did not say so (a connection lost during COMMIT, a write that
    outlived its timeout) is recognised when it is sent again.

    Flat dictionaries of numbers keyed by tuples of strings and numbers, rather than a small list per row: the
    garbage collector stops tracking such dictionaries and keys, so that 100,000 clients held in memory do not
    lengthen every collection of the process (and the event loop's pauses with them)."""

    requests: dict[ClientKey, int]
    first_seen: dict[ClientKey, float]
    last_seen: dict[ClientKey, float]
    untracked: dict[TotalKey, int]  # the requests of clients without a row
    count: int  # requests in the batch
    # Per client: an example of its call and the rule that decided it, of its first request in the batch.
    examples: dict[WhoKey, str] = field(default_factory=dict)
    rules: dict[WhoKey, str] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Set by the write that stored it: the requests of rows the database refused (``Store.write``), and why.
    refused: int = 0
    refused_why: str | None = None

    def totals(self) -> dict[TotalKey, tuple[int, int]]:
        """Every request per hour, behaviour, tenant and decision, and how many of them were untracked: summed here,
        by the ledger's thread, rather than counted a second time on each request's path."""
        sums: dict[TotalKey, int] = {}
        for (hour, behaviour, tenant, _, _, decision), n in self.requests.items():
            key = (hour, behaviour, tenant, decision)
            sums[key] = sums.get(key, 0) + n
        for key, n in self.untracked.items():
            sums[key] = sums.get(key, 0) + n
        return {key: (n, self.untracked.get(key, 0)) for key, n in sums.items()}


class UsageCounter:
    def __init__(
        self,
        *,
        max_clients: int = 1000,
        max_rows: int = 100_000,
        behaviours: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``behaviours``: a policy's name -> the dated behaviour its decisions are about (a policy not named counts
        under its own name)."""
        self.max_clients = max_clients
        self.max_rows = max_rows
        self._behaviours = dict(behaviours or {})
        self._clock = clock
        self._batch = self._empty()
        self._held: Batch | None = None
        # This hour's clients with rows, per behaviour: the max_clients bound (kept across batches).
        self._hour = 0
        self._hour_start = self._hour_end = 0.0
        self._tracked: dict[str, set[tuple[str, str, str]]] = {}
        self.dropped = 0  # requests not kept at all (memory bound reached during a long outage)
        self._taken = 0  # batches taken so far: with the current batch's count, the ``mark``
        self.seen: Seen | None = None  # told of each client row new in a batch (a freeze's record of who was seen)
        self._examples: dict[tuple[str, str], str] = {}  # (method, template) -> their text, one string for all

    @staticmethod
    def _empty() -> Batch:
        return Batch({}, {}, {}, {}, 0)

    def record(
        self, decisions: Mapping[str, str], client: str | None, user_agent: str | None, tenant: str | None = None,
        call: Call | None = None,
    ) -> None:
        """On the request's path: a few dictionary updates (the common case, a client already counted this hour,
        takes no other step). ``call``: the request, for its client's example call (once a batch) and the rule that
        decided it (its rollout's decision, made once per request)."""
        if not decisions:
            return
        now = self._clock()
        if not self._hour_start <= now < self._hour_end:  # (floats: a float compared with an int costs more)
            self._next_hour(now)
        hour = self._hour
        agent = user_agent[:AGENT_WIDTH] if user_agent else ""
        client = client or ""
        tenant = NO_TENANT if tenant is None else tenant
        batch = self._batch
        requests = batch.requests
        for policy, decision in decisions.items():
            behaviour = self._behaviours.get(policy, policy)
            key = (hour, behaviour, tenant, client, agent, decision)
            seen = requests.get(key)
            if seen is None:
                if not self._first(batch, key, now, call):
                    continue
                seen = 0
            requests[key] = seen + 1
            batch.last_seen[key] = now
            batch.count += 1

    def _next_hour(self, now: float) -> None:
        self._hour = int(now) - int(now) % HOUR
        self._hour_start, self._hour_end = float(self._hour), float(self._hour + HOUR)
        self._tracked = {}

    def _first(self, batch: Batch, key: ClientKey, now: float, call: Call | None) -> bool:
        """A client row new in the batch: told to ``seen``, then given a row unless over max_clients (False), and
        its example call and rule unless its client has them already."""
        hour, behaviour, tenant, client, agent, decision = key
        if self.seen is not None:  # (a client over max_clients too: this process saw it)
            self.seen(behaviour, tenant, client, now)
        if not self._new_row(batch, hour, behaviour, tenant, decision, (tenant, client, agent)):
            return False
        batch.first_seen[key] = now
        if call is not None and (behaviour, tenant, client) not in batch.examples:
            self._detail(batch, call, (behaviour, tenant, client))
        return True

    def _detail(self, batch: Batch, call: Call, who: WhoKey) -> None:
        """A client's first call in the batch: its example and the rule that decided it (once a batch, every
        flush_interval: a request of a client already in the batch takes no step here)."""
        batch.examples[who] = self._example(call)
        rollout = call.rollout
        if rollout is not None:
            try:
                batch.rules[who] = rule_of(rollout.decide(who[0]))
            except KeyError:  # a behaviour the plan does not know (a policy counted under its own name)
                pass

    def _example(self, call: Call) -> str:
        """The call as method and route template (``PUT /api/v1/cards/{card_id}/files``): never a path's ids, never a
        query; one string for every client that calls it (a client held costs no text of its own)."""
        route = call.route
        key = (call.method, route.template(call.path) or f"(route {route.name})")
        text = self._examples.get(key)
        if text is None:
            text = f"{key[0]} {key[1]}"
            if len(self._examples) < _EXAMPLES_KEPT:
                self._examples[key] = text
        return text

    def _new_row(self, batch: Batch, hour: int, behaviour: str, tenant: str, decision: str,
                 who: tuple[str, str, str]) -> bool:
        """Whether a client row not yet held may be added; if not, the request counts as untracked (or, past the
        bound on what is held, as dropped)."""
        tracked = self._tracked.get(behaviour)
        if tracked is None:
            tracked = self._tracked[behaviour] = set()
        held = self._held
        rows = len(batch.requests) + (len(held.requests) if held is not None else 0)
        if (who in tracked or len(tracked) < self.max_clients) and rows < self.max_rows:
            tracked.add(who)
            return True
        self._untracked(batch, (hour, behaviour, tenant, decision))
        return False

    def _untracked(self, batch: Batch, total_key: tuple[int, str, str, str]) -> None:
        """A request counted in its behaviour's total without its client, or, past the bound on rows, dropped."""
        untracked = batch.untracked
        if total_key in untracked:
            untracked[total_key] += 1
        elif len(untracked) < self.max_rows:
            untracked[total_key] = 1
        else:
            self.dropped += 1
            return
        batch.count += 1

    @property
    def pending(self) -> int:
        """Requests counted and not yet written (the batch being written included)."""
        return self._batch.count + (self._held.count if self._held is not None else 0)

    @property
    def mark(self) -> tuple[int, int]:
        """Changes whenever a request is counted: two equal marks mean nothing was counted in between."""
        return self._taken, self._batch.count

    def take(self) -> Batch | None:
        """The batch to write now: the one whose write has not succeeded yet, if any (sent again as it was, under the
        same id), else what accumulated since; None when there is nothing. O(1): the rows are handed over as they
        are, never copied on the event loop."""
        if self._held is None and self._batch.count:
            self._held, self._batch = self._batch, self._empty()
            self._taken += 1
        return self._held

    def written(self, batch: Batch) -> None:
        """The batch is in the database: let it go."""
        if self._held is batch:
            self._held = None

    def discard(self) -> int:
        """Give up on everything held (the process is stopping and the database cannot take it): how many requests
        that was. (Not ``dropped``: that counts what the memory bound turned away.)"""
        lost = self.pending
        self._held = None
        self._batch = self._empty()
        return lost
