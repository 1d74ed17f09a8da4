"""One request's rollout: each dated behaviour decided once, at one instant, for the request's client (every policy
of the request reads the same decision), whatever decided it: a date, an override, a brownout, a ramp, a freeze,
an exemption, a preview, and the phase a shadow window decides beside it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..core.decision import Decision
from .clock import Clock
from .plan import RolloutPlan

__all__ = ("KnownClients", "RequestClient", "RequestRollout", "parse_preview")

_MAX_PREVIEWS = 8


class KnownClients(Protocol):
    """Which clients the fleet has seen on a behaviour (the usage ledger's record, ``ops.ledger``)."""

    def seen_before(self, tenant: str, behaviour: str, client: str, at: float) -> bool | None:
        """Whether ``client`` made a call on ``behaviour`` before ``at``; None: it cannot be told now."""


class _Exchange(Protocol):
    """What is read of the exchange (``core.exchange.Exchange``)."""

    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def client(self) -> str | None: ...


def parse_preview(value: str | None) -> dict[str, str]:
    """A preview header's value: behaviour -> the phase asked for (``""``: its last); ``all`` stands for every
    behaviour. Malformed items are ignored (a preview only ever makes a client's answers stricter)."""
    if not value:
        return {}
    asked: dict[str, str] = {}
    for item in value.split(",")[:_MAX_PREVIEWS]:
        name, _, phase = item.strip().partition("=")
        name, phase = name.strip().lower(), phase.strip().lower()
        if name:
            asked[name] = phase
    return asked


class RequestClient:
    """The client of one request, as the engine reads it (``plan.Client``)."""

    __slots__ = ("_exchange", "_known", "_preview_header", "_previews")

    def __init__(self, exchange: _Exchange, known: KnownClients | None, preview_header: str | None) -> None:
        self._exchange = exchange
        self._known = known
        self._preview_header = preview_header
        self._previews: dict[str, str] | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        return self._exchange.headers

    @property
    def fingerprint(self) -> str | None:
        return self._exchange.client

    def previewed(self, behaviour: str) -> str | None:
        if self._preview_header is None:
            return None
        previews = self._previews
        if previews is None:
            previews = self._previews = parse_preview(self.headers.get(self._preview_header))
        return previews.get(behaviour, previews.get("all"))

    def seen_before(self, tenant: str, behaviour: str, at: float) -> bool | None:
        fingerprint = self.fingerprint
        if fingerprint is None:
            return True  # no token: no client to place (the service answers it 401)
        return None if self._known is None else self._known.seen_before(tenant, behaviour, fingerprint, at)


class RequestRollout:
    """The decisions of one request, made when a policy first asks (a request no dated policy serves costs
    nothing more), at the instant of the first."""

    __slots__ = ("_plan", "_tenant", "_clock", "_client", "_now", "decided")

    def __init__(self, plan: RolloutPlan, tenant: str, clock: Clock, client: RequestClient) -> None:
        self._plan = plan
        self._tenant = tenant
        self._clock = clock
        self._client = client
        self._now: float | None = None
        self.decided: dict[str, Decision] = {}

    @property
    def now(self) -> float:
        now = self._now
        if now is None:
            now = self._now = self._clock.now().timestamp()
        return now

    def decide(self, behaviour: str) -> Decision:
        decision = self.decided.get(behaviour)
        if decision is None:
            schedule = self._plan.schedules[self._tenant][behaviour]
            decision = self.decided[behaviour] = schedule.resolve(self.now, self._client, self._tenant)
        return decision

    def previews(self) -> list[str]:
        """``behaviour=phase`` for each behaviour decided for this request that its client asked to preview."""
        return [f"{name}={decision.phase}" for name, decision in self.decided.items()
                if self._client.previewed(name) is not None]
