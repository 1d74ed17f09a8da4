"""Writing a reply to the client: the only code that prepares a response or sends its bytes.

The framing comes from the body, never from a policy: ``Content-Length`` for a body in hand (or a stream of known
length with no filter), chunked otherwise. A HEAD request is answered with the head only, carrying the length the
body would have. An answer sent before the request body was read (``Reply.linger``) closes the connection once the
client has had a bounded chance to read it.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from ..core.aiohttp_fast import reply_response
from ..core.exchange import Body, BodyBroken, Delivery, Reply

__all__ = ("send",)

_BODY_ERRORS = (ConnectionError, aiohttp.ClientPayloadError, HttpProcessingError)
# A body in hand up to this size leaves with its head in one write; a larger one a piece of this size at a time.
_ONE_WRITE = 1 << 20
# Statuses whose response has no body (RFC 9110 6.4.1, 15.2); a HEAD's has none either, nor a 2xx to CONNECT.
_EMPTY_STATUS = frozenset({204, 304, *range(100, 200)})


def _no_body(method: str, status: int) -> bool:
    return status in _EMPTY_STATUS or method == "HEAD" or (method == "CONNECT" and 200 <= status < 300)


async def send(request: web.BaseRequest, reply: Reply, delivery: Delivery | None = None) -> web.StreamResponse:
    """Write ``reply`` whole; raises ConnectionError when the client or the upstream's body went away part way
    (the connection is then closed, so the client sees a short response, never a complete-looking one)."""
    body = reply.take_body()
    linger = None if reply.linger is None else _lingering(request, reply.linger)
    empty = _no_body(request.method, reply.status)
    if not isinstance(body, bytes):
        response = await _send_stream(request, reply, body, empty, linger)
    elif len(body) > _ONE_WRITE:
        response = await _send_large(request, reply, body, empty, linger)
    else:
        response = _response(reply, linger, True, len(body))
        await response.prepare(request)
        await response.write_eof(b"" if empty else body)
    if delivery is not None:
        delivery.complete = True
    if linger is not None:
        await _linger(request, *linger)
    return response


def _lingering(request: web.BaseRequest, linger: tuple[int, float]) -> tuple[int, float] | None:
    """The reply's lingering limits, when it is sent before the client's body was read to its end."""
    return None if request.content.is_eof() else linger


def _response(reply: Reply, linger: tuple[int, float] | None, whole: bool, length: int | None) -> web.StreamResponse:
    """The response for ``reply``'s head: its length when known, and closing the connection when asked or lingering."""
    headers = reply.headers  # handed over, not copied: the reply is done with once it is sent
    if hdrs.CONTENT_LENGTH in headers:
        del headers[hdrs.CONTENT_LENGTH]
    response = reply_response(reply.status, reply.reason, headers, whole=whole)
    if length is not None:
        response.content_length = length
    if reply.close_connection or linger is not None:
        response.force_close()
    return response


async def _send_large(request: web.BaseRequest, reply: Reply, body: bytes, empty: bool,
                      linger: tuple[int, float] | None) -> web.StreamResponse:
    # A large body in hand goes a piece at a time: one write would copy all of it into the transport's buffer at once,
    # holding the event loop.
    response = _response(reply, linger, False, len(body))
    await response.prepare(request)
    if not empty:
        view = memoryview(body)
        for at in range(0, len(body), _ONE_WRITE):
            await response.write(view[at : at + _ONE_WRITE])
    await response.write_eof()
    return response


async def _send_stream(request: web.BaseRequest, reply: Reply, body: Body, empty: bool,
                       linger: tuple[int, float] | None) -> web.StreamResponse:
    response = _response(reply, linger, False, body.length)
    await response.prepare(request)
    if empty:
        body.close()
    else:
        await _write_chunks(response, body)
    await response.write_eof()
    return response


async def _write_chunks(response: web.StreamResponse, body: Body) -> None:
    try:
        async for chunk in body.chunks():
            await response.write(chunk)
    except BodyBroken:
        # The head is sent: all that is left is to cut the connection so the client sees a short response.
        raise ConnectionResetError("the upstream's body broke off") from None
    except BaseException:
        body.close()
        raise


async def _linger(request: web.BaseRequest, max_bytes: int, max_seconds: float) -> None:
    """After an answer sent while the client may still be sending its body.

    Closing a socket with unread data makes the kernel reset the connection, and a reset can destroy the answer
    before the client reads it; reading the whole body instead (aiohttp's own lingering) costs as much as the upload.
    So: the answer went with ``Connection: close``; half-close (the client sees the end of the answer), read and
    drop at most ``max_bytes`` for at most ``max_seconds``, then close.
    """
    transport = request.transport
    if transport is not None and transport.can_write_eof():
        transport.write_eof()
    content = request.content
    if max_bytes > 0 and max_seconds > 0:
        try:
            async with asyncio.timeout(max_seconds):
                await _drop(content, max_bytes)
        except (TimeoutError, *_BODY_ERRORS):
            pass
    if not content.is_eof():
        # Stop here instead of aiohttp's lingering, which would read the rest of the upload.
        request.protocol.force_close()


async def _drop(content: aiohttp.StreamReader, max_bytes: int) -> None:
    """Read and drop the client's body until its end or ``max_bytes``."""
    read = 0
    while read < max_bytes:
        chunk = await content.readany()
        if not chunk:
            return
        read += len(chunk)
