"""The listeners: aiohttp's low-level server with the client-side time limits aiohttp lacks (a request head must
arrive within ``header_timeout``; an idle kept-alive connection is closed after ``keepalive_timeout``) and a bound on
open connections. The public listener hands every request (parsed or not) to the edge, and answers a connection over
its bound 503 (``make_listener``); the admin listener serves the admin application within its own, small bound,
closing its oldest idle connection (or the new one) at once to stay within it (``admin_listener``), so that it never
holds more descriptors than that. Only aiohttp's public API is used here. docs/reliability.md has the details.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from ..config.schema import ServerConfig
from ..core.deadline import Deadline
from ..edge.serve import Edge
from ..ops.metrics import Metrics

__all__ = ("Event", "Events", "Listener", "admin_listener", "admin_metric_events", "make_listener", "metric_events")


class Event(enum.Enum):
    """What the listener reports of its connections."""

    OPENED = "connection_opened"
    CLOSED = "connection_closed"
    REFUSED = "connection_refused"  # over max_connections: its first request is answered 503, or it is closed at once
    EVICTED = "connection_evicted"  # closed to make room for a new one (a listener without ``busy``)
    HEAD_TIMEOUT = "head_timeout"
    IDLE_TIMEOUT = "idle_timeout"


Events = Callable[[Event], None]
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# The edge's answer to a request aiohttp's parser rejected: the request (as far as it was read), its status, the error.
Unparsed = Callable[[web.BaseRequest, int, BaseException | None], Awaitable[web.StreamResponse]]


class _Phase(enum.Enum):
    HEAD = 1  # waiting for a request's head (its first byte has come, or the connection is new)
    BUSY = 2  # a request is being served
    IDLE = 3  # kept alive, between requests


class _Connection(web.RequestHandler):
    __slots__ = ("_owner", "_deadline", "_phase", "over_limit", "failed")

    def __init__(self, listener: Listener, **kwargs: Any) -> None:
        super().__init__(listener, **kwargs)
        self._owner = listener
        self.failed: web.BaseRequest | None = None  # the request whose handler let an error out (``handle_error``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        listener = self._owner
        self._deadline = Deadline(asyncio.get_running_loop(), self._expire)
        listener.opened += 1
        listener.events(Event.OPENED)
        self._phase = _Phase.HEAD
        # Over the bound: its first request is answered by ``busy`` (the edge's 503, which it records) and the
        # connection closed. Without ``busy``, room is made at once (``_make_room``).
        self.over_limit = bool(listener.max_connections and listener.opened > listener.max_connections)
        if self.over_limit:
            if listener.busy is not None:
                listener.events(Event.REFUSED)
            elif not self._make_room(listener):
                return
        self._deadline.set(listener.header_timeout)

    def _make_room(self, listener: Listener) -> bool:
        """Over the bound of a listener without ``busy``: the oldest connection not being served (silent, dripping
        its head, or idle) is closed, so that connections which send nothing cannot keep a probe out; when every
        other one is being served, this one is closed instead (False). The open connections never exceed the
        bound but for the ones being closed."""
        others = [c for c in listener.connections if c is not self and c.transport is not None]
        if len(others) < listener.max_connections or _evicted(listener, others):
            return True  # (when there were fewer: room is being made already, a connection closed, not yet gone)
        listener.events(Event.REFUSED)
        self.force_close()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        listener = self._owner
        listener.opened -= 1
        listener.events(Event.CLOSED)
        self._deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is _Phase.IDLE:
            # The first byte of the next request: its head must now arrive within the head timeout.
            self._phase = _Phase.HEAD
            self._deadline.set(self._owner.header_timeout)
        super().data_received(data)

    def exchange_started(self) -> None:
        self._phase = _Phase.BUSY
        self._deadline.clear()  # no limit while it is served

    def exchange_ended(self) -> None:
        self._phase = _Phase.IDLE
        self._deadline.set(self._owner.keepalive_timeout)

    def _expire(self) -> None:
        self._owner.events(Event.HEAD_TIMEOUT if self._phase is _Phase.HEAD else Event.IDLE_TIMEOUT)
        self.force_close()

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        unparsed = self._owner.unparsed
        if unparsed is None:
            return super().handle_error(request, status, exc, message)  # aiohttp's own answer, the connection closed
        if request is self.failed:
            # The edge let a ConnectionError out: its response was cut part way on purpose (the client or the
            # upstream's body went away), and it has recorded the request. aiohttp then closes the connection.
            self.failed = None
            raise ConnectionError("the response was cut off part way")
        # A request aiohttp's HTTP parser rejected: answered by the edge, like every other, when aiohttp prepares this.
        return _Unparsed(self, unparsed, status, exc)


def _evicted(listener: Listener, others: Iterable[object]) -> bool:
    """Whether the oldest of ``others`` not being served (silent, dripping its head, or idle) was closed."""
    for other in others:
        if isinstance(other, _Connection) and other._phase is not _Phase.BUSY:
            listener.events(Event.EVICTED)
            other.force_close()
            return True
    return False


class _Unparsed(web.StreamResponse):
    """What aiohttp is given to answer a request its parser rejected: preparing it has the edge answer and record the
    request (a JSON answer whose text never quotes the request's bytes, and one access-log record); the connection
    then closes, as aiohttp's own answer would close it."""

    def __init__(self, connection: _Connection, unparsed: Unparsed, status: int, exc: BaseException | None) -> None:
        super().__init__(status=status)
        self._connection = connection
        self._unparsed = unparsed
        self._error = exc

    async def prepare(self, request: web.BaseRequest) -> None:
        connection = self._connection
        connection.exchange_started()
        try:
            await self._unparsed(request, self.status, self._error)
        finally:
            connection.exchange_ended()
        self.force_close()

    async def write_eof(self, data: bytes = b"") -> None:
        return  # the edge wrote the whole answer


class Listener(web.Server):
    """The low-level server, with the gateway's connection handler: every request to ``handler``. ``busy``: the
    answer to the first request of a connection over ``max_connections`` (without it, such a connection is closed
    as soon as it is accepted). ``unparsed``: the answer to a request aiohttp's parser rejected (without it,
    aiohttp's own)."""

    def __init__(
        self,
        handler: Handler,
        *,
        header_timeout: float,
        keepalive_timeout: float,
        max_connections: int = 0,
        busy: Handler | None = None,
        unparsed: Unparsed | None = None,
        events: Events = lambda kind: None,
        handler_cancellation: bool = False,
        request_factory: Any = None,
        **kwargs: Any,
    ) -> None:
        # aiohttp's own keep-alive timer stays behind the gateway's (it counts nothing).
        self._handler_args = {**kwargs, "keepalive_timeout": keepalive_timeout + header_timeout}
        self._handler_loop = asyncio.get_running_loop()
        super().__init__(self._serve, handler_cancellation=handler_cancellation, loop=self._handler_loop,
                         request_factory=request_factory, **self._handler_args)
        self.handler = handler
        self.busy = busy
        self.unparsed = unparsed
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.max_connections = max_connections  # 0: no bound
        self.events = events
        self.opened = 0

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        assert isinstance(connection, _Connection)
        connection.exchange_started()
        try:
            if connection.over_limit and self.busy is not None:
                return await self.busy(request)
            return await self.handler(request)
        except Exception:
            connection.failed = request  # aiohttp's handle_error is called next, for this request
            raise
        finally:
            connection.exchange_ended()

    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=self._handler_loop, **self._handler_args)


def make_listener(edge: Edge, server: ServerConfig, events: Events) -> Listener:
    """The public listener as the ``server`` section sets it up."""
    return Listener(
        edge.serve,
        busy=edge.serve_busy,
        unparsed=edge.serve_unparsed,
        header_timeout=server.client_header_timeout,
        keepalive_timeout=server.client_keepalive_timeout,
        max_connections=server.max_connections,
        events=events,
        max_line_size=server.max_header_bytes,
        max_field_size=server.max_header_bytes,
        # Bodies pass through as sent: a gzip request body must reach the upstream still gzipped.
        auto_decompress=False,
        read_bufsize=256 * 1024,
        # A client that goes away cancels its request, and with it the upstream request and connection.
        handler_cancellation=True,
        # After an early answer, unread request bytes are read and dropped for at most this long, so the client can
        # read the answer before the connection closes (aiohttp's default is 10 s).
        lingering_time=2.0,
        # Every request is recorded by the edge itself (ops.access_log), never by aiohttp's access logger.
        access_log=None,
    )


def admin_listener(app_server: web.Server, server: ServerConfig, events: Events) -> Listener:
    """The admin application (aiohttp's ``AppRunner`` server of it: its handler, its requests) served by a ``Listener``
    with the admin listener's limits: the client time limits of the ``server`` section, and
    ``server.admin_max_connections`` (over it, the oldest connection not being served is closed to make room, or the
    new one when all are being served)."""
    return Listener(
        app_server.request_handler,
        request_factory=app_server.request_factory,
        header_timeout=server.client_header_timeout,
        keepalive_timeout=server.client_keepalive_timeout,
        max_connections=server.admin_max_connections,
        events=events,
        lingering_time=2.0,
        access_log=None,
    )


def metric_events(metrics: Metrics) -> Events:
    """The listener's events counted in ``metrics``: connections open and refused, client time limits."""
    timeouts = {Event.HEAD_TIMEOUT: metrics.client_timeouts.labels("head"),
                Event.IDLE_TIMEOUT: metrics.client_timeouts.labels("idle")}

    def count(event: Event) -> None:
        if event is Event.OPENED:
            metrics.connections_open.inc()
        elif event is Event.CLOSED:
            metrics.connections_open.dec()
        elif event is Event.REFUSED:
            metrics.connections_refused.inc()
        elif event in timeouts:
            timeouts[event].inc()

    return count


def admin_metric_events(metrics: Metrics) -> Events:
    """The admin listener's events counted in ``metrics``: connections open, and those it closed itself (why)."""
    closed = {Event.REFUSED: metrics.admin_connections_closed.labels("refused"),
              Event.EVICTED: metrics.admin_connections_closed.labels("evicted"),
              Event.HEAD_TIMEOUT: metrics.admin_connections_closed.labels("head"),
              Event.IDLE_TIMEOUT: metrics.admin_connections_closed.labels("idle")}

    def count(event: Event) -> None:
        if event is Event.OPENED:
            metrics.admin_connections_open.inc()
        elif event is Event.CLOSED:
            metrics.admin_connections_open.dec()
        else:
            closed[event].inc()

    return count
