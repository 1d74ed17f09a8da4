"""Who still uses deprecated behaviour: top clients per policy over a recent window, in bounded memory.

Every request on which a policy recorded a decision (``exchange.decisions``) counts for that policy, keyed by the
request's tenant, the client's token fingerprint and its User-Agent. The window is a ring of time buckets; each
bucket keeps at most ``max_clients`` keys per policy and counts the rest as untracked, so memory does not grow with
the number of clients. The totals (by decision, by tenant) count every request, tracked or not.

A report lists the top clients and says how far it can be trusted, so that reports of several processes can be
merged exactly (``gateway.ops.fleet``): ``top_clients_complete`` (every tracked client is listed), ``unlisted_max``
(no client left out of the list made more requests than this) and ``top_clients_exact`` (the counts and the order
of the list are exact; a merge that could not make them so gives each row's upper bound as ``requests_max``).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .metrics import NO_TENANT

__all__ = ("UsageTracker", "client_sort_key")

_UA_MAX = 200

# (tenant, client fingerprint, User-Agent): one client as the report lists it.
ClientKey = tuple[str | None, str | None, str | None]


def client_sort_key(requests: float, key: ClientKey) -> tuple[float, str, str, str]:
    """The order of a top-clients list: most requests first, then by tenant, client and User-Agent, so that every
    process ranks ties alike."""
    return (-requests, key[0] or "", key[1] or "", key[2] or "")


@dataclass(slots=True)
class _Bucket:
    start: float
    # policy -> (tenant, client, agent, decision) -> requests, for at most max_clients keys per policy
    counts: defaultdict[str, Counter[tuple[str | None, str | None, str | None, str]]] = field(
        default_factory=lambda: defaultdict(Counter))
    # policy -> (tenant, decision) -> requests, every request (tracked or not)
    totals: defaultdict[str, Counter[tuple[str, str]]] = field(default_factory=lambda: defaultdict(Counter))
    other: Counter[str] = field(default_factory=Counter)  # policy -> requests of keys over max_clients
    last_seen: dict[tuple[str, str | None, str | None, str | None], float] = field(default_factory=dict)


class UsageTracker:
    def __init__(
        self,
        window_seconds: float = 3600,
        buckets: int = 12,
        max_clients: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window = window_seconds
        self.bucket_seconds = window_seconds / buckets
        self.max_clients = max_clients
        self._clock = clock
        self._buckets: list[_Bucket] = []

    def _current(self, now: float) -> _Bucket:
        start = now - now % self.bucket_seconds
        if not self._buckets or self._buckets[-1].start != start:
            self._buckets.append(_Bucket(start))
            horizon = now - self.window
            self._buckets = [b for b in self._buckets if b.start + self.bucket_seconds > horizon]
        return self._buckets[-1]

    def record(
        self, decisions: Mapping[str, str], client: str | None, user_agent: str | None, tenant: str | None = None
    ) -> None:
        if not decisions:
            return
        now = self._clock()
        bucket = self._current(now)
        agent = user_agent[:_UA_MAX] if user_agent else None
        tenant_label = NO_TENANT if tenant is None else tenant
        for policy, decision in decisions.items():
            bucket.totals[policy][(tenant_label, decision)] += 1
            counts = bucket.counts[policy]
            key = (tenant, client, agent, decision)
            if key in counts or len(counts) < self.max_clients:
                counts[key] += 1
                bucket.last_seen[(policy, tenant, client, agent)] = now
            else:
                bucket.other[policy] += 1

    def report(self, top: int = 20) -> dict[str, Any]:
        """Per policy: the totals over the window and the ``top`` clients (see the module's docstring)."""
        self._current(self._clock())  # drops the buckets that have left the window
        out: dict[str, Any] = {}
        policies = {p for b in self._buckets for p in b.totals}
        for policy in sorted(policies):
            per_client: Counter[ClientKey] = Counter()
            decisions: dict[ClientKey, Counter[str]] = {}
            by_tenant: dict[str, Counter[str]] = {}
            last_seen: dict[ClientKey, float] = {}
            other = 0
            for bucket in self._buckets:
                other += bucket.other.get(policy, 0)
                for (tenant_label, decision), n in bucket.totals.get(policy, {}).items():
                    by_tenant.setdefault(tenant_label, Counter())[decision] += n
                for (tenant, client, agent, decision), n in bucket.counts.get(policy, {}).items():
                    key = (tenant, client, agent)
                    per_client[key] += n
                    decisions.setdefault(key, Counter())[decision] += n
                    seen = bucket.last_seen.get((policy, tenant, client, agent))
                    if seen is not None and seen > last_seen.get(key, 0.0):
                        last_seen[key] = seen
            ranked = heapq.nsmallest(top, per_client.items(), key=lambda item: client_sort_key(item[1], item[0]))
            complete = len(ranked) == len(per_client)
            by_decision: Counter[str] = Counter()
            for counts in by_tenant.values():
                by_decision.update(counts)
            out[policy] = {
                "window_seconds": self.window,
                "requests": sum(by_decision.values()),
                "by_decision": dict(by_decision),
                "by_tenant": {tenant: dict(counts) for tenant, counts in sorted(by_tenant.items())},
                "untracked_clients_requests": other,
                "clients": len(per_client),
                "top_clients": [
                    {
                        "tenant": tenant,
                        "client": client,
                        "user_agent": agent,
                        "requests": n,
                        "decisions": dict(decisions[(tenant, client, agent)]),
                        "last_seen": round(last_seen.get((tenant, client, agent), 0.0), 3),
                    }
                    for (tenant, client, agent), n in ranked
                ],
                "top_clients_complete": complete,
                # The list is sorted: a client left out made at most as many requests as the last one listed.
                "unlisted_max": 0 if complete else (ranked[-1][1] if ranked else max(per_client.values())),
                "top_clients_exact": True,
            }
        return out
