"""Who still uses deprecated behaviour: top clients per policy over a recent window, in bounded memory.

Every request on which a policy recorded a decision (``ctx.decisions``) counts for that policy, keyed by the
client's token fingerprint and User-Agent. The window is a ring of time buckets; each bucket keeps at most
``max_clients`` keys per policy and counts the rest as ``other``, so memory does not grow with the number of
clients.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ("UsageTracker",)

_UA_MAX = 200


@dataclass(slots=True)
class _Bucket:
    start: float
    counts: dict[str, Counter[tuple[str | None, str | None, str]]] = field(default_factory=dict)
    other: Counter[str] = field(default_factory=Counter)
    last_seen: dict[tuple[str, str | None, str | None], float] = field(default_factory=dict)


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

    def _current(self) -> _Bucket:
        now = self._clock()
        start = now - now % self.bucket_seconds
        if not self._buckets or self._buckets[-1].start != start:
            self._buckets.append(_Bucket(start))
            horizon = now - self.window
            self._buckets = [b for b in self._buckets if b.start + self.bucket_seconds > horizon]
        return self._buckets[-1]

    def record(self, decisions: Mapping[str, str], client: str | None, user_agent: str | None) -> None:
        if not decisions:
            return
        bucket = self._current()
        agent = user_agent[:_UA_MAX] if user_agent else None
        now = self._clock()
        for policy, decision in decisions.items():
            counts = bucket.counts.setdefault(policy, Counter())
            key = (client, agent, decision)
            if key in counts or len(counts) < self.max_clients:
                counts[key] += 1
                bucket.last_seen[(policy, client, agent)] = now
            else:
                bucket.other[policy] += 1

    def report(self, top: int = 20) -> dict[str, Any]:
        self._current()
        out: dict[str, Any] = {}
        policies = {p for b in self._buckets for p in b.counts}
        for policy in sorted(policies):
            per_client: Counter[tuple[str | None, str | None]] = Counter()
            decisions: dict[tuple[str | None, str | None], Counter[str]] = {}
            by_decision: Counter[str] = Counter()
            last_seen: dict[tuple[str | None, str | None], float] = {}
            other = 0
            for bucket in self._buckets:
                other += bucket.other.get(policy, 0)
                for (client, agent, decision), n in bucket.counts.get(policy, {}).items():
                    per_client[(client, agent)] += n
                    decisions.setdefault((client, agent), Counter())[decision] += n
                    by_decision[decision] += n
                    seen = bucket.last_seen.get((policy, client, agent))
                    if seen is not None:
                        last_seen[(client, agent)] = max(seen, last_seen.get((client, agent), 0.0))
            out[policy] = {
                "window_seconds": self.window,
                "requests": sum(per_client.values()) + other,
                "by_decision": dict(by_decision),
                "untracked_clients_requests": other,
                "top_clients": [
                    {
                        "client": client,
                        "user_agent": agent,
                        "requests": n,
                        "decisions": dict(decisions[(client, agent)]),
                        "last_seen": round(last_seen.get((client, agent), 0.0), 3),
                    }
                    for (client, agent), n in per_client.most_common(top)
                ],
            }
        return out
