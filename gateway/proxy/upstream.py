"""The client side of the proxy: one session's pooled connections to the upstreams, and one road for every request
(``UpstreamClient.request``: the headers exactly as the proxy core built them, with or without a body), with one
retry policy (``unsent``, ``safe_method``: docs/configuration.md, ``upstream.retry_safe_methods``). The roads that
reach under aiohttp's public API are in ``core.aiohttp_fast``; here is the public one, used when they are off."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable, AsyncIterator
from typing import NoReturn, Protocol

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from ..config.upstream import UpstreamConfig
from ..core import aiohttp_fast
from ..core.aiohttp_fast import Attempt

__all__ = ("Response", "UpstreamClient")

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
_AUTHORIZATION = istr("Authorization")
_EXPECT = istr("Expect")
# Only what the client sent goes upstream: on the public road, none of the headers aiohttp adds by default.
_NOT_ADDED = tuple(sorted({*aiohttp_fast.SKIP_AUTO_HEADERS, *map(str, aiohttp.ClientRequest.DEFAULT_HEADERS)}))


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
    ``ClientResponse`` and ``aiohttp_fast.BodylessResponse`` are both one."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content(self) -> aiohttp.StreamReader: ...

    def release(self) -> object:
        """The connection back to the pool if the body was read to its end; closed otherwise."""

    def close(self) -> None:
        """The connection closed, whatever was read."""


def _sent_again_or_raise(err: BaseException, attempts: int, unsent: bool, retry_safe: bool,
                         retried: list[str] | None) -> None:
    """The retry policy (``UpstreamClient.request``) on a failed attempt: returns when the request goes once more (its
    reason appended to ``retried``); raises the failure otherwise, as one of aiohttp's client errors."""
    if isinstance(err, _NOT_RETRIED):
        raise err
    retriable = isinstance(err, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, *_UNSENT))
    if not retriable or attempts or not (unsent or retry_safe):
        _raise_as_client_error(err)
    if retried is not None:
        retried.append("unsent" if unsent else "safe_method")


def _unsent(attempt: Attempt, tracked: _Tracked | None) -> bool:
    """Whether no byte of a failed attempt's request left: its head was not written, or its body never read."""
    return not getattr(attempt, "sent", False) or (tracked is not None and not tracked.started)


def _raise_as_client_error(err: BaseException) -> NoReturn:
    """``err`` raised as one of aiohttp's client errors: an OS error (but a timeout of asyncio's) as ClientOSError."""
    if isinstance(err, aiohttp.ClientError) or not isinstance(err, OSError) or (
            err.errno is None and isinstance(err, asyncio.TimeoutError)):
        raise err
    raise aiohttp.ClientOSError(*err.args) from err


class _Escaped(aiohttp.ClientError):
    """One attempt's failure carried out of ``ClientSession.request`` past its own retry (the gateway's applies)."""

    def __init__(self, err: Exception) -> None:
        super().__init__()
        self.err = err


def _as_built(built: CIMultiDict[str], headers: CIMultiDict[str], credentials: bool) -> CIMultiDict[str]:
    """The headers the proxy core built (``headers``), with what aiohttp added to them (``built``: the body's
    framing, the upstream's Basic credentials in place of the client's ``Authorization``): the session folded lines
    whose names differ only in case, and its road would have sent them folded."""
    restored = CIMultiDict(headers)
    for name, value in built.items():
        if name not in headers:
            restored.add(name, value)
    if credentials:
        restored[_AUTHORIZATION] = built[_AUTHORIZATION]
    return restored


async def _one_attempt(headers: CIMultiDict[str], credentials: bool, request: aiohttp.ClientRequest,
                       handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
    """The public road's middleware: the request sent with the proxy core's headers, once."""
    request.headers = _as_built(request.headers, headers, credentials)
    try:
        return await handler(request)
    except aiohttp.ConnectionTimeoutError as err:
        # The origin only (ClientSession's text has the whole URL): a signed link's query must not reach a log line.
        timeout = aiohttp.ConnectionTimeoutError(f"Connection timeout to host {request.url.origin()}")
        timeout.__cause__ = err.__cause__
        raise _Escaped(timeout) from err
    except Exception as err:
        raise _Escaped(err) from err


class UpstreamClient:
    """Sends the proxied requests over the pooled connections of one session."""

    def __init__(self, session: aiohttp.ClientSession, *, max_field_size: int, retry_safe_methods: bool = True) -> None:
        self.session = session
        self._max_field_size = max_field_size
        self._retry_safe_methods = retry_safe_methods
        fast = aiohttp_fast.FAST
        roads = aiohttp_fast.UpstreamRoads(session, max_field_size=max_field_size)
        self._send = roads.send if fast.upstream_request else self._public
        self._send_bodyless = roads.send_bodyless if fast.upstream_bodyless else self._send

    @classmethod
    def open(cls, config: UpstreamConfig, *, max_field_size: int) -> UpstreamClient:
        connector = aiohttp.TCPConnector(
            limit=config.pool_size,
            keepalive_timeout=config.keepalive_timeout,
            ttl_dns_cache=60,
            timeout_ceil_threshold=aiohttp_fast.TIMEOUT_CEIL_THRESHOLD,
        )
        aiohttp_fast.install_protocol(connector)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=aiohttp_fast.SKIP_AUTO_HEADERS,
        )
        return cls(session, max_field_size=max_field_size, retry_safe_methods=config.retry_safe_methods)

    async def close(self) -> None:
        await self.session.close()

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

        The roads (one attempt each) are ``core.aiohttp_fast``'s when its fast paths are on: a request without a body
        written by the gateway itself, one with a body by aiohttp's ``ClientRequest`` driven directly; otherwise
        ``ClientSession.request`` (``_public``), which sends the same bytes."""
        if self.session.closed:
            raise RuntimeError("the upstream session is closed")
        tracked = _Tracked(body) if body is not None else None
        send = self._send_bodyless if tracked is None and _EXPECT not in headers else self._send
        retry_safe = self._retry_safe_methods and tracked is None and method in _SAFE
        attempts = 0
        while True:
            attempt = Attempt()
            try:
                return await send(method, base, target, headers, tracked, attempt)
            except (aiohttp.ClientError, OSError) as err:
                _sent_again_or_raise(err, attempts, _unsent(attempt, tracked), retry_safe, retried)
                attempts += 1

    async def _public(self, method: str, base: str, target: str, headers: CIMultiDict[str],
                      body: AsyncIterable[bytes] | None, attempt: Attempt) -> aiohttp.ClientResponse:
        """One attempt through ``ClientSession.request``: its own retry and its header merging undone by
        ``_one_attempt``. A failed write of the head (to a connection the upstream had closed) is the one failure
        that raises ``ClientConnectionResetError`` before the request left."""
        url = URL(base + target, encoded=True)
        credentials = aiohttp.BasicAuth.from_url(url) is not None
        given = headers
        if credentials and _AUTHORIZATION in headers:
            # The session refuses a client's Authorization beside the URL's credentials; they replace it below.
            given = headers.copy()
            del given[_AUTHORIZATION]
        try:
            response = await self.session.request(
                method, url, headers=given, data=body, skip_auto_headers=_NOT_ADDED,
                allow_redirects=False, auto_decompress=False, read_bufsize=aiohttp_fast.READ_BUFSIZE,
                max_line_size=aiohttp_fast.MAX_LINE_SIZE, max_field_size=self._max_field_size,
                max_headers=aiohttp_fast.MAX_HEADERS,
                middlewares=(functools.partial(_one_attempt, headers, credentials),),
            )
        except _Escaped as escaped:
            err = escaped.err
        else:
            attempt.sent = True
            return response
        attempt.sent = not isinstance(err, aiohttp.ClientConnectionResetError)
        raise err
