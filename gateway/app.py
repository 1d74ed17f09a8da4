"""Wiring: a config loaded (schema, then the policy registry), every route's chain built around the proxy core, and
the gateway's lifecycle (start, reload, drain, close). The road itself is in the packages, in its order: server,
edge, the route's chain (policies), proxy."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from .config import ConfigError, LoadedConfig, expand_references, parse_model, read_document
from .config.ledger import ClientNames
from .core.chain import fold
from .core.exchange import Next
from .core.ratelimit import RateLimits
from .core.spool import SpoolArea
from .edge.classify import parser_error_text
from .edge.route_table import RouteTable
from .edge.serve import Edge, GatewayState, InFlight
from .edge.tenancy import TenantResolver
from .ops.access_log import AccessLogWriter, LineSink, Recorder
from .ops.admin import COOKIE as ADMIN_COOKIE
from .ops.gc_pauses import freeze_built, let_go, paused, quick_handover
from .ops.ledger import Ledger, LedgerFamilies
from .ops.ledger.known import KnownClients, KnownFamilies, snapshot_path
from .ops.metrics import Metrics
from .ops.self_service import SelfService
from .ops.tracing import Tracing
from .ops.usage import UsageCounter
from .policies import POLICIES, BuildContext, check_config
from .proxy.core import ProxyCore
from .proxy.upstream import UpstreamClient
from .rollout import Clock, RolloutPlan, clock_from_config
from .server.listener import make_listener, metric_events
from .server.writer import send

__all__ = ("ConfigError", "Gateway", "GatewayState", "build_state", "load_config", "parse_config", "parser_error_text")


def parse_config(data: Any, source: str = "config", environ: Mapping[str, str] = os.environ, *,
                 unneeded: Callable[[Sequence[int | str]], bool] | None = None) -> LoadedConfig:
    """A config from parsed YAML (or a dict): ``${NAME}`` references from ``environ``, the schema, then the policy
    registry's checks. A problem never shows a value taken from the environment, nor the credentials of an upstream
    URL. ``unneeded``: the keys a command does not use, where an unset variable is not a problem
    (``expand_references``)."""
    data, secrets, problems = expand_references(data, environ, unneeded)
    if problems:
        raise ConfigError(problems, source)
    secrets = secrets.with_url_credentials(_upstream_urls(data))
    try:
        loaded = check_config(parse_model(data, source, policies=POLICIES), source)
    except ConfigError as err:
        raise ConfigError([secrets.redact(problem) for problem in err.problems], source) from None
    token = loaded.model.server.admin_token
    if token is not None:
        secrets = secrets.with_values([token])  # written in the file rather than ${NAME}: shown as <redacted>
    return dataclasses.replace(loaded, secrets=secrets)


def _upstream_urls(data: Any) -> list[str]:
    """The upstream URLs of a config not yet checked (whatever shape it has)."""
    tenants = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(tenants, list):
        return []
    return [t["upstream"] for t in tenants if isinstance(t, dict) and isinstance(t.get("upstream"), str)]


def load_config(path: str | Path, environ: Mapping[str, str] = os.environ, *,
                unneeded: Callable[[Sequence[int | str]], bool] | None = None) -> LoadedConfig:
    """The file's config, or ConfigError with every problem, each with its key's path and line."""
    with paused():
        document = read_document(path)
        try:
            return parse_config(document.data, str(path), environ, unneeded=unneeded)
        except ConfigError as err:
            raise ConfigError(document.annotate(err.problems), err.source) from None


def build_state(config: LoadedConfig, proxy: Next, clock: Clock, metrics: Metrics,
                spool: SpoolArea | None = None, limits: RateLimits | None = None) -> GatewayState:
    """The routes (built whole), each route's chain folded around ``proxy``, and the rollout plan of ``config``."""
    model = config.model
    if spool is None:
        spool = SpoolArea(model.spool)
    if limits is None:
        limits = RateLimits()
    routes = RouteTable.of(config, POLICIES)
    tenants = config.tenants()  # one Tenant per company, shared by the host map and the rollout plan
    plan = config.rollout_plan(tenants)
    timezone = model.rollout.tzinfo
    handlers: dict[str, Next] = {}
    for route in [*routes.routes, routes.catch_all]:
        ctx = BuildContext(route=route.name, params=route.params, clock=clock, timezone=timezone, rollout=plan,
                           families=metrics.families, companies=metrics.companies, spool=spool, limits=limits)
        policies = [POLICIES[name].make(options, ctx) for name, options in config.chains[route.name]]
        handlers[route.name] = fold(policies, proxy)
    server = model.server
    return GatewayState(config, TenantResolver.of(config, tenants), routes, handlers, plan,
                        body_timeout=server.client_body_timeout, look_ahead=server.method_override_look_ahead)


# What the admin listener reads from the config in force at each request: a reload applies it at once.
_LIVE_SERVER_KEYS = frozenset({"admin_token", "admin_open", "admin_hosts", "admin_login_lifetime"})


def _restart_part(model: Any, section: str) -> Any:
    part = getattr(model, section)
    return part.model_dump(exclude=_LIVE_SERVER_KEYS) if section == "server" else part


def _behaviours_of_policies() -> dict[str, str]:
    """A policy's name -> the dated behaviour its decisions are about (each deprecation policy declares one): the
    ledger counts usage by behaviour, as the rollout and the status page's timelines name it."""
    return {name: spec.behaviours[0].name for name, spec in POLICIES.items() if len(spec.behaviours) == 1}


class Gateway:
    """One gateway process's parts, from start to close: the upstream client and proxy core, the edge and the state
    it serves with (swapped whole on reload), the metrics, the recorder and the usage ledger."""

    def __init__(
        self,
        config: LoadedConfig,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        client: UpstreamClient | None = None,
        access_log: LineSink | None = None,
    ) -> None:
        self.access_log: LineSink = access_log if access_log is not None else AccessLogWriter()
        self.metrics = metrics or Metrics()
        self.metrics.companies.limit = config.model.metrics.max_companies
        self.clock = clock or clock_from_config(config.model.rollout)
        self._own_client = client is None
        self._client = client
        self._config = config
        # One spool area for the process's lifetime (its budget is the config's; a reload changes it in place).
        self.spool = SpoolArea(config.model.spool)
        # The service's limits on each token, as the bridges learnt them: kept for the process's lifetime, reloads
        # included (the service's limits do not change with the gateway's config).
        self.limits = RateLimits()
        self._state: GatewayState | None = None
        self.ready = False
        model = config.model
        # Who uses deprecated behaviour: counted per request in memory, written to the ledger in the background.
        self.usage: UsageCounter | None = None
        self.ledger: Ledger | None = None
        self.known: KnownClients | None = None  # a freeze's record of who was seen before its date
        self.own: SelfService | None = None  # a client's own usage on the public listener
        ledger = model.usage.ledger
        self.names = names = ClientNames(model.usage.clients)
        if ledger.enabled:
            self._usage_parts(config, names)
        self.recorder = Recorder(self.metrics, self.usage, self.access_log if model.access_log.enabled else None,
                                 observe=model.metrics.enabled, names=names)
        self.tracing = Tracing(model.tracing, self.metrics)
        self.in_flight = InFlight(self.metrics)
        # gateway_rollout_phase: the plan in force (swapped on reload) at the gateway's clock, at each scrape.
        self.metrics.rollout_phase.source = self._phases

    def _usage_parts(self, config: LoadedConfig, names: ClientNames) -> None:
        """With the ledger on: the counter, the ledger, a freeze's record and, when on, a client's own usage."""
        model = config.model
        ledger = model.usage.ledger
        self.usage = UsageCounter(max_clients=model.usage.max_clients, max_rows=ledger.max_pending_clients,
                                  behaviours=_behaviours_of_policies())
        self.ledger = Ledger(ledger, self.usage, redact=config.secrets.redact,
                             families=self.metrics.families(LedgerFamilies))
        known = self.metrics.families(KnownFamilies)
        for behaviour in config.behaviours:  # every behaviour's count from 0, frozen or not (dashboards, alerts)
            known.unplaced.labels(behaviour)
        self.known = KnownClients(self.ledger, snapshot_path(ledger, model.spool.dir), families=known)
        if model.usage.self_service.enabled:
            self.own = SelfService(model.usage.self_service, model.usage.readiness, self.ledger,
                                   lambda: self.state.rollout, self.clock, names)

    def _phases(self) -> tuple[RolloutPlan, float] | None:
        if self._state is None:
            return None
        return self._state.rollout, self.clock.now().timestamp()

    @property
    def state(self) -> GatewayState:
        assert self._state is not None, "Gateway.start() was not awaited"
        return self._state

    async def start(self) -> None:
        server = self._config.model.server
        if self._client is None:
            self._client = UpstreamClient.open(self._config.model.upstream, max_field_size=server.max_header_bytes)
        upstream = self._config.model.upstream
        self.proxy = ProxyCore(
            self._client, trust_forwarded=server.trust_forwarded_headers, forwarded_header=server.forwarded_header,
            max_concurrent_per_tenant=upstream.max_concurrent_per_tenant, queue_timeout=upstream.queue_timeout,
            strip_cookie=ADMIN_COOKIE,
        )
        self._state = build_state(self._config, self.proxy, self.clock, self.metrics, self.spool, self.limits)
        self.tracing.start()
        self.edge = Edge(lambda: self.state, self.proxy, self.recorder, self.in_flight, send, self.tracing,
                         self.clock, known=self.known, own=self.own)
        if self.ledger is not None:
            await self.ledger.start()  # in the background: the gateway serves whether its database answers or not
        if self.known is not None:
            self._watch_freezes()
            self.known.start()
        self.ready = True

    def _watch_freezes(self) -> None:
        """The freezes of the plan in force: their record is read, and this process's clients join it."""
        assert self.known is not None and self.usage is not None
        if self.known.watch(self.state.rollout):
            self.usage.seen = self.known.own

    def make_server(self) -> web.Server:
        """The public listener, serving through the edge (``server.listener``)."""
        return make_listener(self.edge, self._config.model.server, metric_events(self.metrics))

    async def reload_file(self, path: str | Path) -> tuple[LoadedConfig, list[str]]:
        """SIGHUP's reload: the file read, validated and everything built from it in a thread, so that the event loop
        serves meanwhile; then swapped in with one assignment. ConfigError (or whatever building it raised) leaves the
        running config in place.

        Returns the new config, and the sections that changed but only take effect on restart (listeners, upstream
        pool, access log, usage ledger, tracing).
        """
        state = await asyncio.to_thread(self._build_file, path)
        replaced = [self._state]
        changed = self._swap(state)
        await asyncio.to_thread(let_go, replaced)  # not freed here: at 10,000 companies, tens of ms of the loop
        return state.config, changed

    def _build_file(self, path: str | Path) -> GatewayState:
        with paused(), quick_handover():
            state = self._build(load_config(path))
            freeze_built()
            return state

    def _build(self, config: LoadedConfig) -> GatewayState:
        """Everything the running state is made of, built from ``config``; the running state is left as it is (the
        spool area's budget and directory are the new config's from here, the old ones again if this fails)."""
        previous = self._config.model.spool
        self.spool.configure(config.model.spool)
        try:
            state = build_state(config, self.proxy, self.clock, self.metrics, self.spool, self.limits)
            if self.known is not None:
                state.rollout.shared()  # the plan's distinct schedules, for the freezes the swap watches
            return state
        except BaseException:
            self.spool.configure(previous)
            raise

    def _swap(self, state: GatewayState) -> list[str]:
        old, self._config, self._state = self._config.model, state.config, state
        new = state.config.model
        self.metrics.companies.limit = new.metrics.max_companies
        if self.known is not None:
            self._watch_freezes()
        restart = ("server", "upstream", "access_log", "usage", "tracing")
        return [name for name in restart if _restart_part(old, name) != _restart_part(new, name)]

    async def drain(self, timeout: float) -> int:
        """Let every request in flight finish (uploads still arriving, answers still leaving, bodies a policy holds),
        each answered with ``Connection: close``, for at most ``timeout`` seconds. Returns how many are still running;
        from then on they are recorded as cut by the shutdown."""
        return await self.in_flight.drain(timeout)

    async def close(self) -> None:
        """After the requests in flight: the ledger's last write, the access log, the upstream pool, then the spans
        still queued for export (bounded in time)."""
        self.ready = False
        if self.known is not None:
            await self.known.close()
        if self.ledger is not None:
            await self.ledger.close()
        flush = getattr(self.access_log, "flush", None)
        if flush is not None:
            flush()
        if self._own_client and self._client is not None:
            await self._client.close()
        await self.tracing.close()
