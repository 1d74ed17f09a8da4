"""The client's request body: read once, by whoever needs it, through one pipeline (docs/architecture.md, "The
client's body"). The edge or a policy may ``peek`` at its start through one filter (what was read goes upstream
first); the route's filters (``add_filter``, chain order) hold, pass or transform it on its way upstream
(``prime``, then iterate); a bridge may ``take_over`` the raw body. ``100 Continue`` is sent just before the first
read; one idle deadline runs only while the gateway waits for the client, whichever task reads.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .deadline import Deadline
from .reply import BodyBroken, Reply

__all__ = ("BodyError", "ClientBody", "Flow", "Refuse", "RequestBodyFilter", "broken_body_reply", "ensure_continue")

class BodyError(enum.StrEnum):
    """Why the client's body could not be read to its end (``Exchange.body_error``)."""

    ABORTED = "aborted"  # the client went away
    TIMEOUT = "timeout"  # it stopped arriving
    MALFORMED = "malformed"  # its framing broke (the client is still there)


# --- the request body -------------------------------------------------------------------------------------------


class Flow(enum.Enum):
    """What a request-body filter does with a chunk (besides returning replacement bytes, or raising Refuse)."""

    CONTINUE = "continue"  # pass on what this filter holds, then this chunk, as they are
    HOLD = "hold"  # keep this chunk back (the proxy core holds it, up to the filter's hold_limit) until it decides


class RequestBodyFilter:
    """One policy's view of one request's body, called by the proxy core as the body streams.

    ``on_data`` gets each chunk that the filters before it let through and answers ``Flow.CONTINUE``, ``Flow.HOLD``,
    or bytes: what to pass on instead of what it holds and this chunk (a transform). ``on_end`` is called once when
    the body has ended, with the same answers. ``raise Refuse(reply)`` from any of them refuses the request.

    Nothing reaches the upstream, not even the request head, before every filter has let its first byte through
    (or the body has ended): a filter that holds from the first chunk and then refuses leaves the upstream
    untouched. A filter that refuses after bytes have left makes the core abandon the upstream request mid-body (the
    upstream never receives a complete request).
    """

    # Most bytes held for this filter before it must decide; over it, the core calls on_hold_limit.
    hold_limit: int = 0
    # True for a filter that transforms: the upstream is then sent the body chunked, without the client's length.
    changes_length: bool = False
    # Before anything is sent upstream (while the filters hold the body): the longest silence from the client before
    # on_idle_timeout is called. None: server.client_body_timeout applies (408 CLIENT_BODY_TIMEOUT).
    idle_timeout: float | None = None

    def on_data(self, chunk: bytes) -> Flow | bytes:
        return Flow.CONTINUE

    def on_end(self) -> Flow | bytes:
        return Flow.CONTINUE

    def on_hold_limit(self) -> Flow | bytes:
        """The held bytes went over ``hold_limit``: decide now (HOLD is not an answer here)."""
        raise Refuse(
            Reply.error(413, "REQUEST_BODY_UNDECIDED", "a policy could not decide on the request body within its bound")
        )

    def on_idle_timeout(self) -> None:
        """No byte for ``idle_timeout`` while the body is held: raise Refuse with the answer (the default is the
        proxy core's 408)."""


class Refuse(Exception):
    """Raised by a request-body filter: the request is answered with ``reply`` and not forwarded (or no further)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


# --- the pipeline -----------------------------------------------------------------------------------------------

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


def broken_body_reply(error: BodyError | None, request_id: str) -> Reply:
    """The answer to a request whose body could not be read to its end (``error`` says why)."""
    if error is BodyError.TIMEOUT:
        reply = Reply.error(408, "CLIENT_BODY_TIMEOUT", "the request body stopped arriving", request_id)
    else:
        # "malformed": the client is still there; "aborted": nobody reads it (the access log says 499).
        reply = Reply.error(400, "MALFORMED_BODY", "the request body is malformed or was cut off", request_id)
    reply.close_connection = True  # the rest of the body is unread: the connection cannot carry another request
    return reply


class _BodyTimeout(ConnectionResetError):
    """Set on the request's stream when no byte has arrived for the idle timeout."""


class _Stage:
    """One request-body filter and the chunks held for it. ``skip``: chunks it saw while it peeked (they pass it by
    now); ``ended``: its ``on_end`` has been called."""

    __slots__ = ("filter", "held", "size", "skip", "ended", "peeked")

    def __init__(self, body_filter: RequestBodyFilter, skip: int = 0, *, peeked: bool = False) -> None:
        self.filter = body_filter
        self.held: list[bytes] = []
        self.size = 0
        self.skip = skip
        self.ended = False
        self.peeked = peeked  # the filter peeked before it was added: it watches, holding nothing back

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.skip:
            self.skip -= 1
            return [chunk]
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
        if self.ended:
            return []
        self.ended = True
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


class ClientBody:
    """One request's body, from the client to whoever reads it. ``timeout``: the longest silence from the client
    (``server.client_body_timeout``); ``request_id``: the exchange's id, for the answers it makes."""

    __slots__ = ("_request", "_timeout", "_request_id", "_deadline", "_peeked", "_stages", "_ready", "_ended",
                 "_finished", "error", "refused")

    def __init__(self, request: web.BaseRequest, timeout: float, request_id: Callable[[], str]) -> None:
        self._request = request
        self._timeout = timeout
        self._request_id = request_id
        self._deadline: Deadline | None = None
        self._peeked: deque[bytes] = deque()  # read (by a peek) and not yet passed on
        self._stages: list[_Stage] = []
        self._ready: deque[bytes] = deque()  # let through by every filter, not yet sent
        self._ended = False  # the client's body has been read to its end
        self._finished = False  # ... and every filter has been told
        self.error: BodyError | None = None  # why it could not be read to its end
        self.refused: Refuse | None = None  # a refusal that came while the upstream was being sent the body

    # --- what a policy and the edge use -----------------------------------------------------------------------------

    @property
    def filters(self) -> list[RequestBodyFilter]:
        """The filters the body goes through on its way upstream, in chain order."""
        return [stage.filter for stage in self._stages]

    @property
    def watched_only(self) -> bool:
        """Whether every filter is one that peeked and reads on as the body streams (the edge's form-body
        ``_method``): the body is still the client's as it came, and another peek may read it."""
        return all(stage.peeked for stage in self._stages)

    @property
    def changes_length(self) -> bool:
        """Whether a filter may change the body's length (the upstream is then sent it chunked)."""
        return any(stage.filter.changes_length for stage in self._stages)

    @property
    def peeked(self) -> int:
        """Bytes read ahead by a peek and not yet passed on."""
        return sum(map(len, self._peeked))

    def add_filter(self, body_filter: RequestBodyFilter, *, peeked: bool = False) -> None:
        """The next filter in chain order. ``peeked``: the filter that just peeked goes on reading as the body
        streams (it is not shown the bytes it has seen again); it must be the first."""
        if peeked and self._stages:
            raise RuntimeError("a filter that peeked must be the first")
        self._stages.append(_Stage(body_filter, len(self._peeked), peeked=True) if peeked else _Stage(body_filter))

    async def peek(self, body_filter: RequestBodyFilter) -> None:
        """Read the body through ``body_filter`` alone (the bytes an earlier peek read first), until it lets a byte
        through or the body ends; the bytes read are kept, to be passed on first. ``Refuse`` from the filter comes
        through; a body that breaks or stalls raises ``BodyBroken`` with the core's answer (or the filter's own on
        its idle timeout). Only a filter that peeked itself may come before (``watched_only``): it is shown what this
        peek reads later, as the body streams."""
        if not self.watched_only:
            raise RuntimeError("the body is peeked at before any filter but a watching one is added")
        stage = _Stage(body_filter)
        out: list[bytes] = []
        for chunk in self._peeked:
            out.extend(stage.feed(chunk))
        timeout = self._idle_timeout([body_filter])
        try:
            while not out and not self._ended:
                chunk = await self._read(timeout)
                if chunk:
                    self._peeked.append(chunk)
                    out = stage.feed(chunk)
                else:
                    out = stage.end()
        except ConnectionError as err:
            self._on_idle_timeout([body_filter])
            raise BodyBroken(self.broken_reply()) from err

    async def take_over(self) -> AsyncGenerator[bytes, None]:
        """The body as the client sent it, what was peeked first, for a bridge that performs the request itself:
        no filter runs. ``BodyBroken`` with the core's answer if it breaks or stalls."""
        try:
            while self._peeked:
                yield self._peeked.popleft()
            while chunk := await self._read(self._timeout):
                yield chunk
        except ConnectionError as err:
            raise BodyBroken(self.broken_reply()) from err

    def broken_reply(self) -> Reply:
        return broken_body_reply(self.error, self._request_id())

    # --- what the proxy core uses ---------------------------------------------------------------------------------

    async def prime(self) -> Reply | None:
        """Read until every filter has let a first byte through, or the body ended: nothing may be sent upstream
        before. The answer instead when a filter refused or the body broke (a filter's own on its idle timeout)."""
        filters = self.filters
        timeout = self._idle_timeout(filters)
        try:
            while not self._ready and not self._finished:
                await self._step(timeout)
        except Refuse as refused:
            return refused.reply
        except ConnectionError:
            try:
                self._on_idle_timeout(filters)
            except Refuse as refused:
                return refused.reply
            return self.broken_reply()
        return None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """What the upstream is sent. A refusal part way is kept in ``refused`` and breaks the upstream request
        (``ConnectionResetError``), so it never receives a complete body; so does a body that breaks."""
        ready = self._ready
        while True:
            while ready:
                yield ready.popleft()
            if self._finished:
                return
            try:
                await self._step(self._timeout)
            except Refuse as refused:
                self.refused = refused
                raise ConnectionResetError("a policy refused the request body") from None

    def close(self) -> None:
        """The exchange is over: no deadline is left behind."""
        if self._deadline is not None:
            self._deadline.cancel()

    # --- inside ---------------------------------------------------------------------------------------------------

    async def _step(self, timeout: float) -> None:
        chunk = self._peeked.popleft() if self._peeked else await self._read(timeout)
        if not chunk:
            self._finished = True
            # Each filter first gets what the filters before it released at their end, then ends itself.
            chunks: list[bytes] = []
            for stage in self._stages:
                chunks = stage.feed_all(chunks) + stage.end()
            self._ready.extend(chunks)
            return
        chunks = [chunk]
        for stage in self._stages:
            chunks = stage.feed_all(chunks)
            if not chunks:
                break
        self._ready.extend(chunks)

    async def _read(self, timeout: float) -> bytes:
        """The client's next chunk (b"" at the end). On failure ``error`` says why, and a ConnectionError is raised
        (so that an upstream request streaming the body is abandoned with it)."""
        if self._ended:
            return b""
        request = self._request
        await ensure_continue(request)
        content = request.content
        deadline = self._deadline
        if deadline is None:
            deadline = self._deadline = Deadline(asyncio.get_running_loop(), self._expired)
        deadline.set(timeout)
        try:
            chunk = await content.readany()
        except _BodyTimeout:
            self.error = BodyError.TIMEOUT
            raise ConnectionResetError("the request body stopped arriving") from None
        except _MALFORMED as err:
            # aiohttp stops feeding a body whose framing broke: the client is still there and gets a 400.
            self.error = BodyError.MALFORMED
            raise ConnectionResetError("the request body is malformed") from err
        except ConnectionError:
            # The client went away: the upstream request is abandoned with it.
            self.error = BodyError.ABORTED
            raise
        finally:
            deadline.clear()  # only time spent waiting for the client counts
        if not chunk:
            self._ended = True
            deadline.cancel()
        return chunk

    def _expired(self) -> None:
        self._request.content.set_exception(_BodyTimeout())

    def _idle_timeout(self, filters: list[RequestBodyFilter]) -> float:
        """While filters hold the body, the shortest ``idle_timeout`` among them, if shorter than the server's."""
        timeouts = [f.idle_timeout for f in filters if f.idle_timeout is not None]
        return min([self._timeout, *timeouts])

    def _on_idle_timeout(self, filters: list[RequestBodyFilter]) -> None:
        """The body stalled: the filter whose idle timeout fired answers (raises Refuse), if it has an answer."""
        if self.error is not BodyError.TIMEOUT:
            return
        timeouts = [f for f in filters if f.idle_timeout is not None and f.idle_timeout < self._timeout]
        if timeouts:
            min(timeouts, key=lambda f: f.idle_timeout or 0.0).on_idle_timeout()
