"""The public listener: aiohttp's low-level server, every request (parsed or not) handed to the edge, the client-side
time limits aiohttp lacks (a request head must arrive within ``header_timeout``; an idle kept-alive connection is
closed after ``keepalive_timeout``), and a bound on open connections (over it, a connection's first request is
answered 503). docs/reliability.md has the details.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..config.schema import ServerConfig
from ..core.deadline import Deadline
from ..edge.serve import Edge
from ..ops.metrics import Metrics

__all__ = ("Event", "Events", "Listener", "make_listener", "metric_events")


class Event(enum.Enum):
    """What the listener reports of its connections."""

    OPENED = "connection_opened"
    CLOSED = "connection_closed"
    REFUSED = "connection_refused"  # over max_connections: its first request is answered 503
    HEAD_TIMEOUT = "head_timeout"
    IDLE_TIMEOUT = "idle_timeout"


Events = Callable[[Event], None]


class _Phase(enum.Enum):
    HEAD = 1  # waiting for a request's head (its first byte has come, or the connection is new)
    BUSY = 2  # a request is being served
    IDLE = 3  # kept alive, between requests


class _Connection(web.RequestHandler):
    __slots__ = ("_owner", "_deadline", "_phase", "over_limit", "failed")

    def __init__(self, listener: Listener, **kwargs: Any) -> None:
        super().__init__(listener, **kwargs)
        self._owner = listener
        self.failed: web.BaseRequest | None = None  # the edge's request that let an error out (``handle_error``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        listener = self._owner
        self._deadline = Deadline(asyncio.get_running_loop(), self._expire)
        listener.opened += 1
        listener.events(Event.OPENED)
        # Over the bound: its first request is answered 503 (by the edge, which records it) and the connection closed.
        self.over_limit = bool(listener.max_connections and listener.opened > listener.max_connections)
        if self.over_limit:
            listener.events(Event.REFUSED)
        self._phase = _Phase.HEAD
        self._deadline.set(listener.header_timeout)

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
        if request is self.failed:
            # The edge let a ConnectionError out: its response was cut part way on purpose (the client or the
            # upstream's body went away), and it has recorded the request. aiohttp then closes the connection.
            self.failed = None
            raise ConnectionError("the response was cut off part way")
        # A request aiohttp's HTTP parser rejected: answered by the edge, like every other, when aiohttp prepares this.
        return _Unparsed(self, status, exc)


class _Unparsed(web.StreamResponse):
    """What aiohttp is given to answer a request its parser rejected: preparing it has the edge answer and record the
    request (a JSON answer whose text never quotes the request's bytes, and one access-log record); the connection
    then closes, as aiohttp's own answer would close it."""

    def __init__(self, connection: _Connection, status: int, exc: BaseException | None) -> None:
        super().__init__(status=status)
        self._connection = connection
        self._error = exc

    async def prepare(self, request: web.BaseRequest) -> None:
        connection = self._connection
        connection.exchange_started()
        try:
            await connection._owner.edge.serve_unparsed(request, self.status, self._error)
        finally:
            connection.exchange_ended()
        self.force_close()

    async def write_eof(self, data: bytes = b"") -> None:
        return  # the edge wrote the whole answer


class Listener(web.Server):
    """The low-level server, with the gateway's connection handler."""

    def __init__(
        self,
        edge: Edge,
        *,
        header_timeout: float,
        keepalive_timeout: float,
        max_connections: int = 0,
        events: Events = lambda kind: None,
        handler_cancellation: bool = False,
        **kwargs: Any,
    ) -> None:
        # aiohttp's own keep-alive timer stays behind the gateway's (it counts nothing).
        self._handler_args = {**kwargs, "keepalive_timeout": keepalive_timeout + header_timeout}
        self._handler_loop = asyncio.get_running_loop()
        super().__init__(self._serve, handler_cancellation=handler_cancellation, loop=self._handler_loop,
                         **self._handler_args)
        self.edge = edge
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
            if connection.over_limit:
                return await self.edge.serve_busy(request)
            return await self.edge.serve(request)
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
        edge,
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
        else:
            timeouts[event].inc()

    return count
