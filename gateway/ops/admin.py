"""The admin listener (its own address, loopback by default): metrics, liveness, readiness, effective config,
rollout, the usage report, and the status page that shows them to people."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from ..rollout import Clock, RolloutPlan, report
from .fleet import Collected, collect, local_source, parse_top
from .metrics import Metrics
from .status import ConfigHistory, config_digest, shown_config, status_data
from .status_page import CONTENT_SECURITY_POLICY, render_page
from .usage import UsageTracker
from .workers import Peers

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
_HISTORY: web.AppKey[ConfigHistory] = web.AppKey("history")
_PEERS: web.AppKey[Peers | None] = web.AppKey("peers")


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


async def _config(request: web.Request) -> web.Response:
    state = request.app[_GATEWAY].state
    routes = [
        {"name": r.name, "methods": sorted(r.methods) if r.methods else None, "paths": list(r.templates), "chain": list(r.policies)}
        for r in [*state.routes.routes, state.routes.catch_all]
    ]
    return web.json_response({"source": state.config.source, "digest": config_digest(state.config),
                              "config": shown_config(state.config), "routes": routes})


async def _rollout(request: web.Request) -> web.Response:
    gateway = request.app[_GATEWAY]
    return web.json_response(report(gateway.state.rollout, gateway.clock.now()))


async def _usage(app: web.Application, top: int) -> Collected:
    """The usage report of the whole process: this worker's, merged with every sibling's under --workers N."""
    usage = app[_GATEWAY].usage
    peers = app[_PEERS]
    sources = peers.sources(usage) if peers is not None else [local_source("this process", usage)]
    return await collect(sources, top)


async def _deprecations(request: web.Request) -> web.Response:
    try:
        top = parse_top(request.query.get("top", "20"))
    except ValueError as err:
        return web.json_response({"code": "BAD_QUERY", "message": str(err)}, status=400)
    collected = await _usage(request.app, top)
    if collected.failed:
        # Never a silently partial report: the caller (gateway usage, a script) would count wrong.
        missing = "; ".join(f"{name}: {why}" for name, why in sorted(collected.failed.items()))
        return web.json_response({"code": "WORKERS_UNAVAILABLE", "message": f"not every worker answered ({missing})",
                                  "failed": collected.failed}, status=503)
    return web.json_response(collected.report)


async def _status_data(request: web.Request) -> dict[str, Any]:
    gateway = request.app[_GATEWAY]
    state = gateway.state
    collected = await _usage(request.app, 20)
    peers = request.app[_PEERS]
    return status_data(
        config=state.config, plan=state.rollout, clock=gateway.clock, history=request.app[_HISTORY],
        usage=collected.report, usage_sources=collected.answered if peers is not None else (),
        usage_failed=collected.failed,
    )


_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


async def _status(request: web.Request) -> web.Response:
    page = render_page(await _status_data(request))
    return web.Response(text=page, content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)


async def _status_json(request: web.Request) -> web.Response:
    data = await _status_data(request)
    return web.json_response(data, dumps=_dumps, headers={"Cache-Control": "no-store",
                                                          "X-Content-Type-Options": "nosniff"})


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


async def _root(request: web.Request) -> web.Response:
    raise web.HTTPFound("status")  # relative: the page also works behind a path prefix (kubectl proxy)


async def _favicon(request: web.Request) -> web.Response:
    return web.Response(status=204)  # browsers ask for one; the page has none (and logs no error for it)


def make_admin_app(gateway: Served, *, history: ConfigHistory | None = None, peers: Peers | None = None) -> web.Application:
    """``history``: the config's load and reload times (``gateway serve`` keeps it; by default, loaded now);
    ``peers``: this worker's siblings under ``--workers N`` (their usage reports are merged into this one's)."""
    app = web.Application()
    app[_GATEWAY] = gateway
    app[_HISTORY] = history if history is not None else ConfigHistory()
    app[_PEERS] = peers
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/config", _config)
    app.router.add_get("/deprecations", _deprecations)
    app.router.add_get("/rollout", _rollout)
    app.router.add_get("/status", _status)
    app.router.add_get("/status.json", _status_json)
    app.router.add_get("/", _root)
    app.router.add_get("/favicon.ico", _favicon)
    return app
