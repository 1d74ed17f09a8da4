"""The client side of the proxy: aiohttp's pooled connections to the upstreams, and a short road for bodyless requests.

``ClientSession.request`` runs generic machinery on every call (argument merging, redirects, cookies, proxies,
traces, middlewares, a total timeout) that costs more CPU than the rest of a small proxied request. The session
the gateway builds uses none of it, so a request without a body goes straight to the session's connector: a
pooled connection, the request head written, the response head read, as ``ClientSession._request`` does it, with
its one retry of an idempotent request whose connection the upstream closed, and its error types. A request with
a body (aiohttp decides whether it can be replayed) and every request on a session handed in from outside go
through ``ClientSession.request``.

It leans on aiohttp internals (``ClientRequest.send``, ``ClientResponse.start``, ``set_response_params``): pinned
in requirements.lock, and covered by the proxy tests, which run every bodyless request through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Iterable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.helpers import TimerNoop
from aiohttp.typedefs import LooseHeaders
from multidict import CIMultiDict, istr
from yarl import URL

if TYPE_CHECKING:
    from ..config import UpstreamConfig

__all__ = ("UpstreamClient",)

# Only what the client sent goes upstream: no default User-Agent, Accept or Content-Type.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_READ_BUFSIZE = 256 * 1024
# aiohttp's defaults, given explicitly so both roads use the same values.
_MAX_LINE_SIZE = 8190
_MAX_HEADERS = 128
_TIMEOUT_CEIL_THRESHOLD = 5.0
# What ClientSession retries once when a connection fails (aiohttp.client.IDEMPOTENT_METHODS).
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# aiohttp.ClientSession._request does not retry these: the upstream could not be reached at all.
_NOT_RETRIED = (
    aiohttp.ConnectionTimeoutError,
    aiohttp.ClientConnectorError,
    aiohttp.ClientConnectorCertificateError,
    aiohttp.ClientConnectorSSLError,
)
_NO_TIMER = TimerNoop()


class _BodylessRequest(aiohttp.ClientRequest):
    """aiohttp's request, taking the proxy core's headers as they are.

    They come with their Host first, as aiohttp would put it; and every header aiohttp would add on its own is in
    the session's skip list (checked below), so none is added.
    """

    def update_headers(self, headers: LooseHeaders | None) -> None:
        if not isinstance(headers, CIMultiDict) or "Host" not in headers:
            super().update_headers(headers)
            return
        self.headers = CIMultiDict(headers)

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        self._skip_auto_headers = _SKIPPED


_SKIPPED: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(istr(n) for n in _SKIP_AUTO_HEADERS))
if not {istr(name) for name in (*aiohttp.ClientRequest.DEFAULT_HEADERS, "User-Agent")} <= set(_SKIPPED):
    raise RuntimeError("this aiohttp adds request headers the gateway does not skip: review gateway/upstream.py")


class UpstreamClient:
    """Sends the proxied requests over one session; the short road only on a session it built (``open``)."""

    def __init__(self, session: aiohttp.ClientSession, *, max_field_size: int | None = None) -> None:
        self.session = session
        # Given by ``open``: the session's max_field_size, which the short road hands to the response parser. None
        # for a session from outside, whose settings the short road cannot know: all its requests take the long one.
        self._max_field_size = max_field_size
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
            read_bufsize=_READ_BUFSIZE,
            max_line_size=_MAX_LINE_SIZE,
            max_field_size=max_field_size,
            max_headers=_MAX_HEADERS,
        )
        return cls(session, max_field_size=max_field_size)

    async def close(self) -> None:
        await self.session.close()

    def request(
        self, method: str, url: URL, headers: CIMultiDict[str], body: AsyncIterable[bytes] | None
    ) -> Awaitable[aiohttp.ClientResponse]:
        """The upstream's response, its head read and its body still streaming; raises aiohttp's client errors."""
        if body is None and self._max_field_size is not None:
            return self._bodyless(method, url, headers, self._max_field_size)
        return self.session.request(
            method, url, headers=headers, data=body, allow_redirects=False, auto_decompress=False
        )

    async def _bodyless(
        self, method: str, url: URL, headers: CIMultiDict[str], max_field_size: int
    ) -> aiohttp.ClientResponse:
        """ClientSession._request with its _connect_and_send_request, for the gateway's own session: no traces,
        no total timeout, no redirects, no cookies, no proxy."""
        session = self.session
        if session.closed:
            raise RuntimeError("Session is closed")
        connector = session.connector
        assert connector is not None
        timeout = session.timeout
        loop = asyncio.get_running_loop()
        retry = method in _IDEMPOTENT
        while True:
            request = _BodylessRequest(
                method,
                url,
                headers=headers,
                loop=loop,
                timer=_NO_TIMER,
                session=session,
                version=self._version,
            )
            try:
                try:
                    connection = await connector.connect(request, traces=[], timeout=timeout)
                except asyncio.TimeoutError as err:
                    raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {request.url}") from err
                protocol = connection.protocol
                assert protocol is not None
                protocol.set_response_params(
                    timer=_NO_TIMER,
                    skip_payload=request.method == "HEAD",
                    read_until_eof=True,
                    auto_decompress=False,
                    read_timeout=timeout.sock_read,
                    read_bufsize=_READ_BUFSIZE,
                    timeout_ceil_threshold=_TIMEOUT_CEIL_THRESHOLD,
                    max_line_size=_MAX_LINE_SIZE,
                    max_field_size=max_field_size,
                    max_headers=_MAX_HEADERS,
                )
                try:
                    response = await request.send(connection)
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
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                # The connection broke before the response head, typically a kept-alive one the upstream had just
                # closed: like ClientSession, send an idempotent request once more.
                if not retry:
                    raise
                retry = False
            except aiohttp.ClientError:
                raise
            except OSError as err:
                if err.errno is None and isinstance(err, asyncio.TimeoutError):
                    raise
                raise aiohttp.ClientOSError(*err.args) from err
