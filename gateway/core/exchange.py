"""One exchange: a classified request on its way through its route's chain, and the reply that comes back. This is the
whole interface a policy works with (``Exchange``, ``Reply``, the body-phase types, the proxy core's ``Services``,
``Budget``); docs/architecture.md ("The phases a policy can act in", "A policy's own requests, and its bounds") says
how a policy uses it and which rules the proxy core enforces."""

from __future__ import annotations

import abc
import asyncio
import enum
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy

from .http import new_request_id, token_fingerprint
from .tracecontext import TraceContext

if TYPE_CHECKING:
    from .route import Route
    from .tenants import Tenant

__all__ = (
    "Body",
    "BodyBroken",
    "BodyError",
    "BodyNotRead",
    "BodyTooLarge",
    "BodyUnavailable",
    "Budget",
    "Cut",
    "Delivery",
    "Exchange",
    "Flow",
    "Next",
    "Pieces",
    "Policy",
    "Refuse",
    "Reply",
    "RequestBodyFilter",
    "ResponseBodyFilter",
    "Services",
    "SubRequest",
    "UpstreamError",
    "UpstreamFailed",
)


# --- what the parts of the gateway tell each other about an exchange -------------------------------------------


class BodyError(enum.StrEnum):
    """Why the client's body could not be read to its end (``Exchange.body_error``)."""

    ABORTED = "aborted"  # the client went away
    TIMEOUT = "timeout"  # it stopped arriving
    MALFORMED = "malformed"  # its framing broke (the client is still there)


class UpstreamError(enum.StrEnum):
    """Why an upstream request got no (whole) answer: the ``kind`` of gateway_upstream_errors_total, and ``BUSY``
    when the tenant's turn in ``upstream.max_concurrent_per_tenant`` did not come."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    RESET = "reset"
    OTHER = "other"
    BUSY = "busy"


class Cut(enum.StrEnum):
    """Why the gateway itself cut an exchange short (``Exchange.cut``)."""

    SHUTDOWN = "shutdown"  # the shutdown deadline passed before it had started its answer


class Delivery:
    """What became of a reply: ``complete`` once its last byte was handed to the connection (lingering after it,
    and a client that leaves then, does not change what it was answered)."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False


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


# --- the response body ------------------------------------------------------------------------------------------


class ResponseBodyFilter:
    """One policy's view of one response's body as the proxy core writes it: each chunk in, the bytes to send out.

    Filters added by inner policies run first (they were added first, as the chain unwinds). A response with a filter
    is sent without a Content-Length (chunked), since the filter may change its size.
    """

    def on_data(self, chunk: bytes) -> bytes:
        return chunk

    def on_end(self) -> bytes:
        return b""


class Body(abc.ABC):
    """A body that streams (the upstream's, as the proxy core supplies it). Read once, or closed unread."""

    # Bytes it will yield, when known (the upstream's Content-Length); None otherwise.
    length: int | None = None

    @abc.abstractmethod
    def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        """The body's bytes; ``BodyBroken`` if its source fails part way. ``as_they_come``: hand over the source's
        pieces without joining what is buffered (for a reader that joins them itself)."""

    def close(self) -> None:
        """Let the source go without reading (the rest of) it."""


class BodyBroken(Exception):
    """The source of a streamed body failed part way; ``reply`` is the proxy core's answer for that failure."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


class BodyNotRead(Exception):
    """``Reply.read`` could not give the whole body; the reply stays as it should be sent. Return it as it is."""


class BodyTooLarge(BodyNotRead):
    """The body is over the cap: the reply keeps all of it (what was read and the rest, still streaming)."""


class BodyUnavailable(BodyNotRead):
    """The body's source failed part way: the reply is now the proxy core's error answer (502 or 504)."""


class _Filtered(Body):
    """A body seen through response filters, in order."""

    def __init__(self, source: Body | bytes, filters: list[ResponseBodyFilter]) -> None:
        self._source = source
        self._filters = filters

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        source = self._source
        filters = self._filters
        if isinstance(source, bytes):
            pieces: AsyncIterator[bytes] = _one(source)
        else:
            pieces = source.chunks(as_they_come=as_they_come)
        async for piece in pieces:
            for f in filters:
                piece = f.on_data(piece)
                if not piece:
                    break
            if piece:
                yield piece
        tail = b""
        for f in filters:
            tail = f.on_data(tail) if tail else tail
            tail += f.on_end()
        if tail:
            yield tail

    def close(self) -> None:
        if not isinstance(self._source, bytes):
            self._source.close()


class _Prefixed(Body):
    """What was read of a body, then the rest of it still streaming."""

    def __init__(self, prefix: list[bytes], rest: AsyncIterator[bytes], source: Body, length: int | None) -> None:
        self._prefix = prefix
        self._rest = rest
        self._source = source
        self.length = length

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        for piece in self._prefix:
            yield piece
        self._prefix = []
        async for piece in self._rest:
            yield piece

    def close(self) -> None:
        self._source.close()


async def _one(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


class Pieces(Body):
    """A body in hand as pieces, never joined whole: the pieces it arrived in (``Reply.read_pieces``), or a body
    assembled from views into larger bytes (``set_body(Pieces(...))``). It is sent a piece at a time: a piece of
    64 KiB or more as it is (one larger than ``piece`` in slices of it), smaller ones gathered up to ``piece``, so
    that many small views do not make as many small writes."""

    def __init__(self, pieces: Sequence[bytes | memoryview], *, piece: int = 1 << 20, budgeted: bool = False) -> None:
        self.pieces = list(pieces)
        self.length = sum(len(p) for p in self.pieces)
        self.budgeted = budgeted  # read by ``read_pieces``: a budget it was read against took its bytes then
        self._piece = piece

    def as_bytes(self) -> list[bytes]:
        """The pieces, each as bytes (a view is copied: it is a part of other bytes)."""
        return [p if isinstance(p, bytes) else bytes(p) for p in self.pieces]

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        size = self._piece
        gathered: list[bytes | memoryview] = []
        held = 0
        for piece in self.pieces:
            if len(piece) >= _GATHER_BELOW:
                if gathered:
                    yield b"".join(gathered)
                    gathered, held = [], 0
                if len(piece) <= size:
                    yield piece if isinstance(piece, bytes) else bytes(piece)
                    continue
                view = memoryview(piece)
                for at in range(0, len(view), size):
                    yield bytes(view[at : at + size])
                continue
            gathered.append(piece)
            held += len(piece)
            if held >= size:
                yield b"".join(gathered)
                gathered, held = [], 0
        if gathered:
            yield b"".join(gathered)

    def close(self) -> None:
        return  # nothing to let go: the pieces are in memory


class Budget:
    """Bytes that several reads may hold together (the pages of one backfill, read in parallel): each read takes
    what it keeps from it before it keeps it, so that the reads together never hold more than ``limit``."""

    __slots__ = ("limit", "left")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (nothing reserved) when fewer are left."""
        if n > self.left:
            return False
        self.left -= n
        return True


# --- the reply --------------------------------------------------------------------------------------------------

# ``Reply.read``: a body at least this large is joined off the event loop.
_JOIN_ON_LOOP = 1 << 20
# A piece of a body in hand smaller than this is gathered with its neighbours before it is written.
_GATHER_BELOW = 64 * 1024


class Reply:
    """A response whose head has not been sent: status, headers and a body (bytes, or a stream still arriving).

    The proxy core sets the framing when it writes it (Content-Length from the body, or chunked): a Content-Length in
    ``headers`` is not sent. For a HEAD request it sends the head only, with the length the body would have.
    """

    __slots__ = ("status", "reason", "headers", "_body", "_filters", "linger", "close_connection")

    def __init__(
        self,
        status: int,
        headers: CIMultiDict[str] | None = None,
        body: bytes | Body = b"",
        *,
        reason: str | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers: CIMultiDict[str] = headers if headers is not None else CIMultiDict()
        self._body = body
        self._filters: list[ResponseBodyFilter] = []
        # An answer sent before the request body was read: (bytes, seconds) of the rest of it to read and drop after
        # the answer, so that the client can read the answer before the connection is closed.
        self.linger: tuple[int, float] | None = None
        # Answer with Connection: close (the connection cannot carry another request).
        self.close_connection = False

    @classmethod
    def json(cls, status: int, payload: Mapping[str, object]) -> Reply:
        headers = CIMultiDict({hdrs.CONTENT_TYPE: "application/json"})
        return cls(status, headers, json.dumps(payload).encode())

    @classmethod
    def error(
        cls, status: int, code: str, message: str, request_id: str | None = None, **extra: str
    ) -> Reply:
        """The gateway's error answer: JSON ``{"code", "message"[, "request_id"], ...extra}``."""
        payload: dict[str, str] = {"code": code, "message": message}
        if request_id:
            payload["request_id"] = request_id
        payload.update(extra)
        return cls.json(status, payload)

    @property
    def length(self) -> int | None:
        """The body's size when known before it is sent (None for a stream of unknown length, or a filtered one)."""
        if self._filters:
            return None
        body = self._body
        return len(body) if isinstance(body, bytes) else body.length

    @property
    def streamed(self) -> bool:
        """Whether the body is still to be read from its source (False: it is in hand, ``read`` costs nothing)."""
        return not isinstance(self._body, (bytes, Pieces))

    def add_filter(self, response_filter: ResponseBodyFilter) -> None:
        self._filters.append(response_filter)

    async def read(self, cap: int, *, budget: Budget | None = None) -> bytes:
        """The whole body (through the filters added so far), at most ``cap`` bytes; it becomes the reply's body.

        Over the cap, or over what ``budget`` has left (each piece is taken from it before it is kept):
        ``BodyTooLarge``, and the reply still sends all of it (what the budget gave for it stays taken). A source
        that fails part way: ``BodyUnavailable``, and the reply is now the proxy core's answer for that failure.
        """
        body = self._body
        if isinstance(body, bytes) and not self._filters:
            if len(body) > cap or (budget is not None and not budget.take(len(body))):
                raise BodyTooLarge()
            return body
        pieces = await self.read_pieces(cap, budget=budget)
        if sum(map(len, pieces)) < _JOIN_ON_LOOP:
            data = b"".join(pieces)
        else:
            # A large body is joined on a worker thread (the copy lets the GIL go): the event loop is not held.
            data = await asyncio.get_running_loop().run_in_executor(None, b"".join, pieces)
        self._body = data
        return data

    async def read_pieces(self, cap: int, each: Callable[[bytes], object] | None = None, *,
                          budget: Budget | None = None) -> list[bytes]:
        """Like ``read``, but the body stays the pieces it arrived in (no copy of it is made to join them); they
        become the reply's body, sent as they are unless it is replaced. ``each`` is called with every piece as it
        arrives, between the event loop's other work: a reader that works on the body as it comes never holds the
        loop for the whole body at once. Over the cap, over the budget and on a source that fails part way: as
        ``read``.
        """
        body = self._body
        if not self._filters and isinstance(body, (bytes, Pieces)):
            pieces = body.as_bytes() if isinstance(body, Pieces) else [body] if body else []
            size = sum(map(len, pieces))
            # A body this method read took its budget then; any other body in hand takes it now.
            counted = isinstance(body, Pieces) and body.budgeted
            if size > cap or (budget is not None and not counted and not budget.take(size)):
                raise BodyTooLarge()
            if each is not None:
                for piece in pieces:
                    each(piece)
            return pieces
        source = self.take_body()
        assert not isinstance(source, bytes)
        stream = source.chunks(as_they_come=True)
        chunks: list[bytes] = []
        size = 0
        try:
            async for piece in stream:
                chunks.append(piece)
                size += len(piece)
                if size > cap or (budget is not None and not budget.take(len(piece))):
                    self._body = _Prefixed(chunks, stream, source, source.length)
                    raise BodyTooLarge()
                if each is not None:
                    each(piece)
        except BodyBroken as broken:
            self._become(broken.reply)
            raise BodyUnavailable() from broken
        self._body = Pieces(chunks, budgeted=True)
        return chunks

    def discard(self) -> None:
        """Let a streamed body go unread: for a policy that answers with another reply than the one it got."""
        self._close_stream()
        self._body = b""
        self._filters = []

    def set_body(self, data: bytes | Body) -> None:
        """Replace the body (a stream that was not read is let go). Filters added before no longer apply."""
        self._close_stream()
        self._body = data
        self._filters = []

    def take_body(self) -> bytes | Body:
        """The body with its filters applied, handed over once (to ``read``, or to the proxy core to send)."""
        body = self._body
        filters = self._filters
        if filters:
            self._filters = []
            return _Filtered(body, filters)
        return body

    def _close_stream(self) -> None:
        if not isinstance(self._body, bytes):
            self._body.close()

    def _become(self, other: Reply) -> None:
        self.status, self.reason, self.headers = other.status, other.reason, other.headers
        self._body, self._filters = other._body, other._filters
        self.close_connection = other.close_connection


# --- the proxy core's services to a policy ---------------------------------------------------------------------


class UpstreamFailed(Exception):
    """A request of a policy's own got no response head: ``kind`` says why; ``reply`` is what the proxy core would
    answer for it."""

    def __init__(self, kind: UpstreamError, reply: Reply) -> None:
        super().__init__(kind)
        self.kind = kind
        self.reply = reply


@dataclass(slots=True)
class SubRequest:
    """One request of a policy's own, as the proxy core sent it (the access log and the metrics read them)."""

    purpose: str  # what the policy named it (bounded: a metric label)
    method: str
    status: int | None = None  # the response head's; None when none came
    error: UpstreamError | None = None  # when no response head came
    seconds: float = 0.0  # from sending it to its response head (or its failure)


class Services(abc.ABC):
    """What the proxy core does for a policy besides forwarding its request (see ``Exchange.fetch``)."""

    @abc.abstractmethod
    async def fetch(self, exchange: Exchange, method: str, path: str, *, query: str = "",
                    headers: Mapping[str, str] | None = None, body: bytes | AsyncIterator[bytes] | None = None,
                    purpose: str = "policy") -> Reply: ...

    @abc.abstractmethod
    def client_body(self, exchange: Exchange, *, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]: ...


# --- the exchange -----------------------------------------------------------------------------------------------

Next = Callable[["Exchange"], Awaitable[Reply]]
Policy = Callable[["Exchange", Next], Awaitable[Reply]]


class _Unset:
    """Not worked out yet."""


_UNSET = _Unset()


class Exchange:
    """What the gateway knows about one request while it is being served; made once it is classified."""

    __slots__ = ("request", "start", "tenant", "route", "params", "path", "query", "method", "request_id",
                 "request_id_header", "upstream_headers", "request_filters", "decisions", "notes", "upstream_seconds",
                 "upstream_error", "upstream_error_kind", "upstream_retries", "body_error", "services", "body_prefix",
                 "subrequests", "queue_full", "cut", "trace", "_client")

    def __init__(self, request: web.BaseRequest, start: float, tenant: Tenant, route: Route,
                 params: dict[str, str], path: str, query: str, method: str) -> None:
        self.request = request  # the client's request: the proxy core reads its body; policies read the fields below
        self.start = start  # time.monotonic() when it arrived
        self.tenant = tenant
        self.route = route
        self.params = params  # the route template's path parameters
        self.path = path  # canonical path: what was classified and what the upstream receives
        self.query = query  # raw query string, without '?'
        # Effective method (method-override headers and ``_method`` included): what the upstream receives.
        self.method = method
        self.request_id: str | None = None
        # The header every upstream request of this exchange carries its id in (the client's own and each request
        # of a policy's own): the request_id policy's ``header``.
        self.request_id_header = "X-Request-Id"
        # Headers the upstream request gets on top of (value) or without (None) the client's.
        self.upstream_headers: dict[str, str | None] = {}
        # Request-body filters, in chain order (outermost policy first).
        self.request_filters: list[RequestBodyFilter] = []
        # Policy name -> decision label, for the access log, the metrics and the usage report.
        self.decisions: dict[str, str] = {}
        # A policy's fields for the access-log line ("legacy_upload_guard.rule": the rule behind a refusal).
        self.notes: dict[str, str] = {}
        # What the proxy core saw (the access log and the metrics read them):
        self.upstream_seconds: float | None = None  # from sending upstream to its response head
        self.upstream_error: str | None = None  # "<kind>: <error>", or "body_reset" / "body_timeout" mid-body
        self.upstream_error_kind: UpstreamError | None = None
        # Why a request was sent again ("unsent", "safe_method"): the client's, and those of a policy's own.
        self.upstream_retries: list[str] = []
        self.body_error: BodyError | None = None
        self.services: Services | None = None  # set by the gateway: the proxy core
        # Body bytes already read (by the edge for a form body's ``_method``, or by a policy before it decided): sent
        # upstream first, in order, then the rest of the body.
        self.body_prefix: list[bytes] = []
        # The requests of a policy's own sent for this exchange (None until the first).
        self.subrequests: list[SubRequest] | None = None
        self.queue_full = False  # answered 503 UPSTREAM_BUSY: the tenant's turn did not come
        self.cut: Cut | None = None  # cut short by the gateway itself (a policy that undoes its work reads it)
        # Its place in a trace (set by the edge; None when it has none): every upstream request carries it on.
        self.trace: TraceContext | None = None
        self._client: str | None | _Unset = _UNSET

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The client's request headers, as received."""
        return self.request.headers

    @property
    def has_body(self) -> bool:
        return self.request.body_exists

    @property
    def client(self) -> str | None:
        """The client's token fingerprint (``core.http.token_fingerprint``), worked out once per request."""
        client = self._client
        if isinstance(client, _Unset):
            client = self._client = token_fingerprint(self.request.headers.get(hdrs.AUTHORIZATION))
        return client

    async def fetch(self, method: str, path: str, *, query: str = "", headers: Mapping[str, str] | None = None,
                    body: bytes | AsyncIterator[bytes] | None = None, purpose: str = "policy") -> Reply:
        """A request of the policy's own to this tenant's upstream: ``path`` and ``query`` as they go on the wire
        (percent-encoded), ``headers`` on top of what the client's own request would carry of the gateway's: Host,
        the forwarding headers (``X-Forwarded-*``, ``Forwarded``, ``Via``) and the request id. No other header of
        the client's is sent unless given here (a bridge passes the client's own ``Authorization``, never another).
        ``purpose`` names it in the metrics and the access log (a few lower-case words joined by ``_``).

        It waits for the tenant's turn and is retried like a forwarded request; its answer's body streams (read it
        with ``reply.read(cap)``, or let it go with ``reply.discard()``). ``UpstreamFailed`` when no response head
        came; the caller bounds the total time (``asyncio.timeout``)."""
        if self.services is None:
            raise RuntimeError("this exchange is not served by a proxy core")
        return await self.services.fetch(self, method, path, query=query, headers=headers, body=body, purpose=purpose)

    def client_body(self, *, idle_timeout: float | None = None) -> AsyncGenerator[bytes, None]:
        """The client's request body as it arrives (``body_prefix`` first), for a policy that reads it itself:
        ``100 Continue`` is sent first if asked for; a body that stops arriving (for ``idle_timeout``, by default
        ``server.client_body_timeout``), breaks or is abandoned raises ``BodyBroken`` with the proxy core's answer
        (408, 400; ``body_error`` says which)."""
        if self.services is None:
            raise RuntimeError("this exchange is not served by a proxy core")
        return self.services.client_body(self, idle_timeout=idle_timeout)

    def ensure_request_id(self) -> str:
        """This request's id; one is made now if no ``request_id`` policy made one (an error answer names it)."""
        if self.request_id is None:
            self.request_id = new_request_id()
        return self.request_id
