"""The request body as the proxy core reads it: ``100 Continue``, the idle timeout, client aborts, and the route's
request-body filters run in chain order (the request side of the body phases, see ``core.exchange``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..core.exchange import BodyError, Exchange, Flow, Refuse, RequestBodyFilter

__all__ = ("RequestBody", "client_chunks", "ensure_continue")

_CONTINUE_SENT = web.RequestKey("gateway_continue_sent", bool)
# What reading a request body raises when the client sends a broken body (bad chunked framing, short body).
_MALFORMED = (aiohttp.ClientPayloadError, HttpProcessingError)


async def ensure_continue(request: web.BaseRequest) -> None:
    """Send ``100 Continue`` once, just before the body is first read, if the client asked for it.

    The gateway never answers ``Expect`` up front: a request refused on its headers gets its final answer without
    the client having been invited to send the body.
    """
    if request.get(_CONTINUE_SENT) or request.version < (1, 1):
        return
    if request.headers.get("Expect", "").lower() != "100-continue":
        return
    request[_CONTINUE_SENT] = True
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


class _BodyTimeout(ConnectionResetError):
    """Set on the request's stream when no byte has arrived for the idle timeout."""


class _Idle:
    """Fails a stalled read of the request body, whichever task reads it (the handler, or aiohttp's upload task).

    One timer per timeout period rather than one per chunk: a read moves a deadline forward, and the timer, when it
    fires early, re-arms itself at that deadline. Only time spent waiting for the client counts: while a chunk is
    being sent upstream the clock is off, since a slow upstream is not the client's fault.
    """

    __slots__ = ("_content", "timeout", "_loop", "_deadline", "_handle", "_reading")

    def __init__(self, content: aiohttp.StreamReader, timeout: float) -> None:
        self._content = content
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._deadline = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._reading = False

    def arm(self) -> None:
        self._reading = True
        self._deadline = self._loop.time() + self.timeout
        if self._handle is None:
            self._handle = self._loop.call_at(self._deadline, self._check)

    def disarm(self) -> None:
        self._reading = False

    def cancel(self) -> None:
        self._reading = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if not self._reading:
            return
        if self._loop.time() < self._deadline:
            self._handle = self._loop.call_at(self._deadline, self._check)
            return
        self._content.set_exception(_BodyTimeout())


async def client_chunks(exchange: Exchange, timeout: float, idle: _Idle | None = None
                        ) -> AsyncGenerator[bytes, None]:
    """The client's body as it arrives. On failure it says why in ``exchange.body_error`` and raises a
    ConnectionError (so that an upstream request streaming it is abandoned with it)."""
    request = exchange.request
    await ensure_continue(request)
    if exchange.body_prefix:
        # What the edge already read (``body_override``) comes first, once.
        prefix, exchange.body_prefix = exchange.body_prefix, []
        for chunk in prefix:
            yield chunk
    content = request.content
    if idle is None:
        idle = _Idle(content, timeout)
    try:
        while True:
            idle.arm()
            chunk = await content.readany()
            idle.disarm()
            if not chunk:
                return
            yield chunk
    except _BodyTimeout:
        exchange.body_error = BodyError.TIMEOUT
        raise ConnectionResetError("the request body stopped arriving") from None
    except _MALFORMED as err:
        # aiohttp stops feeding a body whose framing broke: the client is still there and gets a 400.
        exchange.body_error = BodyError.MALFORMED
        raise ConnectionResetError("the request body is malformed") from err
    except ConnectionError:
        # The client went away: the upstream request is abandoned with it.
        exchange.body_error = BodyError.ABORTED
        raise
    finally:
        idle.cancel()


class _Stage:
    """One request-body filter and the chunks the core holds for it."""

    __slots__ = ("filter", "held", "size")

    def __init__(self, body_filter: RequestBodyFilter) -> None:
        self.filter = body_filter
        self.held: list[bytes] = []
        self.size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        flow = self.filter.on_data(chunk)
        if flow is Flow.HOLD:
            self.held.append(chunk)
            self.size += len(chunk)
            if self.size <= self.filter.hold_limit:
                return []
            flow = self.filter.on_hold_limit()
            if flow is Flow.HOLD:
                raise RuntimeError(f"{type(self.filter).__name__} is over its hold_limit and did not decide")
            return self._release(flow, None)
        return self._release(flow, chunk)

    def feed_all(self, chunks: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for chunk in chunks:
            out.extend(self.feed(chunk))
        return out

    def end(self) -> list[bytes]:
        flow = self.filter.on_end()
        if flow is Flow.HOLD:
            raise RuntimeError(f"{type(self.filter).__name__} held the body at its end")
        return self._release(flow, None)

    def _release(self, flow: Flow | bytes, chunk: bytes | None) -> list[bytes]:
        held = self.held
        if held:
            self.held = []
            self.size = 0
        if flow is Flow.CONTINUE:
            if chunk is None:
                return held
            return [*held, chunk] if held else [chunk]
        assert isinstance(flow, bytes)
        return [flow] if flow else []


class RequestBody:
    """The client's body through the request filters, as the upstream is sent it.

    ``prime()`` reads until the filters let a first byte through (or the body ends) before the upstream is contacted;
    a refusal there (``Refuse``) reaches no upstream at all. Iterating yields the rest. A refusal while the upstream
    is being sent the body is kept in ``refusal`` and breaks the upstream request (``ConnectionResetError``), so it
    never receives a complete body.
    """

    def __init__(self, exchange: Exchange, timeout: float) -> None:
        self._exchange = exchange
        self._timeout = timeout
        self._idle = _Idle(exchange.request.content, timeout)
        self._source = client_chunks(exchange, timeout, self._idle)
        self._stages = [_Stage(f) for f in exchange.request_filters]
        self._ready: deque[bytes] = deque()
        self._ended = False
        self.refused: Refuse | None = None  # a refusal that came while the upstream was being sent the body

    async def prime(self) -> None:
        """Read until the filters let a first byte through or the body ends. While they hold it, the shortest
        ``idle_timeout`` of a filter applies, and that filter answers when it fires."""
        exchange = self._exchange
        watchman = min((f for f in exchange.request_filters if f.idle_timeout is not None),
                       key=lambda f: f.idle_timeout or 0.0, default=None)
        if watchman is not None and watchman.idle_timeout is not None and watchman.idle_timeout < self._timeout:
            self._idle.timeout = watchman.idle_timeout
        else:
            watchman = None
        try:
            while not self._ready and not self._ended:
                await self._step()
        except ConnectionError:
            if watchman is not None and exchange.body_error is BodyError.TIMEOUT:
                watchman.on_idle_timeout()  # raises Refuse with the filter's answer, or leaves the core's 408
            raise
        finally:
            self._idle.timeout = self._timeout

    async def _step(self) -> None:
        try:
            chunk = await anext(self._source)
        except StopAsyncIteration:
            self._ended = True
            self._ready.extend(self._finish())
            return
        chunks = [chunk]
        for stage in self._stages:
            chunks = stage.feed_all(chunks)
            if not chunks:
                break
        self._ready.extend(chunks)

    def _finish(self) -> list[bytes]:
        # Each filter first gets what the filters before it released at their end, then ends itself.
        chunks: list[bytes] = []
        for stage in self._stages:
            chunks = stage.feed_all(chunks) + stage.end()
        return chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        ready = self._ready
        while True:
            while ready:
                yield ready.popleft()
            if self._ended:
                return
            try:
                await self._step()
            except Refuse as refused:
                self.refused = refused
                raise ConnectionResetError("a policy refused the request body") from None
