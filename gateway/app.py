"""Wiring: load a config, build every route's chain around the proxy core, and serve each request at the edge.

The road of a request: listener -> canonical path -> tenant (by Host) -> route -> the route's chain (outermost
first) -> proxy core -> upstream, and back through the same chain; then the proxy core writes the reply. The edge
(``Gateway.serve``) holds that whole road in one ``try``/``finally``, which records the request exactly once however
it ends: one access-log line, one count in the metrics, its usage entry, and the in-flight gauge back where it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import hdrs, http_exceptions, web
from multidict import CIMultiDictProxy

from .config import ConfigError, LoadedConfig, expand_references, parse_model, read_document
from .core.chain import fold
from .core.exchange import Exchange, Next, Reply
from .core.http import new_request_id
from .core.routing import BadRequestTarget, Route, RouteTable, effective_method, normalise_target
from .core.spec import template_params
from .core.spool import SpoolArea
from .core.tenants import TenantResolver, canonical_host
from .ops.access_log import AccessLogWriter, LineSink, Recorder
from .ops.metrics import Metrics
from .ops.ledger import Ledger, LedgerFamilies
from .ops.tracing import Tracing
from .ops.usage import UsageCounter
from .policies import POLICIES, BuildContext, check_config
from .proxy.body_override import resolve_body_override
from .proxy.core import ProxyCore
from .proxy.listener import Listener
from .proxy.upstream import UpstreamClient
from .proxy.writer import Delivery, send
from .rollout import Clock, RolloutPlan, clock_from_config

__all__ = ("ConfigError", "Gateway", "GatewayState", "build_state", "load_config", "parse_config", "parser_error_text")

log = logging.getLogger("gateway")


def parse_config(data: Any, source: str = "config", environ: Mapping[str, str] = os.environ) -> LoadedConfig:
    """A config from parsed YAML (or a dict): ``${NAME}`` references from ``environ``, the schema, then the policy
    registry's checks. A problem never shows a value taken from the environment, nor the credentials of an upstream
    URL."""
    data, secrets, problems = expand_references(data, environ)
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


def load_config(path: str | Path, environ: Mapping[str, str] = os.environ) -> LoadedConfig:
    """The file's config, or ConfigError with every problem, each with its key's path and line."""
    document = read_document(path)
    try:
        return parse_config(document.data, str(path), environ)
    except ConfigError as err:
        raise ConfigError(document.annotate(err.problems), err.source) from None


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything built from one config: swapped whole on reload, never edited in place."""

    config: LoadedConfig
    tenants: TenantResolver
    routes: RouteTable
    handlers: dict[str, Next]
    rollout: RolloutPlan


def build_state(config: LoadedConfig, proxy: Next, clock: Clock, metrics: Metrics,
                spool: SpoolArea | None = None) -> GatewayState:
    model = config.model
    if spool is None:
        spool = SpoolArea(model.spool)
    routes = [Route.build(r.name, r.methods, r.paths, r.prefixes) for r in model.routes]
    catch_all = Route.build("catch_all", None, (), ())
    plan = config.rollout_plan()
    timezone = model.rollout.tzinfo
    handlers: dict[str, Next] = {}
    for route in [*routes, catch_all]:
        chain = config.chains[route.name]
        params = frozenset(p for template in route.templates for p in template_params(template))
        ctx = BuildContext(route=route.name, params=params, clock=clock, timezone=timezone, rollout=plan,
                           families=metrics.families, spool=spool)
        policies = [POLICIES[name].make(options, ctx) for name, options in chain]
        route.policies = tuple(name for name, _ in chain)
        route.guarded = any(b.security for name, _ in chain for b in POLICIES[name].behaviours)
        handlers[route.name] = fold(policies, proxy)
    return GatewayState(config, config.tenant_resolver(), RouteTable(routes, catch_all), handlers, plan)


# What the admin listener reads from the config in force at each request: a reload applies it at once.
_LIVE_SERVER_KEYS = frozenset({"admin_token", "admin_open", "admin_hosts"})


def _restart_part(model: Any, section: str) -> Any:
    part = getattr(model, section)
    return part.model_dump(exclude=_LIVE_SERVER_KEYS) if section == "server" else part


def _behaviours_of_policies() -> dict[str, str]:
    """A policy's name -> the dated behaviour its decisions are about (each deprecation policy declares one): the
    ledger counts usage by behaviour, as the rollout and the status page's timelines name it."""
    return {name: spec.behaviours[0].name for name, spec in POLICIES.items() if len(spec.behaviours) == 1}


_PARSER_CODES = {400: "MALFORMED_REQUEST", 413: "REQUEST_TOO_LARGE", 431: "HEADERS_TOO_LARGE"}
# What the answer says, by the kind of error (most specific first). The parser's own text is never echoed: it can
# quote the request's bytes (a header with a token, a signed query string), whatever parser (C or Python) wrote it.
_PARSER_TEXTS: tuple[tuple[type[BaseException], str], ...] = (
    (http_exceptions.LineTooLong, "a request line or header is too long"),
    (http_exceptions.BadHttpMethod, "the request method is not valid"),
    (http_exceptions.BadStatusLine, "the request line is not valid"),
    (http_exceptions.InvalidURLError, "the request target is not valid"),
    (http_exceptions.InvalidHeader, "a header is not valid"),
    (http_exceptions.PayloadEncodingError, "the request body's framing is not valid"),
)


def parser_error_text(exc: BaseException | None) -> str:
    """What a 4xx answer to a request the HTTP parser rejected says: fixed text by kind, never the parser's own."""
    return next((text for kind, text in _PARSER_TEXTS if isinstance(exc, kind)), "the request is not valid HTTP/1.1")


def _codings(headers: CIMultiDictProxy[str]) -> list[str]:
    return [c.strip().lower() for v in headers.getall(hdrs.TRANSFER_ENCODING) for c in v.split(",") if c.strip()]


def _utf8_values(request: web.BaseRequest) -> bool:
    """Whether every header value is UTF-8. aiohttp reads other bytes (obs-text, RFC 9110 5.5) into strings it can
    only write back without them, so such a request would reach the upstream altered."""
    try:
        for _, value in request.raw_headers:
            value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass(slots=True)
class _Refusal:
    """A request answered before routing: its answer, its code and its request id (for the record)."""

    reply: Reply
    code: str
    request_id: str

    @classmethod
    def of(cls, status: int, code: str, message: str) -> _Refusal:
        rid = new_request_id()
        reply = Reply.error(status, code, message, rid)
        reply.close_connection = True
        return cls(reply, code, rid)


class Gateway:
    """The public listener's edge; owns the upstream client, the metrics, the recorder and the current state."""

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
        self.clock = clock or clock_from_config(config.model.rollout)
        self._own_client = client is None
        self._client = client
        self._config = config
        # One spool area for the process's lifetime (its budget is the config's; a reload changes it in place).
        self.spool = SpoolArea(config.model.spool)
        self._state: GatewayState | None = None
        self.ready = False
        # Shutdown: while draining, every answer closes its connection; at the deadline what still runs is cut.
        self.draining = False
        self._cutting = False
        # The edge's task of each request in flight (what the shutdown deadline cuts), and those it cut.
        self._serving: dict[asyncio.Task[Any], tuple[web.BaseRequest, Exchange | None]] = {}
        self._cut_tasks: set[asyncio.Task[Any]] = set()
        self._running = 0  # requests between their arrival and their record
        self._all_done = asyncio.Event()
        self._all_done.set()
        model = config.model
        # Who uses deprecated behaviour: counted per request in memory, written to the ledger in the background.
        self.usage: UsageCounter | None = None
        self.ledger: Ledger | None = None
        ledger = model.usage.ledger
        if ledger.enabled:
            self.usage = UsageCounter(max_clients=model.usage.max_clients, max_rows=ledger.max_pending_clients,
                                      behaviours=_behaviours_of_policies())
            self.ledger = Ledger(ledger, self.usage, redact=config.secrets.redact,
                                 families=self.metrics.families(LedgerFamilies))
        self.recorder = Recorder(self.metrics, self.usage, self.access_log if model.access_log.enabled else None,
                                 observe=model.metrics.enabled)
        self.tracing = Tracing(model.tracing, self.metrics)
        # gateway_rollout_phase: the plan in force (swapped on reload) at the gateway's clock, at each scrape.
        self.metrics.rollout_phase.source = self._phases

    def _phases(self) -> Iterable[tuple[str, str, str, float]]:
        if self._state is None:
            return ()
        return self._state.rollout.phase_samples(self.clock.now().timestamp())

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
            body_timeout=server.client_body_timeout,
            max_concurrent_per_tenant=upstream.max_concurrent_per_tenant, queue_timeout=upstream.queue_timeout,
        )
        self._state = build_state(self._config, self.proxy, self.clock, self.metrics, self.spool)
        self.tracing.start()
        if self.ledger is not None:
            await self.ledger.start()  # in the background: the gateway serves whether its database answers or not
        self.ready = True

    def reload(self, config: LoadedConfig) -> list[str]:
        """Build everything from the new config first, then swap it in with one assignment.

        Returns the sections that changed but only take effect on restart (listeners, upstream pool, access log,
        usage ledger).
        """
        previous = self._config.model.spool
        self.spool.configure(config.model.spool)
        try:
            self._state = build_state(config, self.proxy, self.clock, self.metrics, self.spool)
        except BaseException:
            self.spool.configure(previous)
            raise
        old, self._config = self._config.model, config
        new = config.model
        restart = ("server", "upstream", "access_log", "usage", "tracing")
        return [name for name in restart if _restart_part(old, name) != _restart_part(new, name)]

    async def close(self) -> None:
        """After the requests in flight: the ledger's last write, the access log, the upstream pool, then the spans
        still queued for export (bounded in time)."""
        self.ready = False
        if self.ledger is not None:
            await self.ledger.close()
        flush = getattr(self.access_log, "flush", None)
        if flush is not None:
            flush()
        if self._own_client and self._client is not None:
            await self._client.close()
        await self.tracing.close()

    async def drain(self, timeout: float) -> int:
        """Let every request in flight finish (uploads still arriving, answers still leaving, bodies a policy holds),
        each answered with ``Connection: close``, for at most ``timeout`` seconds. Returns how many are still running;
        from then on they are recorded as cut by the shutdown."""
        self.draining = True
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout)
        except TimeoutError:
            self._cutting = True
            # What has not started its answer is cut now, by the edge, so that its client gets the 503 the record
            # says (aiohttp's own shutdown, after this, would only close the connection).
            for task, (request, exchange) in list(self._serving.items()):
                if not request.writer.output_size and not task.done():
                    if exchange is not None:
                        exchange.notes["cut"] = "shutdown"  # what a policy that undoes its work on the way reads
                    self._cut_tasks.add(task)
                    task.cancel("shutdown deadline")
        return self._running

    def make_server(self) -> web.Server:
        server = self._config.model.server
        return Listener(
            self,
            header_timeout=server.client_header_timeout,
            keepalive_timeout=server.client_keepalive_timeout,
            max_connections=server.max_connections,
            events=self._listener_event,
            max_line_size=server.max_header_bytes,
            max_field_size=server.max_header_bytes,
            # Bodies pass through as sent: a gzip request body must reach the upstream still gzipped.
            auto_decompress=False,
            read_bufsize=256 * 1024,
            # A client that goes away cancels its request, and with it the upstream request and connection.
            handler_cancellation=True,
            # After an early answer, unread request bytes are read and dropped for at most this long, so the client
            # can read the answer before the connection closes (aiohttp's default is 10 s).
            lingering_time=2.0,
            # Every request is recorded by the edge itself (ops.access_log), never by aiohttp's access logger.
            access_log=None,
        )

    def _listener_event(self, kind: str) -> None:
        metrics = self.metrics
        if kind == "connection_opened":
            metrics.connections_open.inc()
        elif kind == "connection_closed":
            metrics.connections_open.dec()
        elif kind == "connection_refused":
            metrics.connections_refused.inc()
        else:
            metrics.client_timeouts.labels(kind.removesuffix("_timeout")).inc()

    async def serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """The edge: classify, run the route's chain, write the reply; record the request once, however it ends."""
        started = time.monotonic()
        state = self.state
        exchange: Exchange | None = None
        refusal: _Refusal | None = None
        delivery = Delivery()
        status = 0
        client_gone = False
        trace = self.tracing.begin(request)  # the client's trace continued (or a new one): the server span starts
        self._arrived()
        task = asyncio.current_task()
        if task is not None:
            self._serving[task] = (request, None)
        try:
            classified = self._classify(request, state, started)
            if isinstance(classified, _Refusal):
                refusal = classified
                reply = refusal.reply
            else:
                exchange = classified
                exchange.trace = trace
                if task is not None:
                    self._serving[task] = (request, exchange)
                try:
                    server = state.config.model.server
                    overridden = await resolve_body_override(
                        exchange, state.routes, look_ahead=server.method_override_look_ahead,
                        timeout=server.client_body_timeout,
                    )
                    reply = overridden or await state.handlers[exchange.route.name](exchange)
                except asyncio.CancelledError:
                    if task is None or task not in self._cut_tasks:
                        raise
                    # Cut by the shutdown deadline (``drain``): answered below, like a chain that returned then.
                    task.uncancel()
                    reply = self._cut(exchange)
                except Exception:
                    log.exception("unhandled error on route %s (request id %s)", exchange.route.name,
                                  exchange.request_id)
                    reply = Reply.error(500, "INTERNAL_ERROR", "the gateway failed to handle this request",
                                        exchange.ensure_request_id())
            if self._cutting:
                reply = self._cut(exchange)
            status = reply.status
            if self.draining or hdrs.UPGRADE in request.headers:
                # An upgrade is not proxied (the service specifies none): the request is answered as a plain one
                # (RFC 9110 7.8), and since aiohttp reads nothing more on a connection once asked to upgrade, the
                # connection closes after the answer instead of leaving a pipelined request unread.
                reply.close_connection = True
            try:
                response = await send(request, reply, delivery)
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as err:
                response = await self._failed_to_send(request, exchange, delivery, err)
            status = response.status
            return response
        except asyncio.CancelledError:
            client_gone = True  # aiohttp cancels the handler of a connection the client closed
            raise
        except ConnectionError:
            # The answer was cut part way: by the client, unless the upstream's body broke off (then its status and
            # the bytes actually sent are recorded, with the upstream error).
            client_gone = exchange is None or not (exchange.upstream_error or "").startswith("body_")
            raise
        finally:
            if task is not None:
                self._serving.pop(task, None)
                self._cut_tasks.discard(task)
            self._left()
            if self._cutting and not delivery.complete:
                # Still running at the shutdown deadline: cut. Its status is the one sent, or 503 if none was.
                status = status if request.writer.output_size else 503
                if exchange is not None:
                    exchange.notes["cut"] = "shutdown"
            elif client_gone and not delivery.complete:
                # 499: the client left before it had the whole answer (leaving while the gateway lingers after the
                # answer does not change what it was answered).
                status = 499
            self.recorder.record(
                request, exchange, status, started,
                refused=refusal.code if refusal else None, request_id=refusal.request_id if refusal else None,
                trace=trace,
            )
            if trace is not None:
                self.tracing.end(trace, request, exchange, status, refusal.code if refusal else None)

    async def serve_unparsed(
        self, request: web.BaseRequest, status: int, exc: BaseException | None
    ) -> web.StreamResponse:
        """A request the HTTP parser rejected: a JSON answer naming the kind of error (never its text), recorded."""
        if status >= 500:
            code, text = "INTERNAL_ERROR", "the gateway failed to handle this request"
        else:
            code, text = _PARSER_CODES.get(status, "BAD_REQUEST"), parser_error_text(exc)
        log.info("refused a request the HTTP parser rejected: %s %s", status, type(exc).__name__ if exc else "")
        return await self._refuse(request, _Refusal.of(status, code, text), parsed=False)

    async def serve_busy(self, request: web.BaseRequest) -> web.StreamResponse:
        """The first request on a connection over server.max_connections: 503, and the connection closes."""
        refusal = _Refusal.of(503, "TOO_MANY_CONNECTIONS",
                              "the gateway has as many connections open as it accepts; retry shortly")
        refusal.reply.headers["Retry-After"] = "1"
        return await self._refuse(request, refusal)

    async def _refuse(self, request: web.BaseRequest, refusal: _Refusal, *, parsed: bool = True) -> web.StreamResponse:
        started = time.monotonic()
        status = refusal.reply.status
        delivery = Delivery()
        trace = self.tracing.begin(request, parsed=parsed)
        self._arrived()
        try:
            return await send(request, refusal.reply, delivery)
        finally:
            self._left()
            status = status if delivery.complete else 499
            self.recorder.record(request, None, status, started, refused=refusal.code, request_id=refusal.request_id,
                                 trace=trace)
            if trace is not None:
                self.tracing.end(trace, request, None, status, refusal.code)

    def _arrived(self) -> None:
        """A request is in flight until ``_left``: the in-flight gauge, and what ``drain`` waits for."""
        self.metrics.in_flight.inc()
        self._running += 1
        self._all_done.clear()

    def _left(self) -> None:
        self.metrics.in_flight.dec()
        self._running -= 1
        if not self._running:
            self._all_done.set()

    def _classify(self, request: web.BaseRequest, state: GatewayState, started: float) -> Exchange | _Refusal:
        headers = request.headers
        hosts = headers.getall(hdrs.HOST, ())
        if len(hosts) > 1:
            return _Refusal.of(400, "BAD_HOST", "the request has more than one Host header")
        host = hosts[0] if hosts else None
        if hdrs.TRANSFER_ENCODING in headers and _codings(headers) != ["chunked"]:
            # aiohttp takes "gzip, chunked" and decodes only the chunked framing: the upstream would be sent gzip
            # bytes labelled as plain.
            return _Refusal.of(400, "BAD_TRANSFER_ENCODING", "a request body may use no transfer coding but chunked")
        if not all(value.isascii() for _, value in request.raw_headers) and not _utf8_values(request):
            return _Refusal.of(400, "BAD_HEADER", "a header value is not UTF-8: it cannot be forwarded as it was sent")
        try:
            target = normalise_target(request.raw_path)
            if target.authority is not None and (host is None or canonical_host(target.authority) != canonical_host(host)):
                raise BadRequestTarget("BAD_REQUEST_TARGET", "the absolute-form request target names another host")
            method = effective_method(request.method, headers, target.query)
        except BadRequestTarget as err:
            return _Refusal.of(400, err.code, err.message)
        tenant = state.tenants.resolve(host)
        if tenant is None:
            return _Refusal.of(421, "UNKNOWN_HOST", "this gateway serves no company at the requested host")
        route, params = state.routes.match(method, target.path)
        exchange = Exchange(request, started, tenant, route, params, target.path, target.query, method)
        exchange.services = self.proxy
        return exchange

    @staticmethod
    def _cut(exchange: Exchange | None) -> Reply:
        """The answer to a request the shutdown deadline cut: whatever the chain made of the cut (the upstream
        request abandoned) is not the upstream's doing."""
        rid = None
        if exchange is not None:
            exchange.notes["cut"] = "shutdown"
            exchange.upstream_error = exchange.upstream_error_kind = None
            rid = exchange.ensure_request_id()
        reply = Reply.error(503, "SHUTTING_DOWN", "the gateway stopped before this request could finish", rid)
        reply.close_connection = True
        return reply

    async def _failed_to_send(self, request: web.BaseRequest, exchange: Exchange | None, delivery: Delivery,
                              err: Exception) -> web.StreamResponse:
        """A bug while writing the answer: a 500 if nothing was sent yet, else the connection is cut."""
        route = exchange.route.name if exchange else "none"
        log.error("unhandled error writing the answer on route %s", route, exc_info=err)
        if request.writer.output_size:
            raise ConnectionResetError("the answer failed part way") from err
        rid = exchange.ensure_request_id() if exchange else new_request_id()
        failed = Reply.error(500, "INTERNAL_ERROR", "the gateway failed to handle this request", rid)
        return await send(request, failed, delivery)
