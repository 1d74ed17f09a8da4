"""The public listener: aiohttp's low-level server, with every request (parsed or not) handed to the gateway's edge,
the client-side time limits aiohttp does not have, and a bound on open connections.

A request the HTTP parser rejects goes through the same edge as every other (``Edge.serve_unparsed``), so it gets a
JSON answer whose text never quotes the request's bytes, and exactly one record.

Time limits, per connection, one timer at a time:

- **head**: a request's head (request line and headers) must arrive whole within ``header_timeout`` of the
  connection's opening or of the first byte of a later request; a client that drips its head byte by byte
  (slowloris), or opens a connection and sends nothing, is closed then;
- **idle**: a kept-alive connection with no request for ``keepalive_timeout`` is closed;
- the request body's idle timeout is the proxy core's (``server.client_body_timeout``).

Over ``max_connections`` open connections, a new one's first request is answered ``503`` (``Retry-After``) and the
connection closed.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from . import aiohttp_private  # noqa: F401 - checks, at import, the private API used below

__all__ = ("Edge", "Listener")


class Edge(Protocol):
    async def serve(self, request: web.BaseRequest) -> web.StreamResponse: ...

    async def serve_unparsed(
        self, request: web.BaseRequest, status: int, exc: BaseException | None
    ) -> web.StreamResponse: ...

    async def serve_busy(self, request: web.BaseRequest) -> web.StreamResponse: ...


# What the listener reports: "head_timeout", "idle_timeout", "connection_refused", "connection_opened",
# "connection_closed".
Events = Callable[[str], None]


class _State(enum.Enum):
    HEAD = 1  # waiting for a request's head (its first byte has come, or the connection is new)
    BUSY = 2  # a request is being served
    IDLE = 3  # kept alive, between requests


class _Connection(RequestHandler):
    __slots__ = ("_owner", "_deadline", "_phase", "_clock", "over_limit")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        listener = self._manager
        assert isinstance(listener, Listener)
        self._owner = listener
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = _State.HEAD
        self._clock = asyncio.get_running_loop()
        listener.opened += 1
        listener.events("connection_opened")
        # Over the bound: its first request is answered 503 (by the edge, which records it) and the connection closed.
        self.over_limit = bool(listener.max_connections and listener.opened > listener.max_connections)
        if self.over_limit:
            listener.events("connection_refused")
        self._arm(listener.header_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        listener = self._owner
        listener.opened -= 1
        listener.events("connection_closed")
        self._cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is _State.IDLE:
            # The first byte of the next request: its head must now arrive within the head timeout.
            self._phase = _State.HEAD
            self._arm(self._owner.header_timeout)
        super().data_received(data)

    def exchange_started(self) -> None:
        self._phase = _State.BUSY
        self._cancel()

    def exchange_ended(self) -> None:
        self._phase = _State.IDLE
        self._arm(self._owner.keepalive_timeout)

    def _arm(self, timeout: float) -> None:
        self._cancel()
        self._deadline = self._clock.call_later(timeout, self._expire)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self._phase is _State.HEAD:
            self._owner.events("head_timeout")
        elif self._phase is _State.IDLE:
            self._owner.events("idle_timeout")
        else:
            return
        self.force_close()

    def _make_error_handler(self, err_info: Any) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        listener = self._owner
        status: int = err_info.status
        exc: BaseException | None = err_info.exc

        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            self.exchange_started()
            try:
                return await listener.edge.serve_unparsed(request, status, exc)
            finally:
                self.exchange_ended()

        return handler

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        # Reached only when the edge let a ConnectionError out: its response was cut part way on purpose (the client
        # or the upstream's body went away), and it has recorded the request. aiohttp then closes the connection.
        raise ConnectionError("the response was cut off part way")


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
        **kwargs: Any,
    ) -> None:
        # aiohttp's own keep-alive timer stays behind the gateway's (it counts nothing).
        super().__init__(self._serve, keepalive_timeout=keepalive_timeout + header_timeout, **kwargs)
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
        finally:
            connection.exchange_ended()

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)
