"""The client side of the proxy: one session's pooled connections to the upstreams, and one road for every request
(``UpstreamClient.request``: the headers exactly as the proxy core built them, with or without a body), with one
retry policy (``unsent``, ``safe_method``: docs/configuration.md, ``upstream.retry_safe_methods``). The private
aiohttp API it relies on, and why, is listed and checked in ``server.aiohttp_private``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable

import aiohttp
from aiohttp.helpers import TimerNoop
from aiohttp.typedefs import LooseHeaders
from multidict import CIMultiDict, istr
from yarl import URL

from ..config.upstream import UpstreamConfig

__all__ = ("UpstreamClient",)

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


class UpstreamClient:
    """Sends the proxied requests over the pooled connections of one session."""

    def __init__(self, session: aiohttp.ClientSession, *, max_field_size: int, retry_safe_methods: bool = True) -> None:
        self.session = session
        self._max_field_size = max_field_size
        self._retry_safe_methods = retry_safe_methods
        self._version = aiohttp.HttpVersion(*session.version)

    @classmethod
    def open(cls, config: UpstreamConfig, *, max_field_size: int) -> UpstreamClient:
        connector = aiohttp.TCPConnector(
            limit=config.pool_size,
            keepalive_timeout=config.keepalive_timeout,
            ttl_dns_cache=60,
            timeout_ceil_threshold=_TIMEOUT_CEIL_THRESHOLD,
        )
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

    async def request(
        self, method: str, url: URL, headers: CIMultiDict[str], body: AsyncIterable[bytes] | None,
        retried: list[str] | None = None,
    ) -> aiohttp.ClientResponse:
        """The upstream's response, its head read and its body still streaming; raises aiohttp's client errors.

        At most one retry, its reason appended to ``retried``: ``unsent`` when the pooled connection failed before
        any byte of the request left (the head's write failed at once, or a body failed before it was first read,
        which is when the head is written): the upstream cannot have seen it, so it goes again on a new connection
        whatever its method; ``safe_method`` when the connection broke after the request was written but before the
        response head (a kept-alive connection the upstream closed as it was reused): only a GET, HEAD, OPTIONS or
        TRACE without a body, and only with ``retry_safe_methods``. The request is written as
        ``ClientSession._request`` would, without its per-call machinery (redirects, cookies, traces, a total
        timeout: more CPU than the rest of a small request) and its header merging (which folds lines that differ
        only in case)."""
        session = self.session
        if session.closed:
            raise RuntimeError("the upstream session is closed")
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
                try:
                    connection = await connector.connect(request, traces=[], timeout=timeout)
                except asyncio.TimeoutError as err:
                    # The origin only: the target's query (a signed link) must not reach a log line through this text.
                    raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {request.url.origin()}") from err
                protocol = connection.protocol
                assert protocol is not None
                protocol.set_response_params(
                    timer=_NO_TIMER,
                    skip_payload=method in _NO_RESPONSE_BODY,
                    read_until_eof=True,
                    auto_decompress=False,
                    read_timeout=timeout.sock_read,
                    read_bufsize=_READ_BUFSIZE,
                    timeout_ceil_threshold=_TIMEOUT_CEIL_THRESHOLD,
                    max_line_size=_MAX_LINE_SIZE,
                    max_field_size=self._max_field_size,
                    max_headers=_MAX_HEADERS,
                )
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
            except _NOT_RETRIED:
                raise
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, *_UNSENT) as err:
                unsent = not sent or (tracked is not None and not tracked.started)
                if attempts or not (unsent or retry_safe):
                    if isinstance(err, aiohttp.ClientError):
                        raise
                    raise aiohttp.ClientOSError(*err.args) from err
                attempts += 1
                if retried is not None:
                    retried.append("unsent" if unsent else "safe_method")
            except aiohttp.ClientError:
                raise
            except OSError as err:
                if err.errno is None and isinstance(err, asyncio.TimeoutError):
                    raise
                raise aiohttp.ClientOSError(*err.args) from err
