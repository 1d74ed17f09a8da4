"""The upload upgrade's body plumbing: the client's multipart body read as parts (``Parts``), one upload's body as
aiohttp's writer pulls it (``Pipe``), and the head of the new form's one part (``form_head``).

No file is held in memory: content goes on as it arrives; what is kept is one client read and a delimiter's length.
"""

from __future__ import annotations

import asyncio
import re
import types
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from urllib.parse import quote

from ..multipart_splitter import PART_END, Event, MultipartSplitter, PartHead
from .outcomes import Refusal

__all__ = ("Parts", "Pipe", "form_head")

# A file name that can go into a quoted-string as it is; any other also goes into filename* (RFC 8187), and its
# other characters are replaced in the quoted fallback.
_PLAIN_FILENAME_RE = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]{1,255}")
_NOT_PLAIN_RE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")


class Parts:
    """The client's multipart body as parts, split as it arrives. Read by one task at a time.

    Each read of the client's body is a task of its own that the reader waits for shielded: an upload broken off
    while its writer waits for the client (cancelled by aiohttp) leaves the read, and the body, to the next reader,
    which can still list the parts that follow. ``close`` ends a read still pending."""

    def __init__(self, source: AsyncIterator[bytes], splitter: MultipartSplitter) -> None:
        self._source = source
        self._splitter = splitter
        self._events: deque[Event] = deque()
        self._ended = False
        self._reading: asyncio.Future[bytes] | None = None

    @property
    def ended(self) -> bool:
        """The whole body has been read (and found well formed)."""
        return self._ended and not self._events

    @property
    def bytes_read(self) -> int:
        return self._splitter.bytes_fed

    async def _fill(self) -> bool:
        """At least one event in hand; False once the body has ended (whole: ``end`` raises otherwise)."""
        while not self._events:
            if self._ended:
                return False
            reading = self._reading
            if reading is None:
                reading = self._reading = asyncio.ensure_future(anext(self._source))
            try:
                chunk = await asyncio.shield(reading)
            except StopAsyncIteration:
                self._reading = None
                self._ended = True
                self._events.extend(self._splitter.end())
                continue
            except asyncio.CancelledError:
                raise  # this reader was cancelled: the read goes on for the next one
            except BaseException:
                self._reading = None
                raise
            self._reading = None
            self._events.extend(self._splitter.split(chunk))
        return True

    async def close(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    async def next_part(self, limit: int | None = None) -> PartHead | None:
        """The next part's head (what is left of the current part is skipped); None at the end of the body.
        ``limit``: the most of the body read by then (``Refusal`` past it)."""
        while await self._fill():
            event = self._events.popleft()
            if isinstance(event, PartHead):
                return event
            if limit is not None and self.bytes_read > limit:
                raise Refusal("rest_bytes", "the rest of the body is longer than rest_bytes")
        return None

    async def content(self) -> AsyncIterator[bytes]:
        """The current part's content, as it arrives, to its end."""
        while await self._fill():
            event = self._events.popleft()
            if event is PART_END:
                return
            assert isinstance(event, bytes)
            yield event


class Pipe:
    """One upload's request body as aiohttp's writer pulls it: the new form's framing around the file's bytes.

    The close delimiter goes last, after ``after`` (the card route: the rest of the client's body must end cleanly);
    whatever fails before it (the client's body, a rule) is kept in ``failure`` and breaks the upload off."""

    def __init__(self, source: AsyncIterator[bytes], head: bytes, tail: bytes,
                 after: Callable[[], Awaitable[None]] | None = None) -> None:
        self._source = source
        self._head = head
        self._tail = tail
        self._after = after
        self._gen: AsyncGenerator[bytes, None] | None = None
        self.failure: Exception | None = None
        self.size = 0  # the file's bytes sent so far
        self.tail_sent = False  # the whole file went (the service may have made it)
        self.stopped = asyncio.Event()

    def body(self) -> AsyncGenerator[bytes, None]:
        self._gen = self._chunks()
        return self._gen

    async def _chunks(self) -> AsyncGenerator[bytes, None]:
        try:
            yield self._head
            async for data in self._source:
                self.size += len(data)
                yield data
            if self._after is not None:
                await self._after()
            self.tail_sent = True
            yield self._tail
        except Exception as err:
            self.failure = err
            raise
        finally:
            self.stopped.set()

    async def stop(self, timeout: float) -> bool:
        """The upload ended before its whole file went (an early answer, a broken connection): make sure nothing
        reads the client's body for it any more (aiohttp cancels its writer when the answer ends or is let go; the
        writer may be waiting for the client's body right now). False if it could not be made sure of."""
        gen = self._gen
        if gen is None or self.stopped.is_set():
            return True
        if isinstance(gen, types.AsyncGeneratorType) and gen.ag_running:
            try:
                async with asyncio.timeout(timeout):
                    await self.stopped.wait()
            except TimeoutError:
                return False
        else:
            await gen.aclose()
        return True


def sent_name(head: PartHead) -> str:
    """The file name the new form gives the service (what it will list the file under)."""
    return head.filename or "file"


def _disposition(field: str, name: str) -> str:
    """The part's Content-Disposition: a file name that is not plain ASCII is sent as a plain fallback and in full
    (RFC 8187)."""
    plain = name if _PLAIN_FILENAME_RE.fullmatch(name) else None
    fallback = plain or _NOT_PLAIN_RE.sub("_", name)[:255] or "file"
    disposition = f'form-data; name="{field}"; filename="{fallback}"'
    if plain is None:
        disposition += f"; filename*=UTF-8''{quote(name, safe='')}"
    return disposition


def form_head(boundary: str, field: str, head: PartHead) -> bytes:
    """The restricted upload's one part, up to its content: ``field``, the client's file name and media type (as the
    client wrote it, parameters such as ``charset`` included)."""
    disposition = _disposition(field, sent_name(head))
    media = head.media or head.content_type or "application/octet-stream"
    return (f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {media}\r\n\r\n").encode("latin-1")
