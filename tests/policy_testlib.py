"""Unit-test helpers for a policy alone: a mocked request, its exchange, the policy built from a config, and a stand-in
for the proxy core that runs the exchange's request-body filters with the core's own pipeline and records what it
would have forwarded. No sockets (the integration tests have those)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

from aiohttp import StreamReader, web
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.test_utils import make_mocked_request

from gateway.app import parse_config
from gateway.config import LoadedConfig
from gateway.core.exchange import Exchange, Next, Policy, Reply
from gateway.core.route import Route
from gateway.core.template import PathTemplate
from gateway.ops.metrics import Metrics
from gateway.policies import POLICIES, BuildContext
from gateway.rollout import Clock, FixedClock, RolloutPlan
from gateway.rollout.request import RequestClient, RequestRollout


def mocked_request(
    method: str, path: str, headers: list[tuple[str, str]] | dict[str, str] | None = None, body: bytes | None = None,
    *, eof: bool = True,
) -> web.BaseRequest:
    """A request whose body (if any) is already in its stream; ``eof`` False: more of it could still come."""
    payload: Any
    if body is None:
        payload = EMPTY_PAYLOAD
    else:
        payload = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
        payload.feed_data(body)
        if eof:
            payload.feed_eof()
    writer = mock.Mock()
    writer.write = mock.AsyncMock()
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    return make_mocked_request(method, path, pairs, payload=payload, writer=writer)


def exchange_for(config: LoadedConfig, request: web.BaseRequest, route: str, params: dict[str, str],
                 tenant: str = "acme", request_id: str | None = None) -> Exchange:
    """The exchange the edge would make for ``request`` on ``route`` of ``config``, for a tenant it knows (its
    rollout is given by ``with_rollout``, or by the policy ``build_policy`` makes, as the edge gives it)."""
    found = next(t for t in config.tenants() if t.name == tenant)
    path = request.raw_path.partition("?")[0]
    exchange = Exchange(request, 0.0, found, Route.build(route, None, (), ()), params, path, "", request.method,
                        body_timeout=5.0)
    exchange.request_id = request_id
    return exchange


def with_rollout(exchange: Exchange, plan: RolloutPlan, clock: Clock) -> Exchange:
    """The exchange with its one rollout decision per behaviour, as the edge gives it (no record of the fleet's
    clients: a freeze cannot place a client)."""
    exchange.rollout = RequestRollout(plan, exchange.tenant.name, clock, RequestClient(exchange, None, plan.preview))
    return exchange


def build_policy(config: LoadedConfig, route: str, name: str, at: str, metrics: Metrics | None = None) -> Policy:
    """The policy ``name`` of ``route``'s chain, built as the gateway builds it, with the clock fixed at ``at``; an
    exchange it is given without a rollout gets one from the same plan and clock, as the edge would give it."""
    metrics = metrics or Metrics()
    options = dict(config.chains[route])[name]
    params = frozenset(p for r in config.model.routes if r.name == route for path in r.paths
                       for p in PathTemplate.of(path).params)
    clock = FixedClock(dt.datetime.fromisoformat(at))
    plan = config.rollout_plan()
    ctx = BuildContext(route=route, params=params, clock=clock, timezone=config.model.rollout.tzinfo, rollout=plan,
                       families=metrics.families)
    policy = POLICIES[name].make(options, ctx)

    async def as_at_the_edge(exchange: Exchange, next: Next) -> Reply:
        if exchange.rollout is None:
            with_rollout(exchange, plan, clock)
        return await policy(exchange, next)

    return as_at_the_edge


def config_of(data: dict[str, Any]) -> LoadedConfig:
    return parse_config(data, "test")


Responder = Callable[[Exchange], Awaitable[Reply]]


async def _ok(exchange: Exchange) -> Reply:
    return Reply(200, body=b"upstream")


class Terminal:
    """Stands in for the proxy core: runs the request filters as the core does (nothing forwarded before they let a
    first byte through), records what it would have forwarded, and answers with ``responder``."""

    def __init__(self, responder: Responder = _ok) -> None:
        self.responder = responder
        self.calls = 0  # times the chain reached the proxy core
        self.forwarded = 0  # times something would have been sent upstream
        self.body: bytes | None = None
        self.seen: list[Exchange] = []

    async def __call__(self, exchange: Exchange) -> Reply:
        self.calls += 1
        self.seen.append(exchange)
        if exchange.has_body:
            refused = await exchange.body.prime()
            if refused is not None:
                return refused
            self.forwarded += 1
            self.body = b"".join([chunk async for chunk in exchange.body])
        else:
            self.forwarded += 1
        return await self.responder(exchange)
