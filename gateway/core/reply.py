"""A reply whose head has not been sent, and its body: bytes in hand, or a stream still arriving, read up to a cap
(``Reply.read``), filtered as it is written (``ResponseBodyFilter``), or handed over as pieces (``Pieces``). The
response side of the body phases (docs/architecture.md, "The phases a policy can act in")."""

from __future__ import annotations

import abc
import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from aiohttp import hdrs
from multidict import CIMultiDict

__all__ = (
    "Body",
    "BodyBroken",
    "BodyNotRead",
    "BodyTooLarge",
    "BodyUnavailable",
    "Budget",
    "Pieces",
    "Reply",
    "ResponseBodyFilter",
    "internal_error",
)


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

    def close(self) -> None:  # noqa: B027 - not abstract: a body with nothing to let go keeps this
        """Let the source go without reading (the rest of) it."""

    async def read_whole(self, each: Callable[[bytes | bytearray], object] | None
                         ) -> list[bytes | bytearray] | None:
        """The whole body as pieces, read by the source's own quicker way, if it has one (``each`` is called with
        every piece as it comes); None when it has none (the body is then unread: read it with ``chunks``).
        ``BodyBroken`` as ``chunks``."""
        return None


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

    def __init__(self, pieces: Sequence[bytes | bytearray | memoryview], *, piece: int = 1 << 20,
                 budgeted: bool = False) -> None:
        self.pieces = list(pieces)
        self.length = sum(len(p) for p in self.pieces)
        self.budgeted = budgeted  # read by ``read_pieces``: a budget it was read against took its bytes then
        self._piece = piece

    def as_bytes(self) -> list[bytes | bytearray]:
        """The pieces, each as bytes of its own (a view is copied: it is a part of other bytes; a bytearray a body
        was read into is its own)."""
        return [bytes(p) if isinstance(p, memoryview) else p for p in self.pieces]

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        size = self._piece
        gathered: list[bytes | bytearray | memoryview] = []
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

    async def read_pieces(self, cap: int, each: Callable[[bytes | bytearray], object] | None = None, *,
                          budget: Budget | None = None) -> Sequence[bytes | bytearray]:
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
        if budget is None and source.length is not None and source.length <= cap:
            try:
                whole = await source.read_whole(each)
            except BodyBroken as broken:
                self._become(broken.reply)
                raise BodyUnavailable() from broken
            if whole is not None:
                self._body = Pieces(whole, budgeted=True)
                return whole
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


def internal_error(request_id: str | None = None) -> Reply:
    """The gateway's own failure: a bug, never the client's doing nor the upstream's."""
    return Reply.error(500, "INTERNAL_ERROR", "the gateway failed to handle this request", request_id)
