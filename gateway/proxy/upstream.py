"""The client side of the proxy: one session's pooled connections to the upstreams, and one road for every request
(``UpstreamClient.request``: the headers exactly as the proxy core built them, with or without a body), with one
retry policy (``unsent``, ``safe_method``: docs/configuration.md, ``upstream.retry_safe_methods``). The private
aiohttp API it relies on, and why, is listed and checked in ``server.aiohttp_private``."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any, Protocol

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.connector import Connection
from aiohttp.helpers import TimerNoop
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawResponseMessage
from aiohttp.http_writer import _serialize_headers
from aiohttp.streams import StreamReader
from aiohttp.typedefs import LooseHeaders
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from ..config.upstream import UpstreamConfig
from ..core.deadline import Deadline

__all__ = ("Response", "UpstreamClient")

# Only what the client sent goes upstream: no default User-Agent, Accept or Content-Type.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_READ_BUFSIZE = 256 * 1024
_MAX_LINE_SIZE = 8190
_MAX_HEADERS = 128
_TIMEOUT_CEIL_THRESHOLD = 5.0
# Sent once more when the connection broke after the request was written but before the response head (RFC 9110 9.2.1).
_SAFE = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# What writing to a connection the upstream had already closed raises.
_UNSENT = (aiohttp.ClientConnectionResetError, ConnectionResetError, BrokenPipeError)
# Failures to reach the upstream at all: nothing was sent, and a second try would fail alike.
_NOT_RETRIED = (
    aiohttp.ConnectionTimeoutError,
    aiohttp.ClientConnectorError,
    aiohttp.ClientConnectorCertificateError,
    aiohttp.ClientConnectorSSLError,
)
_NO_TIMER = TimerNoop()
_GET_METHODS = frozenset(aiohttp.ClientRequest.GET_METHODS)
_CONTENT_LENGTH = istr("Content-Length")
_AUTHORIZATION = istr("Authorization")
_EXPECT = istr("Expect")
# Methods whose response has no body to read (ClientSession: EMPTY_BODY_METHODS).
_NO_RESPONSE_BODY = frozenset({"HEAD"})


class _ProxiedRequest(aiohttp.ClientRequest):
    """aiohttp's request, taking the proxy core's headers as they are.

    They come with their Host first, as aiohttp would put it; and every header aiohttp would add on its own is in
    the skip list (checked below), so none is added.
    """

    def update_headers(self, headers: LooseHeaders | None) -> None:
        assert isinstance(headers, CIMultiDict) and "Host" in headers
        self.headers = CIMultiDict(headers)

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        self._skip_auto_headers = _SKIPPED


_SKIPPED: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(istr(n) for n in _SKIP_AUTO_HEADERS))
if not {istr(name) for name in (*aiohttp.ClientRequest.DEFAULT_HEADERS, "User-Agent")} <= set(_SKIPPED):
    raise RuntimeError("this aiohttp adds request headers the gateway does not skip: review gateway/proxy/upstream.py")


class _Connection(ResponseHandler):
    """aiohttp's client connection protocol, with its read timeout (``upstream.read_timeout``) kept as a ``Deadline``
    (one timer per connection) instead of a new timer for each piece read and each request."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._read_deadline = Deadline(loop, self._on_read_timeout)
        self.parser_skips_payload: bool | None = None  # the setting the parser in place was made with

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

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._read_deadline.cancel()


class _Tracked:
    """A request body that knows whether it was first read (its head is written with its first bytes)."""

    __slots__ = ("_body", "started")

    def __init__(self, body: AsyncIterable[bytes]) -> None:
        self._body = body
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for chunk in self._body:
            yield chunk


class Response(Protocol):
    """An upstream response as the proxy core reads it: its head, and its body still streaming. aiohttp's
    ``ClientResponse`` (a request with a body) and ``BodylessResponse`` (one without) are both one."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content(self) -> StreamReader: ...

    def release(self) -> object:
        """The connection back to the pool if the body was read to its end; closed otherwise."""

    def close(self) -> None:
        """The connection closed, whatever was read."""


class BodylessResponse:
    """The response to a request without a body: the parser's message and payload, and the pooled connection it came
    on (given back once, by ``release`` or ``close``)."""

    __slots__ = ("status", "reason", "headers", "content", "_pool", "_key", "_protocol")

    def __init__(self, message: RawResponseMessage, payload: StreamReader, pool: aiohttp.BaseConnector,
                 key: ConnectionKey, protocol: ResponseHandler) -> None:
        self.status = message.code
        self.reason: str | None = message.reason
        self.headers: CIMultiDictProxy[str] = message.headers
        self.content = payload
        self._pool = pool
        self._key = key
        self._protocol: ResponseHandler | None = protocol

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


def _pooled(connector: aiohttp.BaseConnector, key: ConnectionKey) -> ResponseHandler | None:
    """A kept-alive connection from the connector's pool, taken as ``BaseConnector._get`` takes one (still connected,
    idle for less than the keep-alive timeout; counted as acquired, so the pool's limit holds), without its coroutine
    and its ``Connection`` object: it is given back with ``BaseConnector._release``."""
    conns = connector._conns.get(key)
    if not conns:
        return None
    now = time.monotonic()
    keepalive = connector._keepalive_timeout
    while conns:
        protocol, idle_since = conns.popleft()
        if protocol.is_connected() and (keepalive is None or now - idle_since <= keepalive):
            if not conns:
                del connector._conns[key]
            connector._acquired.add(protocol)
            if connector._limit_per_host:
                connector._acquired_per_host[key].add(protocol)
            return protocol
        protocol.close()
    del connector._conns[key]
    return None


def _detached(connection: Connection) -> ResponseHandler:
    """A new connection's protocol, without its ``Connection`` (which would give it back when collected): still
    counted as acquired until ``BaseConnector._release``."""
    protocol = connection._protocol
    assert protocol is not None
    connection._protocol = None
    return protocol


def _sent_again_or_raise(err: BaseException, attempts: int, unsent: bool, retry_safe: bool,
                         retried: list[str] | None) -> None:
    """The retry policy (``UpstreamClient.request``) on a failed attempt: returns when the request goes once more (its
    reason appended to ``retried``); raises the failure otherwise, as one of aiohttp's client errors."""
    if isinstance(err, _NOT_RETRIED):
        raise err
    if isinstance(err, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, *_UNSENT)):
        if attempts or not (unsent or retry_safe):
            if isinstance(err, aiohttp.ClientError):
                raise err
            raise aiohttp.ClientOSError(*err.args) from err
        if retried is not None:
            retried.append("unsent" if unsent else "safe_method")
        return
    if isinstance(err, aiohttp.ClientError) or not isinstance(err, OSError) or (
            err.errno is None and isinstance(err, asyncio.TimeoutError)):
        raise err
    raise aiohttp.ClientOSError(*err.args) from err


def _write_head(protocol: ResponseHandler, head: bytes) -> None:
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
        self.authorization = self.key_request.headers.get(istr("Authorization"))
        origin = url.origin()  # no userinfo
        self.request_info = aiohttp.RequestInfo(origin, "GET", CIMultiDictProxy(CIMultiDict()), origin)


class UpstreamClient:
    """Sends the proxied requests over the pooled connections of one session."""

    def __init__(self, session: aiohttp.ClientSession, *, max_field_size: int, retry_safe_methods: bool = True) -> None:
        self.session = session
        self._max_field_size = max_field_size
        self._retry_safe_methods = retry_safe_methods
        self._version = aiohttp.HttpVersion(*session.version)
        self._origins: dict[str, _Origin] = {}

    @classmethod
    def open(cls, config: UpstreamConfig, *, max_field_size: int) -> UpstreamClient:
        connector = aiohttp.TCPConnector(
            limit=config.pool_size,
            keepalive_timeout=config.keepalive_timeout,
            ttl_dns_cache=60,
            timeout_ceil_threshold=_TIMEOUT_CEIL_THRESHOLD,
        )
        connector._factory = functools.partial(_Connection, loop=asyncio.get_running_loop())  # type: ignore[assignment]
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_AUTO_HEADERS,
        )
        return cls(session, max_field_size=max_field_size, retry_safe_methods=config.retry_safe_methods)

    async def close(self) -> None:
        await self.session.close()

    def _prepared(self, protocol: ResponseHandler, method: str) -> None:
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
            read_timeout=self.session.timeout.sock_read,
            read_bufsize=_READ_BUFSIZE,
            timeout_ceil_threshold=_TIMEOUT_CEIL_THRESHOLD,
            max_line_size=_MAX_LINE_SIZE,
            max_field_size=self._max_field_size,
            max_headers=_MAX_HEADERS,
        )

    async def request(
        self, method: str, url: URL, headers: CIMultiDict[str], body: AsyncIterable[bytes] | None,
        retried: list[str] | None = None,
    ) -> Response:
        """``request_to`` for a caller that holds a whole URL."""
        base = str(url.with_path("").with_query(None).with_fragment(None))
        return await self.request_to(method, base, url.raw_path_qs, headers, body, retried)

    async def request_to(
        self, method: str, base: str, target: str, headers: CIMultiDict[str], body: AsyncIterable[bytes] | None,
        retried: list[str] | None = None,
    ) -> Response:
        """The upstream's response to ``method`` ``base`` + ``target``, its head read and its body still streaming;
        raises aiohttp's client errors. ``base``: an upstream's base URL as the config writes it
        (``Tenant.upstream_prefix``); ``target``: a percent-encoded path and its query. The proxy core's way: it makes
        no URL of its own for a request without a body.

        At most one retry, its reason appended to ``retried``: ``unsent`` when the pooled connection failed before
        any byte of the request left (the head's write failed at once, or a body failed before it was first read,
        which is when the head is written): the upstream cannot have seen it, so it goes again on a new connection
        whatever its method; ``safe_method`` when the connection broke after the request was written but before the
        response head (a kept-alive connection the upstream closed as it was reused): only a GET, HEAD, OPTIONS or
        TRACE without a body, and only with ``retry_safe_methods``.

        A request without a body is written by the gateway itself, its head in one write, and its response read
        straight from aiohttp's connection protocol; one with a body is aiohttp's ``ClientRequest``, written as
        ``ClientSession._request`` would, without its per-call machinery (redirects, cookies, traces, a total
        timeout) and its header merging (which folds lines that differ only in case)."""
        if self.session.closed:
            raise RuntimeError("the upstream session is closed")
        if body is not None or _EXPECT in headers:
            return await self._with_body(method, URL(base + target, encoded=True), headers, body, retried)
        origin = self._origins.get(base) or self._origin(base)
        return await self._bodyless(method, origin, origin.path + target, headers, retried)

    def _origin(self, base: str) -> _Origin:
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = _Origin(URL(base + "/", encoded=True), self.session, self._version)
        return origin

    async def _bodyless(self, method: str, origin: _Origin, target: str, headers: CIMultiDict[str],
                        retried: list[str] | None) -> BodylessResponse:
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
        head = _serialize_headers(f"{method} {target} HTTP/1.1", headers)
        connector = self.session.connector
        assert connector is not None
        timeout = self.session.timeout
        retry_safe = self._retry_safe_methods and method in _SAFE
        attempts = 0
        while True:
            sent = False
            try:
                protocol = _pooled(connector, origin.key)
                if protocol is None:
                    protocol = _detached(await self._connect(connector, origin.key_request, timeout))
                try:
                    self._prepared(protocol, method)
                    _write_head(protocol, head)
                    sent = True
                    protocol.start_timeout()
                    while True:
                        try:
                            message, payload = await protocol.read()
                        except HttpProcessingError as err:
                            raise aiohttp.ClientResponseError(origin.request_info, (), status=err.code,
                                                              message=err.message, headers=err.headers) from err
                        # Interim answers (1xx but 101) are read past, as aiohttp's ClientResponse does.
                        if not 100 <= message.code <= 199 or message.code == 101:
                            return BodylessResponse(message, payload, connector, origin.key, protocol)
                except BaseException:
                    connector._release(origin.key, protocol, should_close=True)
                    raise
            except (aiohttp.ClientError, OSError) as err:
                _sent_again_or_raise(err, attempts, not sent, retry_safe, retried)
                attempts += 1

    @staticmethod
    async def _connect(connector: aiohttp.BaseConnector, request: aiohttp.ClientRequest,
                       timeout: aiohttp.ClientTimeout) -> Connection:
        try:
            return await connector.connect(request, traces=[], timeout=timeout)
        except asyncio.TimeoutError as err:
            # The origin only: the target's query (a signed link) must not reach a log line through this text.
            raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {request.url.origin()}") from err

    async def _with_body(self, method: str, url: URL, headers: CIMultiDict[str], body: AsyncIterable[bytes] | None,
                         retried: list[str] | None) -> aiohttp.ClientResponse:
        session = self.session
        connector = session.connector
        assert connector is not None
        timeout = session.timeout
        loop = asyncio.get_running_loop()
        tracked = _Tracked(body) if body is not None else None
        retry_safe = self._retry_safe_methods and body is None and method in _SAFE
        attempts = 0
        while True:
            request = _ProxiedRequest(
                method,
                url,
                headers=headers,
                data=tracked,
                loop=loop,
                timer=_NO_TIMER,
                session=session,
                version=self._version,
            )
            sent = False
            try:
                connection = await self._connect(connector, request, timeout)
                protocol = connection.protocol
                assert protocol is not None
                self._prepared(protocol, method)
                try:
                    response = await request.send(connection)
                    sent = True
                    try:
                        await response.start(connection)
                    except BaseException:
                        response.close()
                        raise
                except BaseException:
                    connection.close()
                    raise
                return response
            except (aiohttp.ClientError, OSError) as err:
                unsent = not sent or (tracked is not None and not tracked.started)
                _sent_again_or_raise(err, attempts, unsent, retry_safe, retried)
                attempts += 1
