"""The admin listener (its own address, loopback by default): metrics, liveness, readiness, effective config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from ..rollout import Clock, RolloutPlan, report
from .metrics import Metrics
from .usage import UsageTracker

if TYPE_CHECKING:
    from ..config import LoadedConfig
    from ..core.routing import RouteTable

__all__ = ("Served", "make_admin_app")


class ServedState(Protocol):
    @property
    def config(self) -> LoadedConfig: ...
    @property
    def routes(self) -> RouteTable: ...
    @property
    def rollout(self) -> RolloutPlan: ...


class Served(Protocol):
    """What the admin listener reads of the gateway it serves (``gateway.app.Gateway``)."""

    metrics: Metrics
    clock: Clock
    usage: UsageTracker
    ready: bool

    @property
    def state(self) -> ServedState: ...


_GATEWAY: web.AppKey[Served] = web.AppKey("gateway")


async def _metrics(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    # The phase gauge is right at every scrape, even when no board request has come in since a date passed.
    gateway.state.rollout.publish(gateway.metrics.rollout_phase, gateway.clock.now().timestamp())
    if gateway.metrics.multiprocess:
        # Several workers: every worker's values, read from the shared directory (any worker may answer).
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest(gateway.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    ready = request.app[_GATEWAY].ready
    return web.json_response({"status": "ready" if ready else "not ready"}, status=200 if ready else 503)


def _shown(config: LoadedConfig) -> dict[str, Any]:
    """The config as loaded (secrets as their references, credentials in URLs masked), with the rollout section's
    dates in force."""
    data = config.shown()
    rollout = data.setdefault("rollout", {})
    for behaviour in config.behaviours.values():
        for flag in behaviour.all_flags():
            if flag.name not in rollout:
                value = config.model.rollout.dates().get(flag.name, flag.default)
                rollout[flag.name] = None if value is None else value.isoformat()
    return data


async def _config(request: web.Request) -> web.Response:
    state = request.app[_GATEWAY].state
    routes = [
        {"name": r.name, "methods": sorted(r.methods) if r.methods else None, "paths": list(r.templates), "chain": list(r.policies)}
        for r in [*state.routes.routes, state.routes.catch_all]
    ]
    return web.json_response({"source": state.config.source, "config": _shown(state.config), "routes": routes})


async def _rollout(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    return web.json_response(report(gateway.state.rollout, gateway.clock.now()))


async def _deprecations(request: web.Request) -> web.Response:
    try:
        top = int(request.query.get("top", "20"))
        if not 1 <= top <= 1000:
            raise ValueError
    except ValueError:
        return web.json_response({"code": "BAD_QUERY", "message": "top must be an integer from 1 to 1000"}, status=400)
    return web.json_response(request.app[_GATEWAY].usage.report(top))


def make_admin_app(gateway: Served) -> web.Application:
    app = web.Application()
    app[_GATEWAY] = gateway
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/config", _config)
    app.router.add_get("/deprecations", _deprecations)
    app.router.add_get("/rollout", _rollout)
    return app
