"""aiohttp behind one door: every use the gateway makes of aiohttp's private or undocumented API is here, each as a
fast path beside a fallback to the public API that does the same job (the same bytes to the client and the upstream,
the same errors and records; only slower).

Each fast path is detected at import by feature (the attributes, signatures and behaviour it relies on, tried on
throwaway objects) and can be forced off with ``GATEWAY_AIOHTTP_FAST_PATHS`` (``off``, or the names of the ones to
keep); an aiohttp that lacks a piece turns its path off instead of stopping the gateway. ``describe`` is the line
``gateway serve`` logs at start, ``check`` its refusal of a setting it does not understand. The paths, their pieces
and fallbacks, and why each exists: docs/architecture.md ("aiohttp's private pieces").
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import inspect
import os
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
from aiohttp import base_protocol, client_proto, connector, helpers, http_writer, web
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawResponseMessage
from aiohttp.streams import StreamReader
from aiohttp.typedefs import LooseHeaders
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from .deadline import Deadline

__all__ = (
    "ENV",
    "FAST",
    "PATHS",
    "Attempt",
    "BodylessResponse",
    "FastPaths",
    "UpstreamRoads",
    "check",
    "decide",
    "describe",
    "install_protocol",
    "read_body_into",
    "reply_response",
)

ENV = "GATEWAY_AIOHTTP_FAST_PATHS"
PATHS = ("upstream_request", "upstream_bodyless", "upstream_protocol", "upstream_body_into", "reply_headers",
         "reply_one_write")
# A path that drives another one's pieces is off when that one is (each listed in PATHS after those it needs).
_NEEDS = {"upstream_bodyless": ("upstream_request",), "upstream_body_into": ("upstream_bodyless", "upstream_protocol")}


class FastPaths:
    """Which fast paths are on (one attribute each) and, for each one off, why."""

    upstream_request: bool
    upstream_bodyless: bool
    upstream_protocol: bool
    upstream_body_into: bool
    reply_headers: bool
    reply_one_write: bool

    def __init__(self, off: Mapping[str, str], problem: str | None = None) -> None:
        self.off = dict(off)  # name -> why it is off
        self.problem = problem  # what is wrong with GATEWAY_AIOHTTP_FAST_PATHS, if anything
        for name in PATHS:
            setattr(self, name, name not in off)


def decide(environ: Mapping[str, str], missing: Mapping[str, str]) -> FastPaths:
    """The fast paths for ``environ``'s ``GATEWAY_AIOHTTP_FAST_PATHS`` (unset, empty or ``on``: every one this aiohttp
    has; ``off``: none; otherwise the comma-separated names of the ones to keep) and ``missing`` (name -> the piece
    this aiohttp lacks). A setting naming an unknown path turns them all off and is the ``problem``."""
    setting = environ.get(ENV, "").strip()
    problem = None
    if setting in ("", "on"):
        forced: set[str] = set()
    elif setting == "off":
        forced = set(PATHS)
    else:
        kept = {name.strip() for name in setting.split(",") if name.strip()}
        forced = set(PATHS) - kept
        if unknown := sorted(kept - set(PATHS)):
            forced = set(PATHS)
            problem = f"{ENV}={setting!r}: unknown fast path {', '.join(unknown)} (on, off, or names from " \
                      f"{', '.join(PATHS)})"
    off: dict[str, str] = {}
    for name in PATHS:
        if name in missing:
            off[name] = f"missing: {missing[name]}"
        elif name in forced:
            off[name] = f"forced off by {ENV}"
        elif needed := [need for need in _NEEDS.get(name, ()) if need in off]:
            off[name] = f"needs {', '.join(needed)}"
    return FastPaths(off, problem)


def check(fast: FastPaths | None = None) -> None:
    """Raise ValueError naming what is wrong with ``GATEWAY_AIOHTTP_FAST_PATHS``, if anything (``gateway serve``
    refuses to start)."""
    problem = (fast or FAST).problem
    if problem is not None:
        raise ValueError(problem)


def describe(fast: FastPaths | None = None) -> str:
    """The line ``gateway serve`` logs at start: the paths on, and why each other one is off."""
    fast = fast or FAST
    on = [name for name in PATHS if name not in fast.off]
    off = [f"{name} ({why})" for name, why in fast.off.items()]
    return f"aiohttp {aiohttp.__version__} fast paths on: {', '.join(on) or 'none'}; off: {', '.join(off) or 'none'}"


# --- detection ----------------------------------------------------------------------------------------------------


def _has_parameters(func: object, *names: str) -> bool:
    try:
        parameters = inspect.signature(func)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return all(name in parameters.parameters for name in names)


def _missing(checks: Iterable[tuple[str, Callable[[], bool]]]) -> str | None:
    """The first piece whose check fails (or raises), or None."""
    for piece, present in checks:
        try:
            if not present():
                return piece
        except Exception:  # a check trying a piece that changed shape: the piece is missing
            return piece
    return None


def _serializes() -> bool:
    head = http_writer._serialize_headers("GET / HTTP/1.1", CIMultiDict(Host="h"))
    try:
        http_writer._serialize_headers("GET / HTTP/1.1", CIMultiDict(Host="h\r\nX: 1"))
    except ValueError:
        return head == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    return False


_Checks = list[tuple[str, Callable[[], bool]]]  # (the piece, whether this aiohttp has it as the path uses it)


def _detect() -> dict[str, str]:
    """Each fast path this aiohttp lacks a piece of: name -> the piece. Objects are tried on a loop never run."""
    loop = asyncio.new_event_loop()
    try:
        pool = _made(lambda: connector.BaseConnector(loop=loop))
        protocol = _made(lambda: client_proto.ResponseHandler(loop))
        checks: dict[str, _Checks] = {
            "upstream_request": _request_checks(loop),
            "upstream_bodyless": _bodyless_checks(loop, pool, protocol),
            "upstream_protocol": _protocol_checks(pool, protocol),
            "upstream_body_into": _body_into_checks(loop, protocol),
            "reply_headers": [("StreamResponse(_real_headers=)", _hands_headers_over)],
            "reply_one_write": [("StreamResponse._send_headers_immediately",
                                 lambda: getattr(web.StreamResponse, "_send_headers_immediately", None) is True)],
        }
        missing = {name: _missing(pieces) for name, pieces in checks.items()}
    finally:
        loop.close()
    return {name: piece for name, piece in missing.items() if piece is not None}


def _request_checks(loop: asyncio.AbstractEventLoop) -> _Checks:
    return [
        ("ClientRequest(method, url, headers=, data=, loop=, timer=, session=, version=)",
         lambda: _has_parameters(aiohttp.ClientRequest, "method", "url", "headers", "data", "loop", "timer", "session",
                                 "version")),
        ("ClientRequest.update_headers(headers), update_auto_headers(skip_auto_headers)",
         lambda: _has_parameters(aiohttp.ClientRequest.update_headers, "headers")
         and _has_parameters(aiohttp.ClientRequest.update_auto_headers, "skip_auto_headers")),
        ("helpers.TimerNoop", lambda: issubclass(helpers.TimerNoop, helpers.BaseTimerContext)),
        ("ClientRequest sending the headers given, adding none",
         lambda: list(_probe_request(loop).headers.items()) == [("Host", "127.0.0.1")]),
        ("ClientRequest.connection_key", lambda: isinstance(aiohttp.ClientRequest.connection_key, property)),
        ("BaseConnector.connect(req, traces, timeout)",
         lambda: _has_parameters(connector.BaseConnector.connect, "req", "traces", "timeout")),
        ("ClientRequest.send(conn)", lambda: _has_parameters(aiohttp.ClientRequest.send, "conn")),
        ("ClientResponse.start(connection)", lambda: _has_parameters(aiohttp.ClientResponse.start, "connection")),
        ("ResponseHandler.set_response_params(timer=, skip_payload=, read_until_eof=, auto_decompress=, "
         "read_timeout=, read_bufsize=, timeout_ceil_threshold=, max_line_size=, max_field_size=, max_headers=)",
         lambda: _has_parameters(client_proto.ResponseHandler.set_response_params, "timer", "skip_payload",
                                 "read_until_eof", "auto_decompress", "read_timeout", "read_bufsize",
                                 "timeout_ceil_threshold", "max_line_size", "max_field_size", "max_headers")),
    ]


def _bodyless_checks(loop: asyncio.AbstractEventLoop, pool: Any, protocol: Any) -> _Checks:
    return [
        ("http_writer._serialize_headers(status_line, headers)", _serializes),
        ("BaseConnector._conns, _acquired, _acquired_per_host, _limit_per_host, _keepalive_timeout",
         lambda: isinstance(pool._conns, dict) and isinstance(pool._acquired, set)
         and isinstance(pool._acquired_per_host, dict) and isinstance(pool._limit_per_host, int)
         and isinstance(pool._keepalive_timeout, float | None)),
        ("BaseConnector._release(key, protocol, should_close=)",
         lambda: _has_parameters(pool._release, "key", "protocol", "should_close")),
        ("Connection._protocol",
         lambda: _detached(connector.Connection(pool, _probe_key(loop), protocol, loop)) is protocol),
        ("ResponseHandler.read(), is_connected(), should_close, start_timeout()",
         lambda: inspect.iscoroutinefunction(protocol.read) and callable(protocol.is_connected)
         and isinstance(protocol.should_close, bool) and callable(protocol.start_timeout)),
        ("RawResponseMessage.code, reason, headers",
         lambda: all(hasattr(RawResponseMessage, name) for name in ("code", "reason", "headers"))),
    ]


def _protocol_checks(pool: Any, protocol: Any) -> _Checks:
    return [
        ("BaseConnector._factory (makes each connection's ResponseHandler)",
         lambda: isinstance(pool._factory, functools.partial) and pool._factory.func is client_proto.ResponseHandler),
        ("ResponseHandler._reschedule_timeout(), _drop_timeout(), _on_read_timeout()",
         lambda: all(callable(getattr(protocol, name)) for name in
                     ("_reschedule_timeout", "_drop_timeout", "_on_read_timeout"))),
        ("ResponseHandler._read_timeout, _parser", lambda: _response_params(protocol)),
    ]


def _body_into_checks(loop: asyncio.AbstractEventLoop, protocol: Any) -> _Checks:
    return [
        ("StreamReader._buffer, _read_nowait_chunk(n), total_bytes", lambda: _drains(loop)),
        ("ResponseHandler.set_exception(exc), eof_received(), connection_lost(exc), pause_writing(), "
         "resume_writing()", lambda: all(callable(getattr(protocol, name)) for name in
                                         ("set_exception", "eof_received", "connection_lost", "pause_writing",
                                          "resume_writing"))),
    ]


def _drains(loop: asyncio.AbstractEventLoop) -> bool:
    """A payload's buffered chunks are taken one by one, as they were fed, and ``total_bytes`` counts them."""
    payload = StreamReader(base_protocol.BaseProtocol(loop), 1 << 16, loop=loop)
    payload.feed_data(b"ab")
    payload.feed_data(b"cde")
    first = payload._read_nowait_chunk(-1)
    return first == b"ab" and len(payload._buffer) == 1 and payload.total_bytes == 5


def _response_params(protocol: client_proto.ResponseHandler) -> bool:
    """``_read_timeout`` and ``_parser`` are what ``set_response_params`` sets."""
    if protocol._parser is not None:
        return False
    protocol.set_response_params(read_timeout=7.5)
    return protocol._read_timeout == 7.5 and protocol._parser is not None


def _made(make: Callable[[], object]) -> Any:
    """What ``make`` makes, or None when it fails (the checks that use it then fail: their pieces are missing)."""
    try:
        return make()
    except Exception:
        return None


def _probe_key(loop: asyncio.AbstractEventLoop) -> ConnectionKey:
    return _probe_request(loop).connection_key


def _probe_request(loop: asyncio.AbstractEventLoop) -> aiohttp.ClientRequest:
    return _ProxiedRequest("GET", URL("http://127.0.0.1/"), headers=CIMultiDict(Host="127.0.0.1"), loop=loop,
                           timer=_NO_TIMER, session=None, version=aiohttp.HttpVersion11)


def _hands_headers_over() -> bool:
    headers: CIMultiDict[str] = CIMultiDict()
    return web.StreamResponse(_real_headers=headers).headers is headers


# --- the reply (server/writer.py) ---------------------------------------------------------------------------------


class _WholeBody(web.StreamResponse):
    """A response whose body is in hand: its head waits to leave with the body, in one write (as ``web.Response``'s
    does, without its handling of text, charsets and compression)."""

    _send_headers_immediately = False


def reply_response(status: int, reason: str | None, headers: CIMultiDict[str], *, whole: bool) -> web.StreamResponse:
    """The response for a reply: ``headers`` handed over (reply_headers; a copy otherwise: the caller is done with
    them either way); ``whole``: its body is in hand and goes with its head in one write (reply_one_write; otherwise
    the head leaves at ``prepare`` and the body at ``write_eof``, the same bytes in two writes)."""
    fast = FAST
    kind = _WholeBody if whole and fast.reply_one_write else web.StreamResponse
    if fast.reply_headers:
        return kind(status=status, reason=reason, _real_headers=headers)
    return kind(status=status, reason=reason, headers=headers)


# --- the upstream client (proxy/upstream.py) ----------------------------------------------------------------------

# Only what the client sent goes upstream: no default User-Agent, Accept or Content-Type.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
READ_BUFSIZE = 256 * 1024
MAX_LINE_SIZE = 8190
MAX_HEADERS = 128
TIMEOUT_CEIL_THRESHOLD = 5.0
_NO_TIMER = helpers.TimerNoop()
_GET_METHODS = frozenset(aiohttp.ClientRequest.GET_METHODS)
_CONTENT_LENGTH = istr("Content-Length")
_AUTHORIZATION = istr("Authorization")
# Methods whose response has no body to read (ClientSession: EMPTY_BODY_METHODS).
_NO_RESPONSE_BODY = frozenset({"HEAD"})
_SKIPPED: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(istr(n) for n in SKIP_AUTO_HEADERS))


class _ProxiedRequest(aiohttp.ClientRequest):
    """aiohttp's request, taking the proxy core's headers as they are.

    They come with their Host first, as aiohttp would put it; and every header aiohttp would add on its own is in
    the skip list (checked at import: ``_detect``), so none is added.
    """

    def update_headers(self, headers: LooseHeaders | None) -> None:
        assert isinstance(headers, CIMultiDict) and "Host" in headers
        self.headers = CIMultiDict(headers)

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        self._skip_auto_headers = _SKIPPED


class _Connection(client_proto.ResponseHandler):
    """aiohttp's client connection protocol, with its read timeout (``upstream.read_timeout``) kept as a ``Deadline``
    (one timer per connection) instead of a new timer for each piece read and each request."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._read_deadline = Deadline(loop, self._on_read_timeout)
        self.parser_skips_payload: bool | None = None  # the setting the parser in place was made with
        self.body_into: _BodyInto | None = None  # the body being read straight into buffers (read_body_into)

    def set_response_params(self, **params: Any) -> None:
        super().set_response_params(**params)
        self.parser_skips_payload = params.get("skip_payload", False)

    def _reschedule_timeout(self) -> None:
        timeout = self._read_timeout
        if timeout:
            self._read_deadline.set(timeout)
        else:
            self._read_deadline.clear()

    def _drop_timeout(self) -> None:
        self._read_deadline.clear()

    def _on_read_timeout(self) -> None:
        into = self.body_into
        if into is not None:
            into.failed(aiohttp.SocketTimeoutError("Timeout on reading data from socket"), restore=True)
        super()._on_read_timeout()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._read_deadline.cancel()


def install_protocol(pool: aiohttp.BaseConnector) -> None:
    """The pool's new connections use ``_Connection`` (upstream_protocol; aiohttp's own protocol otherwise)."""
    if FAST.upstream_protocol:
        pool._factory = functools.partial(_Connection, loop=asyncio.get_running_loop())  # type: ignore[assignment]


# --- a body read straight into the gateway's buffers (proxy/core.py's UpstreamBody.read_whole) --------------------

# The buffers a body is read into: as large as uvloop's reads, so that one read's bytes are handed on at a time (each
# between the event loop's other work), and below glibc's mmap threshold (ops/heap.py), so that their memory is the
# heap's, used again for the next body instead of mapped and faulted in anew.
BODY_PIECE = 256 * 1024


def _buffer_maker() -> Callable[[int], bytearray]:
    """A bytearray of n bytes left as malloc gives them (the kernel writes every byte before anything reads one):
    ``bytearray(n)`` would first write zeros over the memory, a pass over the whole body for nothing. CPython's own
    ``PyByteArray_FromStringAndSize(NULL, n)``; ``bytearray`` where it cannot be called."""
    try:
        make = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except AttributeError:
        return bytearray
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    return lambda n: make(None, n)


_new_buffer = _buffer_maker()


class _BodyInto(asyncio.BufferedProtocol):
    """The rest of one response body of known length, in the connection's place on the transport: the kernel copies
    the bytes straight into buffers of ``BODY_PIECE`` (none of the two copies of the connection's own road: uvloop's
    bytes for each read, then the response parser's for the body's part of it), and each buffer, once full, is handed
    to ``each``. The connection takes the transport back at the body's end."""

    def __init__(self, connection: _Connection, payload: StreamReader, remaining: int,
                 each: Callable[[bytearray], object] | None, done: asyncio.Future[None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.pieces: list[bytearray] = []
        self._connection = connection
        self._payload = payload
        self._remaining = remaining
        self._each = each
        self._done = done
        self._loop = loop
        self._buffer: bytearray | None = None
        self._at = 0
        self._over = False
        self._paused: asyncio.Transport | None = None  # the transport while its reading waits for the next turn

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = self._buffer
        if buffer is None:
            buffer = self._buffer = _new_buffer(min(BODY_PIECE, self._remaining))
            self._at = 0
        return memoryview(buffer)[self._at :]

    def buffer_updated(self, nbytes: int) -> None:
        buffer = self._buffer
        assert buffer is not None
        self._at += nbytes
        self._remaining -= nbytes
        if self._at == len(buffer):
            self._buffer = None
            self.pieces.append(buffer)
            if self._each is not None:
                try:
                    self._each(buffer)
                except Exception as exc:  # a reader's bug: the gateway's own failure, not the upstream's
                    self.failed(exc, restore=True)
                    return
            if self._remaining:
                self._next_turn()
        if self._remaining:
            self._connection._reschedule_timeout()
            return
        self._end()
        self._payload.feed_eof()
        if not self._done.done():
            self._done.set_result(None)

    def _next_turn(self) -> None:
        """One piece a turn of the event loop: libuv reads on while each read fills its buffer (up to 32 reads, 8 MiB
        here, in one callback) where the selector loop reads once, so a body arriving faster than it is scanned would
        hold the loop for milliseconds and every other connection's request with it. The transport's reading pauses
        after each full piece and resumes on the loop's next turn, after what the other connections had ready."""
        transport = self._connection.transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()
            self._paused = transport
            self._loop.call_soon(self._resume)

    def _resume(self) -> None:
        transport, self._paused = self._paused, None
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def eof_received(self) -> bool | None:
        self.failed(aiohttp.ClientPayloadError("Response payload is not completed: the upstream closed the "
                                               "connection part way through the body"), restore=False)
        self._connection.eof_received()
        return None  # the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self.failed(aiohttp.ClientPayloadError(f"Response payload is not completed: {exc!r}"), restore=False)
        self._connection.connection_lost(exc)

    def pause_writing(self) -> None:
        self._connection.pause_writing()

    def resume_writing(self) -> None:
        self._connection.resume_writing()

    def failed(self, exc: BaseException, *, restore: bool) -> None:
        """The body cannot be read to its end: the connection (to be closed) takes the transport back when it is
        still open (``restore``), and the reader gets ``exc``."""
        if self._over:
            return
        if restore:
            self._end()
        else:
            self._over = True
            self._connection.body_into = None
        self._connection.set_exception(exc)
        if not self._done.done():
            self._done.set_exception(exc)

    def _end(self) -> None:
        self._over = True
        connection = self._connection
        connection.body_into = None
        connection._drop_timeout()
        # The parser still waits for the body it did not see: the next response on the connection gets a new one
        # (``UpstreamRoads._prepared``), and whatever might arrive before that is kept aside, not parsed.
        connection._parser = None
        transport = connection.transport
        if transport is not None and not transport.is_closing():
            transport.set_protocol(connection)
        self._resume()  # (given back reading, as it was taken)


async def read_body_into(response: BodylessResponse, length: int, each: Callable[[bytes | bytearray], object] | None
                         ) -> list[bytes | bytearray] | None:
    """The whole body of ``response``, of ``length`` bytes (its Content-Length), as pieces: what the connection's
    parser had already received, then the rest read straight into buffers (``_BodyInto``), each piece handed to
    ``each`` as it comes. None when this road does not read it (the path is off, the response is not on one of the
    pool's ``_Connection``s, or less than a piece of it is still to come): read it from ``response.content``. A
    failure part way raises as the payload's read would (``ClientPayloadError``, a timeout), and the connection is
    then closed by ``release``."""
    protocol = response._protocol
    payload = response.content
    if not FAST.upstream_body_into or not isinstance(protocol, _Connection) or protocol.body_into is not None \
            or length - payload.total_bytes < BODY_PIECE:
        # (Less than a piece still to come: not worth taking the transport over, twice.)
        return None
    pieces: list[bytes | bytearray] = []
    while payload._buffer:
        # The chunks the parser made before this read: taken as they are (resuming the transport if they had paused
        # it), no await until the transport is taken over, so that the parser gets no more of the body.
        piece = payload._read_nowait_chunk(-1)
        pieces.append(piece)
        if each is not None:
            each(piece)
    error = payload.exception()
    if error is not None:
        raise error
    remaining = length - payload.total_bytes
    if payload.is_eof() or remaining <= 0:
        return pieces
    transport = protocol.transport
    if transport is None or transport.is_closing():
        raise aiohttp.ClientPayloadError("Response payload is not completed: the connection is closed")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    into = _BodyInto(protocol, payload, remaining, each, done, loop)
    protocol.body_into = into
    transport.set_protocol(into)
    protocol._reschedule_timeout()
    try:
        await done
    except asyncio.CancelledError:
        into.failed(aiohttp.ClientPayloadError("Response payload is not completed: the read was cancelled"),
                    restore=True)
        raise
    pieces += into.pieces
    return pieces


class Attempt:
    """One attempt at an upstream request: ``sent`` is set once its head was handed to the connection (nothing of a
    request whose head was not left the gateway). Unset until then: read it with ``getattr(attempt, "sent", False)``
    (no ``__init__``: one is made for every request)."""

    __slots__ = ("sent",)
    sent: bool


class BodylessResponse:
    """The response to a request without a body: the parser's message and payload, and the pooled connection it came
    on (given back once, by ``release`` or ``close``)."""

    __slots__ = ("status", "reason", "headers", "content", "_pool", "_key", "_protocol")

    def __init__(self, message: RawResponseMessage, payload: StreamReader, pool: aiohttp.BaseConnector,
                 key: ConnectionKey, protocol: client_proto.ResponseHandler) -> None:
        self.status = message.code
        self.reason: str | None = message.reason
        self.headers: CIMultiDictProxy[str] = message.headers
        self.content = payload
        self._pool = pool
        self._key = key
        self._protocol: client_proto.ResponseHandler | None = protocol

    def release(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            # Back to the pool; closed instead when the body was not read to its end (protocol.should_close).
            self._pool._release(self._key, protocol)

    def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            self._pool._release(self._key, protocol, should_close=True)

    async def read(self) -> bytes:
        """The whole body (as ``ClientResponse.read``)."""
        return await self.content.read()


def _pooled(pool: aiohttp.BaseConnector, key: ConnectionKey) -> client_proto.ResponseHandler | None:
    """A kept-alive connection from the connector's pool, taken as ``BaseConnector._get`` takes one (still connected,
    idle for less than the keep-alive timeout; counted as acquired, so the pool's limit holds), without its coroutine
    and its ``Connection`` object: it is given back with ``BaseConnector._release``."""
    conns = pool._conns.get(key)
    if not conns:
        return None
    now = time.monotonic()
    keepalive = pool._keepalive_timeout
    while conns:
        protocol, idle_since = conns.popleft()
        if protocol.is_connected() and (keepalive is None or now - idle_since <= keepalive):
            if not conns:
                del pool._conns[key]
            pool._acquired.add(protocol)
            if pool._limit_per_host:
                pool._acquired_per_host[key].add(protocol)
            return protocol
        protocol.close()
    del pool._conns[key]
    return None


def _detached(connection: connector.Connection) -> client_proto.ResponseHandler:
    """A new connection's protocol, without its ``Connection`` (which would give it back when collected): still
    counted as acquired until ``BaseConnector._release``."""
    protocol = connection._protocol
    assert protocol is not None
    connection._protocol = None
    return protocol


def _write_head(protocol: client_proto.ResponseHandler, head: bytes) -> None:
    transport = protocol.transport
    if transport is None or transport.is_closing():
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    transport.write(head)


class _Origin:
    """One upstream origin (scheme, userinfo, host, port), as bodyless requests to it need it: the request the
    connector keys its pool by (and opens new connections for), and the Basic credentials of its userinfo, which
    aiohttp sends in place of the client's ``Authorization`` (docs/configuration.md, ``upstream``)."""

    __slots__ = ("key_request", "key", "authorization", "request_info", "path")

    def __init__(self, url: URL, session: aiohttp.ClientSession, version: aiohttp.HttpVersion) -> None:
        """``url``: a base URL with "/" appended."""
        # The base URL's path (``http://host/base``), which a request target's path is appended to.
        self.path = url.raw_path[:-1]
        self.key_request = _ProxiedRequest(
            "GET", url, headers=CIMultiDict(((istr("Host"), url.host_port_subcomponent or ""),)),
            loop=asyncio.get_running_loop(), timer=_NO_TIMER, session=session, version=version,
        )
        self.key = self.key_request.connection_key
        self.authorization = self.key_request.headers.get(_AUTHORIZATION)
        origin = url.origin()  # no userinfo
        self.request_info = aiohttp.RequestInfo(origin, "GET", CIMultiDictProxy(CIMultiDict()), origin)


async def _connect(pool: aiohttp.BaseConnector, request: aiohttp.ClientRequest,
                   timeout: aiohttp.ClientTimeout) -> connector.Connection:
    try:
        return await pool.connect(request, traces=[], timeout=timeout)
    except TimeoutError as err:
        # The origin only: the target's query (a signed link) must not reach a log line through this text.
        raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {request.url.origin()}") from err


class UpstreamRoads:
    """The upstream client's fast roads over one session's pool, one attempt each (the retry policy is the caller's):
    ``send`` drives aiohttp's ``ClientRequest`` directly, as ``ClientSession._request`` would, without its per-call
    machinery (redirects, cookies, traces, a total timeout, middlewares) and its header merging (which folds lines
    that differ only in case); ``send_bodyless`` writes a bodyless request's head itself, in one write, and reads
    the response straight from aiohttp's connection protocol."""

    def __init__(self, session: aiohttp.ClientSession, *, max_field_size: int) -> None:
        self._session = session
        self._max_field_size = max_field_size
        self._version = aiohttp.HttpVersion(*session.version)
        self._origins: dict[str, _Origin] = {}

    def _prepared(self, protocol: client_proto.ResponseHandler, method: str) -> None:
        skip_payload = method in _NO_RESPONSE_BODY
        if isinstance(protocol, _Connection) and protocol.parser_skips_payload is skip_payload \
                and protocol._parser is not None:
            # The parser that read the previous response on this connection, made with the same settings, reads the
            # next one (aiohttp's server reads every request of a connection with one parser): a connection given
            # back to the pool has read its last response to the end and holds nothing more.
            return
        protocol.set_response_params(
            timer=_NO_TIMER,
            skip_payload=skip_payload,
            read_until_eof=True,
            auto_decompress=False,
            read_timeout=self._session.timeout.sock_read,
            read_bufsize=READ_BUFSIZE,
            timeout_ceil_threshold=TIMEOUT_CEIL_THRESHOLD,
            max_line_size=MAX_LINE_SIZE,
            max_field_size=self._max_field_size,
            max_headers=MAX_HEADERS,
        )

    def _origin(self, base: str) -> _Origin:
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = _Origin(URL(base + "/", encoded=True), self._session, self._version)
        return origin

    async def send_bodyless(self, method: str, base: str, target: str, headers: CIMultiDict[str],
                            body: AsyncIterable[bytes] | None, attempt: Attempt) -> BodylessResponse:
        assert body is None
        origin = self._origins.get(base) or self._origin(base)
        # What aiohttp's ClientRequest would add: the upstream's Basic credentials, and a zero length for a method
        # other than GET, HEAD, OPTIONS and TRACE.
        length = method not in _GET_METHODS and _CONTENT_LENGTH not in headers
        if origin.authorization is not None or length:
            headers = CIMultiDict(headers)
            if origin.authorization is not None:
                headers[_AUTHORIZATION] = origin.authorization
            if length:
                headers[_CONTENT_LENGTH] = "0"
        # aiohttp's own serialisation (C): a CR or LF in a name or value is refused, never written.
        head = http_writer._serialize_headers(f"{method} {origin.path}{target} HTTP/1.1", headers)
        pool = self._session.connector
        assert pool is not None
        protocol = _pooled(pool, origin.key)
        if protocol is None:
            protocol = _detached(await _connect(pool, origin.key_request, self._session.timeout))
        try:
            self._prepared(protocol, method)
            _write_head(protocol, head)
            attempt.sent = True
            protocol.start_timeout()
            while True:
                try:
                    message, payload = await protocol.read()
                except HttpProcessingError as err:
                    raise aiohttp.ClientResponseError(origin.request_info, (), status=err.code,
                                                      message=err.message, headers=err.headers) from err
                # Interim answers (1xx but 101) are read past, as aiohttp's ClientResponse does.
                if not 100 <= message.code <= 199 or message.code == 101:
                    return BodylessResponse(message, payload, pool, origin.key, protocol)
        except BaseException:
            pool._release(origin.key, protocol, should_close=True)
            raise

    async def send(self, method: str, base: str, target: str, headers: CIMultiDict[str],
                   body: AsyncIterable[bytes] | None, attempt: Attempt) -> aiohttp.ClientResponse:
        session = self._session
        pool = session.connector
        assert pool is not None
        request = _ProxiedRequest(method, URL(base + target, encoded=True), headers=headers, data=body,
                                  loop=asyncio.get_running_loop(), timer=_NO_TIMER, session=session,
                                  version=self._version)
        connection = await _connect(pool, request, session.timeout)
        protocol = connection.protocol
        assert protocol is not None
        self._prepared(protocol, method)
        try:
            response = await request.send(connection)
            attempt.sent = True
            try:
                await response.start(connection)
            except BaseException:
                response.close()
                raise
        except BaseException:
            connection.close()
            raise
        return response


# Decided once, at import: what this aiohttp has, and what the environment forces off.
FAST = decide(os.environ, _detect())
