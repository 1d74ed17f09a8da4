"""Who still uses deprecated behaviour: the counts of one process (per behaviour and hour: totals by tenant and
decision, client rows by token fingerprint and User-Agent), updated on the request's path with a few dictionary
updates and held in bounded memory until the usage ledger (``ops.ledger``) takes them. The bounds
(``usage.max_clients``, ``ledger.max_pending_clients``): docs/operations.md and docs/configuration.md."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .metrics import NO_TENANT
from ..config.ledger import AGENT_WIDTH

__all__ = ("HOUR", "Batch", "ClientKey", "TotalKey", "UsageCounter")

HOUR = 3600

# (hour, behaviour, tenant, decision): a total's key
TotalKey = tuple[int, str, str, str]
# (hour, behaviour, tenant, client, user agent, decision): a client row's key
ClientKey = tuple[int, str, str, str, str, str]


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

    @staticmethod
    def _empty() -> Batch:
        return Batch({}, {}, {}, {}, 0)

    def record(
        self, decisions: Mapping[str, str], client: str | None, user_agent: str | None, tenant: str | None = None
    ) -> None:
        """On the request's path: a few dictionary updates (the common case, a client already counted this hour,
        takes no other step)."""
        if not decisions:
            return
        now = self._clock()
        if not self._hour_start <= now < self._hour_end:  # (floats: a float compared with an int costs more)
            self._hour = int(now) - int(now) % HOUR
            self._hour_start, self._hour_end = float(self._hour), float(self._hour + HOUR)
            self._tracked = {}
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
                if not self._new_row(batch, hour, behaviour, tenant, decision, (tenant, client, agent)):
                    continue
                seen = 0
                batch.first_seen[key] = now
            requests[key] = seen + 1
            batch.last_seen[key] = now
            batch.count += 1

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
