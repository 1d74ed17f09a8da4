"""Wiring: classify each request (tenant, canonical path, route), run its route's chain, and serve it.

The road of a request: listener -> normalise path -> match tenant and route -> the route's chain (outermost
first) -> proxy core -> upstream, and back through the same chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import hdrs, http_exceptions, web
from aiohttp.web_protocol import RequestHandler

from .core.chain import fold
from .config import LoadedConfig
from .core.http import json_error, new_request_id
from .ops.observability import AccessLogger, AccessLogWriter, LineSink, Metrics
from .policies import POLICIES, BuildContext
from .proxy.core import ProxyCore
from .rollout import Clock, RolloutPlan, clock_from_config
from .core.routing import BadRequestTarget, Route, RouteTable, effective_method, normalise_target
from .core.tenants import TenantResolver, canonical_host
from .core.exchange import CTX, REFUSAL, Handler, RequestContext
from .proxy.upstream import UpstreamClient
from .ops.usage import UsageTracker

__all__ = ("Gateway", "GatewayState", "build_state")

log = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything built from one config: swapped whole on reload, never edited in place."""

    config: LoadedConfig
    tenants: TenantResolver
    routes: RouteTable
    handlers: dict[str, Handler]
    rollout: RolloutPlan


def build_state(config: LoadedConfig, proxy: ProxyCore, clock: Clock, metrics: Metrics) -> GatewayState:
    model = config.model
    routes = [Route.build(r.name, r.methods, r.paths, r.prefixes) for r in model.routes]
    catch_all = Route.build("catch_all", None, (), ())
    plan = RolloutPlan.from_config(model)
    # On every (re)build: the phase gauge restarts from this config's tenants; /metrics refreshes it at each scrape.
    plan.publish(metrics, clock.now().timestamp(), clear=True)
    handlers: dict[str, Handler] = {}
    for route in [*routes, catch_all]:
        chain = config.chains[route.name]
        ctx = BuildContext(route_name=route.name, clock=clock, metrics=metrics, config=model, rollout=plan)
        middlewares = [POLICIES[name].build(options, ctx) for name, options in chain]
        route.policies = tuple(name for name, _ in chain)
        handlers[route.name] = fold(middlewares, proxy)
    return GatewayState(config, config.tenant_resolver(), RouteTable(routes, catch_all), handlers, plan)


_PARSER_CODES = {400: "MALFORMED_REQUEST", 413: "REQUEST_TOO_LARGE", 431: "HEADERS_TOO_LARGE", 500: "INTERNAL_ERROR"}
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


def refuse(request: web.BaseRequest, metrics: Metrics, status: int, code: str, message: str) -> web.Response:
    """A JSON error for a request the gateway does not forward; counted, and named in its access-log line."""
    metrics.refused.labels(code).inc()
    rid = new_request_id()
    request[REFUSAL] = (code, rid)
    response = json_error(status, code, message, rid)
    response.force_close()
    return response


class _Connection(RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses with the gateway's JSON errors.

    aiohttp's own answer is text/plain, and its log line carries the parser's context, which can quote the request's
    bytes (a header with a token in it): here the log and the answer name only the status and the kind of error.
    """

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response head is already sent")
        code = _PARSER_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")
        if status >= 500:
            text = "the gateway failed to handle this request"
        else:
            text = parser_error_text(exc)
        log.info("refused a request the HTTP parser rejected: %s %s", status, type(exc).__name__ if exc else "")
        manager = self._manager
        assert isinstance(manager, _Server)
        return refuse(request, manager.metrics, status, code, text)


class _Server(web.Server):
    """The low-level server, with the gateway's connection handler."""

    def __init__(self, handler: Handler, *, metrics: Metrics, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.metrics = metrics

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class Gateway:
    """The public listener's request handler; owns the upstream client, the metrics and the current state."""

    def __init__(
        self,
        config: LoadedConfig,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        session: aiohttp.ClientSession | None = None,
        access_log: LineSink | None = None,
    ) -> None:
        self.access_log: LineSink = access_log if access_log is not None else AccessLogWriter()
        self.metrics = metrics or Metrics()
        self.clock = clock or clock_from_config(config.model.rollout)
        self._own_session = session is None
        self._session = session
        self._config = config
        self._state: GatewayState | None = None
        self.ready = False
        self._access_logger: AccessLogger | None = None
        usage = config.model.usage
        self.usage = UsageTracker(window_seconds=usage.window_seconds, max_clients=usage.max_clients)

    @property
    def state(self) -> GatewayState:
        assert self._state is not None, "Gateway.start() was not awaited"
        return self._state

    async def start(self) -> None:
        server = self._config.model.server
        if self._session is None:
            client = UpstreamClient.open(self._config.model.upstream, max_field_size=server.max_header_bytes)
        else:
            client = UpstreamClient(self._session)  # every request through ClientSession.request
        self.proxy = ProxyCore(
            client,
            self.metrics,
            trust_forwarded=server.trust_forwarded_headers,
            body_timeout=server.client_body_timeout,
        )
        self._state = build_state(self._config, self.proxy, self.clock, self.metrics)
        self.ready = True

    def reload(self, config: LoadedConfig) -> list[str]:
        """Build everything from the new config first, then swap it in with one assignment.

        Returns the sections that changed but only take effect on restart (listeners, upstream pool, access log).
        """
        self._state = build_state(config, self.proxy, self.clock, self.metrics)
        old, self._config = self._config.model, config
        new = config.model
        return [name for name in ("server", "upstream", "access_log") if getattr(old, name) != getattr(new, name)]

    async def close(self) -> None:
        self.ready = False
        flush = getattr(self.access_log, "flush", None)
        if flush is not None:
            flush()
        if self._own_session and self._state is not None:
            await self.proxy.client.close()

    def make_server(self) -> web.Server:
        server = self._config.model.server
        sink = self.access_log if self._config.model.access_log.enabled else None
        logger_cls = type(
            "GatewayAccessLogger",
            (AccessLogger,),
            {"metrics": self.metrics, "usage": self.usage, "sink": sink, "observe": self._config.model.metrics.enabled},
        )
        # aiohttp calls the access logger only when it has a logging.Logger; lines go to the sink, not to it.
        logger = logging.getLogger("gateway.access")
        self._access_logger = logger_cls(logger, "")
        return _Server(
            self.handle,
            metrics=self.metrics,
            access_log_class=logger_cls,
            access_log=logger,
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
        )

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        state = self._state
        assert state is not None
        headers = request.headers
        hosts = headers.getall(hdrs.HOST, ())
        if len(hosts) > 1:
            return refuse(request, self.metrics, 400, "BAD_HOST", "the request has more than one Host header")
        host = hosts[0] if hosts else None
        try:
            target = normalise_target(request.raw_path)
            if target.authority is not None and (host is None or canonical_host(target.authority) != canonical_host(host)):
                raise BadRequestTarget("BAD_REQUEST_TARGET", "the absolute-form request target names another host")
            method = effective_method(request.method, headers, target.query)
        except BadRequestTarget as err:
            return refuse(request, self.metrics, 400, err.code, err.message)
        tenant = state.tenants.resolve(host)
        if tenant is None:
            return refuse(request, self.metrics, 421, "UNKNOWN_HOST", "this gateway serves no company at the requested host")
        route, params = state.routes.match(method, target.path)
        ctx = RequestContext(time.monotonic(), tenant, route, params, target.path, target.query, method)
        request[CTX] = ctx
        self.metrics.in_flight.inc()
        try:
            return await state.handlers[route.name](request)
        except asyncio.CancelledError:
            # aiohttp writes no access line for a cancelled handler (the client went away): write it here.
            ctx.client_aborted = True
            if self._access_logger is not None:
                self._access_logger.log(request, web.Response(status=499), time.monotonic() - ctx.start)
            raise
        except Exception:
            log.exception("unhandled error on route %s (request id %s)", route.name, ctx.request_id)
            return json_error(500, "INTERNAL_ERROR", "the gateway failed to handle this request", ctx.request_id)
