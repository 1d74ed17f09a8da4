"""The edge: each request classified, run through its route's chain, written, and recorded exactly once, however it
ends (docs/architecture.md, "One record per request"); and the requests in flight, which a shutdown drains."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import Gauge

from ..config import LoadedConfig
from ..core.exchange import Cut, Delivery, Exchange, Next, Reply, Services
from ..core.http import new_request_id
from ..ops.access_log import Recorder
from ..ops.metrics import Metrics
from ..ops.tracing import Tracing
from ..rollout import RolloutPlan
from .classify import EdgeRefusal, classify, read_form_method, reads_form_method
from .route_table import RouteTable
from .tenancy import TenantResolver

__all__ = ("Edge", "GatewayState", "InFlight", "Write")

log = logging.getLogger("gateway")

# How a reply is written to the client (``server.writer.send``).
Write = Callable[[web.BaseRequest, Reply, Delivery | None], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything built from one config: swapped whole on reload, never edited in place."""

    config: LoadedConfig
    tenants: TenantResolver
    routes: RouteTable
    handlers: dict[str, Next]
    rollout: RolloutPlan


class InFlight:
    """The requests between their arrival and their record: the in-flight gauge, what a drain waits for, and the
    edge's task of each, which the shutdown deadline cuts if it has not started its answer."""

    def __init__(self, metrics: Metrics) -> None:
        # The gauge reads the count when scraped; under --workers (prometheus-client's multiprocess mode, which has no
        # gauge read from a function) each worker writes its count to its file as it changes.
        self._gauge: Gauge | None = None
        if metrics.multiprocess:
            self._gauge = metrics.in_flight
        else:
            metrics.in_flight.set_function(lambda: self.running)
        self.draining = False  # every answer closes its connection
        self.cutting = False  # the shutdown deadline has passed: what still runs is cut
        self.running = 0
        self._all_done = asyncio.Event()
        self._all_done.set()
        self._serving: dict[asyncio.Task[Any], tuple[web.BaseRequest, Exchange | None]] = {}
        self._cut_tasks: set[asyncio.Task[Any]] = set()

    def arrived(self) -> None:
        if self._gauge is not None:
            self._gauge.inc()
        self.running += 1
        self._all_done.clear()

    def left(self) -> None:
        if self._gauge is not None:
            self._gauge.dec()
        self.running -= 1
        if not self.running:
            self._all_done.set()

    def serving(self, task: asyncio.Task[Any] | None, request: web.BaseRequest, exchange: Exchange | None) -> None:
        if task is not None:
            self._serving[task] = (request, exchange)

    def done(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._serving.pop(task, None)
            self._cut_tasks.discard(task)

    def was_cut(self, task: asyncio.Task[Any] | None) -> bool:
        return task is not None and task in self._cut_tasks

    async def drain(self, timeout: float) -> int:
        """Wait at most ``timeout`` for every request to finish; then cut what has not started its answer (its
        client gets the 503 its record says). Returns how many are still running."""
        self.draining = True
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout)
        except TimeoutError:
            self.cutting = True
            for task, (request, exchange) in list(self._serving.items()):
                if not request.writer.output_size and not task.done():
                    if exchange is not None:
                        exchange.cut = Cut.SHUTDOWN  # what a policy that undoes its work on the way reads
                    self._cut_tasks.add(task)
                    task.cancel("shutdown deadline")
        return self.running


class Edge:
    """Serves the public listener's requests with the state in force (``state()``, swapped on reload)."""

    def __init__(self, state: Callable[[], GatewayState], services: Services, recorder: Recorder,
                 in_flight: InFlight, write: Write, tracing: Tracing) -> None:
        self._state = state
        self._services = services
        self.recorder = recorder
        self.in_flight = in_flight
        self._write = write
        self.tracing = tracing
        # Given to current_task: without a loop it asks for the running one, a getpid(2) on Python 3.11.
        self._loop = asyncio.get_running_loop()

    async def serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """Classify, run the route's chain, write the reply; record the request once, however it ends."""
        started = time.monotonic()
        state = self._state()
        in_flight = self.in_flight
        exchange: Exchange | None = None
        refusal: EdgeRefusal | None = None
        delivery = Delivery()
        status = 0
        client_gone = False
        tracing = self.tracing
        trace = tracing.begin(request)  # the client's trace continued (or a new one): the server span starts
        in_flight.arrived()
        task = asyncio.current_task(self._loop)
        try:
            classified = classify(request, started, state.tenants, state.routes, self._services)
            # Registered once classified (classify does not wait: nothing can be cut before it).
            in_flight.serving(task, request, classified if isinstance(classified, Exchange) else None)
            if isinstance(classified, EdgeRefusal):
                refusal = classified
                reply = refusal.reply
            else:
                exchange = classified
                exchange.trace = trace
                try:
                    refused = None
                    if reads_form_method(exchange, state.routes):
                        server = state.config.model.server
                        refused = await read_form_method(exchange, state.routes, timeout=server.client_body_timeout,
                                                         look_ahead=server.method_override_look_ahead)
                    reply = refused or await state.handlers[exchange.route.name](exchange)
                except asyncio.CancelledError:
                    if not in_flight.was_cut(task):
                        raise
                    # Cut by the shutdown deadline (``InFlight.drain``): answered below, like a chain that returned.
                    assert task is not None
                    task.uncancel()
                    reply = _cut(exchange)
                except Exception:
                    log.exception("unhandled error on route %s (request id %s)", exchange.route.name,
                                  exchange.request_id)
                    reply = Reply.error(500, "INTERNAL_ERROR", "the gateway failed to handle this request",
                                        exchange.ensure_request_id())
            if in_flight.cutting:
                reply = _cut(exchange)
            status = reply.status
            if in_flight.draining or hdrs.UPGRADE in request.headers:
                # An upgrade is not proxied (the service specifies none): the request is answered as a plain one
                # (RFC 9110 7.8), and since aiohttp reads nothing more on a connection once asked to upgrade, the
                # connection closes after the answer instead of leaving a pipelined request unread.
                reply.close_connection = True
            try:
                response = await self._write(request, reply, delivery)
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as err:
                response = await self._failed_to_write(request, exchange, delivery, err)
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
            in_flight.done(task)
            in_flight.left()
            if in_flight.cutting and not delivery.complete:
                # Still running at the shutdown deadline: cut. Its status is the one sent, or 503 if none was.
                status = status if request.writer.output_size else 503
                if exchange is not None:
                    exchange.cut = Cut.SHUTDOWN
            elif client_gone and not delivery.complete:
                # 499: the client left before it had the whole answer (leaving while the gateway lingers after the
                # answer does not change what it was answered).
                status = 499
            self.recorder.record(
                request, exchange, status, started,
                refused=refusal.code if refusal else None, request_id=refusal.request_id if refusal else None,
                trace=trace,
            )
            if trace is not None and tracing.exporting:
                tracing.end(trace, request, exchange, status, refusal.code if refusal else None)

    async def serve_unparsed(
        self, request: web.BaseRequest, status: int, exc: BaseException | None
    ) -> web.StreamResponse:
        """A request the HTTP parser rejected: a JSON answer naming the kind of error (never its text), recorded."""
        log.info("refused a request the HTTP parser rejected: %s %s", status, type(exc).__name__ if exc else "")
        return await self._refuse(request, EdgeRefusal.unparsed(status, exc), parsed=False)

    async def serve_busy(self, request: web.BaseRequest) -> web.StreamResponse:
        """The first request on a connection over server.max_connections: 503, and the connection closes."""
        refusal = EdgeRefusal.of(503, "TOO_MANY_CONNECTIONS",
                                 "the gateway has as many connections open as it accepts; retry shortly")
        refusal.reply.headers["Retry-After"] = "1"
        return await self._refuse(request, refusal)

    async def _refuse(self, request: web.BaseRequest, refusal: EdgeRefusal, *,
                      parsed: bool = True) -> web.StreamResponse:
        started = time.monotonic()
        status = refusal.reply.status
        delivery = Delivery()
        trace = self.tracing.begin(request, parsed=parsed)
        self.in_flight.arrived()
        try:
            return await self._write(request, refusal.reply, delivery)
        finally:
            self.in_flight.left()
            status = status if delivery.complete else 499
            self.recorder.record(request, None, status, started, refused=refusal.code, request_id=refusal.request_id,
                                 trace=trace)
            if trace is not None:
                self.tracing.end(trace, request, None, status, refusal.code)

    async def _failed_to_write(self, request: web.BaseRequest, exchange: Exchange | None, delivery: Delivery,
                               err: Exception) -> web.StreamResponse:
        """A bug while writing the answer: a 500 if nothing was sent yet, else the connection is cut."""
        route = exchange.route.name if exchange else "none"
        log.error("unhandled error writing the answer on route %s", route, exc_info=err)
        if request.writer.output_size:
            raise ConnectionResetError("the answer failed part way") from err
        rid = exchange.ensure_request_id() if exchange else new_request_id()
        failed = Reply.error(500, "INTERNAL_ERROR", "the gateway failed to handle this request", rid)
        return await self._write(request, failed, delivery)


def _cut(exchange: Exchange | None) -> Reply:
    """The answer to a request the shutdown deadline cut: whatever the chain made of the cut (the upstream request
    abandoned) is not the upstream's doing."""
    rid = None
    if exchange is not None:
        exchange.cut = Cut.SHUTDOWN
        exchange.upstream_error = exchange.upstream_error_kind = None
        rid = exchange.ensure_request_id()
    reply = Reply.error(503, "SHUTTING_DOWN", "the gateway stopped before this request could finish", rid)
    reply.close_connection = True
    return reply
