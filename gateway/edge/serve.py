"""The edge: each request classified, run through its route's chain, written, and recorded exactly once, however it
ends (docs/architecture.md, "One record per request"); and the requests in flight, which a shutdown drains."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import hdrs, web
from prometheus_client import Gauge

from ..config import LoadedConfig
from ..core.decision import Decider
from ..core.exchange import Cut, Delivery, Exchange, Next, Reply, Services
from ..core.reply import internal_error
from ..core.tracecontext import TraceContext
from ..ops.access_log import Recorder
from ..ops.metrics import Metrics
from ..ops.tracing import Tracing
from ..rollout import Clock, RolloutPlan
from ..rollout.request import KnownClients, RequestClient, RequestRollout
from .classify import EdgeRefusal, classify
from .method import FormMethod
from .route_table import RouteTable
from .tenancy import TenantResolver

__all__ = ("Edge", "GatewayState", "InFlight", "OwnView", "Write")

log = logging.getLogger("gateway")

# How a reply is written to the client (``server.writer.send``).
Write = Callable[[web.BaseRequest, Reply, Delivery | None], Awaitable[web.StreamResponse]]


class OwnView(Protocol):
    """A client's own usage, answered by the gateway itself under a path prefix it reserves, before any route
    (``ops.self_service``), and the link to it on the answers to deprecated calls."""

    @property
    def prefix(self) -> str: ...
    async def answer(self, exchange: Exchange) -> Reply: ...
    def signal(self, exchange: Exchange, reply: Reply) -> None: ...


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything built from one config: swapped whole on reload, never edited in place."""

    config: LoadedConfig
    tenants: TenantResolver
    routes: RouteTable
    handlers: dict[str, Next]
    rollout: RolloutPlan
    body_timeout: float  # server.client_body_timeout
    look_ahead: int  # server.method_override_look_ahead


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
                        exchange.record.cut = Cut.SHUTDOWN  # what a policy that undoes its work on the way reads
                    self._cut_tasks.add(task)
                    task.cancel("shutdown deadline")
        return self.running


class _Outcome(Delivery):
    """What the edge knows of one request by the time it records it; the writer says through it (a ``Delivery``)
    whether the whole reply left."""

    __slots__ = ("exchange", "refusal", "status", "client_gone")

    def __init__(self, refusal: EdgeRefusal | None = None) -> None:
        self.complete = False
        self.exchange: Exchange | None = None
        self.refusal = refusal  # refused before routing
        self.status = 0 if refusal is None else refusal.reply.status  # what the client is (being) answered
        self.client_gone = False

    def final_status(self, request: web.BaseRequest, cutting: bool) -> int:
        """What the client was answered: 499 when it left before it had the whole answer (leaving while the gateway
        lingers after the answer does not change what it was answered); when ``cutting`` (the shutdown deadline),
        a routed request still running is cut, its status the one sent, or 503 if none was."""
        if self.complete:
            return self.status
        if cutting and self.refusal is None:
            if self.exchange is not None:
                self.exchange.record.cut = Cut.SHUTDOWN
            return self.status if request.writer.output_size else 503
        if self.client_gone or self.refusal is not None:
            return 499
        return self.status


class Edge:
    """Serves the public listener's requests with the state in force (``state()``, swapped on reload)."""

    def __init__(self, state: Callable[[], GatewayState], services: Services, recorder: Recorder,
                 in_flight: InFlight, write: Write, tracing: Tracing, clock: Clock,
                 known: KnownClients | None = None, own: OwnView | None = None) -> None:
        self._state = state
        self._clock = clock
        self._known = known  # who the fleet has seen (a freeze's record): the usage ledger
        self._own = own  # a client's own usage (usage.self_service), None when off
        self._services = services
        self.recorder = recorder
        self.in_flight = in_flight
        self._write = write
        self.tracing = tracing
        # Given to current_task: without a loop it asks for the running one, a getpid(2) on Python 3.11.
        self._loop = asyncio.get_running_loop()
        self._maker_of: tuple[GatewayState, Callable[[Exchange], Decider]] | None = None

    def _rollout_maker(self, state: GatewayState) -> Callable[[Exchange], Decider]:
        """What makes a request's rollout, with the plan of ``state`` (one function per state in force)."""
        made = self._maker_of
        if made is not None and made[0] is state:
            return made[1]
        plan, clock, known = state.rollout, self._clock, self._known

        def make(exchange: Exchange) -> Decider:
            return RequestRollout(plan, exchange.tenant.name, clock, RequestClient(exchange, known, plan.preview))

        self._maker_of = (state, make)
        return make

    async def serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """Classify, run the route's chain, write the reply; record the request once, however it ends. (Each
        coroutine in it is one more frame that every wake-up of the request passes through: the road has two, this
        and ``_routed``.)"""
        started = time.monotonic()
        trace = self.tracing.begin(request)  # the client's trace continued (or a new one): the server span starts
        outcome = _Outcome()
        in_flight = self.in_flight
        in_flight.arrived()
        task = asyncio.current_task(self._loop)
        try:
            state = self._state()
            classified = classify(request, started, state, self._services)
            if isinstance(classified, EdgeRefusal):
                outcome.refusal = classified
                reply = classified.reply
            else:
                outcome.exchange, form = classified
                reply = await self._routed(request, outcome.exchange, form, state, trace, task)
            reply = self._last_word(request, reply, outcome)
            try:
                response = await self._write(request, reply, outcome)
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as err:
                response = await self._failed_to_write(request, outcome.exchange, outcome, err)
            outcome.status = response.status
            return response
        except asyncio.CancelledError:
            outcome.client_gone = True  # aiohttp cancels the handler of a connection the client closed
            raise
        except ConnectionError:
            # The answer was cut part way: by the client, unless the upstream's body broke off (then its status and
            # the bytes actually sent are recorded, with the upstream error).
            exchange = outcome.exchange
            outcome.client_gone = exchange is None or not (exchange.record.upstream_error or "").startswith("body_")
            raise
        finally:
            in_flight.done(task)
            self._record(request, outcome, started, trace)

    async def _routed(self, request: web.BaseRequest, exchange: Exchange, form: FormMethod | None,
                      state: GatewayState, trace: TraceContext | None, task: asyncio.Task[Any] | None) -> Reply:
        """A classified request's reply: the client's own usage (under ``OwnView.prefix``), or the last step of
        classification (a form body's ``_method``, where it matters) then the route's chain."""
        exchange.trace = trace
        exchange.rollout_maker = self._rollout_maker(state)
        # Registered once classified (the head's classification does not wait: nothing can be cut before it).
        self.in_flight.serving(task, request, exchange)
        own = self._own
        if own is not None and exchange.path.startswith(own.prefix):
            return await own.answer(exchange)
        try:
            refused = await form.read(exchange) if form is not None else None
            reply = refused or await state.handlers[exchange.route.name](exchange)
            if state.rollout.preview is not None:
                _say_previews(exchange, reply, state.rollout.preview)
        except asyncio.CancelledError:
            if not self.in_flight.was_cut(task):
                raise
            # Cut by the shutdown deadline (``InFlight.drain``): answered by the caller, like a chain that returned.
            assert task is not None
            task.uncancel()
            reply = _cut(exchange)
        except Exception:
            log.exception("unhandled error on route %s (request id %s)", exchange.route.name, exchange.request_id)
            reply = internal_error(exchange.ensure_request_id())
        if own is not None and exchange.decisions:
            own.signal(exchange, reply)
        return reply

    def _last_word(self, request: web.BaseRequest, reply: Reply, outcome: _Outcome) -> Reply:
        """The reply as it leaves: the shutdown's 503 if the deadline has passed, and closing its connection when the
        gateway drains or the request asked to upgrade."""
        in_flight = self.in_flight
        if in_flight.cutting:
            reply = _cut(outcome.exchange)
        outcome.status = reply.status
        if in_flight.draining or hdrs.UPGRADE in request.headers:
            # An upgrade is not proxied (the service specifies none): the request is answered as a plain one
            # (RFC 9110 7.8), and since aiohttp reads nothing more on a connection once asked to upgrade, the
            # connection closes after the answer instead of leaving a pipelined request unread.
            reply.close_connection = True
        return reply

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
        trace = self.tracing.begin(request, parsed=parsed)
        outcome = _Outcome(refusal)
        self.in_flight.arrived()
        try:
            return await self._write(request, refusal.reply, outcome)
        except (asyncio.CancelledError, ConnectionError):
            outcome.client_gone = True
            raise
        finally:
            self._record(request, outcome, started, trace)

    def _record(self, request: web.BaseRequest, outcome: _Outcome, started: float, trace: TraceContext | None
                ) -> None:
        """The one record of every request, served or refused: what the client was answered (499 when it left
        first, 503 when the shutdown cut it), its metrics, usage and access-log line, and the end of its span."""
        in_flight = self.in_flight
        in_flight.left()
        exchange, refusal = outcome.exchange, outcome.refusal
        status = outcome.status if outcome.complete else outcome.final_status(request, in_flight.cutting)
        if exchange is not None:
            exchange.close_body()
        code, rid = (None, None) if refusal is None else (refusal.code, refusal.request_id)
        self.recorder.record(request, exchange, status, started, refused=code, request_id=rid, trace=trace)
        if trace is not None and self.tracing.exporting:
            self.tracing.end(trace, request, exchange, status, code)

    async def _failed_to_write(self, request: web.BaseRequest, exchange: Exchange | None, delivery: Delivery,
                               err: Exception) -> web.StreamResponse:
        """A bug while writing the answer: a 500 if nothing was sent yet, else the connection is cut."""
        route = exchange.route.name if exchange else "none"
        log.error("unhandled error writing the answer on route %s", route, exc_info=err)
        if request.writer.output_size:
            raise ConnectionResetError("the answer failed part way") from err
        return await self._write(request, internal_error(exchange.ensure_request_id() if exchange else None),
                                 delivery)


def _say_previews(exchange: Exchange, reply: Reply, header: str) -> None:
    """A client that asked to preview later phases is told, in the same header, which phases it got."""
    rollout = exchange.rollout_made
    applied = rollout.previews() if rollout is not None else []
    if applied:
        reply.headers[header] = ", ".join(applied)


def _cut(exchange: Exchange | None) -> Reply:
    """The answer to a request the shutdown deadline cut: whatever the chain made of the cut (the upstream request
    abandoned) is not the upstream's doing."""
    rid = None
    if exchange is not None:
        record = exchange.record
        record.cut = Cut.SHUTDOWN
        record.upstream_error = record.upstream_error_kind = None
        rid = exchange.ensure_request_id()
    reply = Reply.error(503, "SHUTTING_DOWN", "the gateway stopped before this request could finish", rid)
    reply.close_connection = True
    return reply
