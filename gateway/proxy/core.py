"""The proxy core: the terminal handler of every chain. It forwards; it knows no policy and no route.

It returns an ``UpstreamResponse`` whose head is not yet sent and whose body is still the upstream's stream, so
outer policies can adjust headers, or read the body up to a cap when they must rewrite it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from ..core.http import HOP_BY_HOP, connection_tokens, ensure_continue, json_error
from ..ops.observability import Metrics
from ..core.exchange import CTX, RequestContext
from .upstream import UpstreamClient

__all__ = ("BodyTooLarge", "ProxyCore", "UpstreamResponse", "VIA")

VIA = "1.1 deprecation-gateway"
# Dropped from the request on top of hop-by-hop headers: the gateway answers Expect itself (ensure_continue).
_REQUEST_DROP = tuple(istr(name) for name in sorted(HOP_BY_HOP | {"expect", "host"}))
_RESPONSE_DROP = tuple(istr(name) for name in sorted(HOP_BY_HOP | {"content-length"}))


def _drop(headers: CIMultiDict[str], names: tuple[istr, ...], source: CIMultiDictProxy[str]) -> None:
    """Remove hop-by-hop headers (and those the source's Connection header names) from a copy of the source."""
    for name in names:
        if name in headers:
            del headers[name]
    for token in connection_tokens(source):
        headers.popall(token, None)


class BodyTooLarge(Exception):
    """Raised by UpstreamResponse.read_body when the body exceeds the caller's cap; ``data`` is what was read."""

    def __init__(self, data: bytes) -> None:
        super().__init__("the upstream body is over the cap")
        self.data = data


class UpstreamResponse(web.StreamResponse):
    """A response whose body is streamed from the upstream when aiohttp finishes it (``write_eof``)."""

    def __init__(self, upstream: aiohttp.ClientResponse, ctx: RequestContext, metrics: Metrics) -> None:
        raw = upstream.headers
        super().__init__(status=upstream.status, reason=upstream.reason, headers=raw)
        self.upstream = upstream
        self._ctx = ctx
        self._metrics = metrics
        headers = self.headers
        _drop(headers, _RESPONSE_DROP, raw)
        headers.add(hdrs.VIA, VIA)
        length = raw.get(hdrs.CONTENT_LENGTH)
        if length is not None and hdrs.TRANSFER_ENCODING not in raw and length.isdigit():
            headers[hdrs.CONTENT_LENGTH] = str(int(length))  # what the content_length setter writes
        if upstream.content.is_eof():
            # The whole body is here: the head waits to leave with it in one write (as web.Response's does). A body
            # still arriving gets its head at once when prepared, so a slow or streaming upstream is seen to answer.
            self._send_headers_immediately = False

    async def read_body(self, cap: int) -> bytes:
        """The whole upstream body; over ``cap`` bytes, BodyTooLarge with what was read so far (the rest unread)."""
        chunks: list[bytes] = []
        size = 0
        content = self.upstream.content
        # readchunk hands over the parser's chunks one by one, as they are; readany would first join what is buffered,
        # one more copy of the body before the join below.
        while True:
            chunk, chunk_end = await content.readchunk()
            if not chunk:
                if chunk_end:
                    continue  # the end of an HTTP chunk (chunked transfer coding), not of the body
                break
            size += len(chunk)
            chunks.append(chunk)
            if size > cap:
                raise BodyTooLarge(b"".join(chunks))
        return b"".join(chunks)

    def release(self) -> None:
        self.upstream.release()

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            content = self.upstream.content
            try:
                if content.is_eof():
                    rest = content.read_nowait()
                    data = rest + data if data else rest
                else:
                    while chunk := await content.readany():
                        await self.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                # The head is sent (or, held back for a body that had arrived, can no longer be changed): all that is
                # left is to cut the client's connection so it sees a short or no response.
                # aiohttp treats a ConnectionError here as a lost connection: it closes it and still logs access.
                kind = "timeout" if isinstance(err, asyncio.TimeoutError) else "reset"
                self._ctx.upstream_error = f"body_{kind}"
                self._metrics.upstream_errors.labels(kind).inc()
                raise ConnectionResetError(f"upstream body {kind}") from err
            await super().write_eof(data)
        finally:
            self.upstream.release()


class ProxyCore:
    """Forwards a classified request to its tenant's upstream over the pooled connections of one client."""

    def __init__(
        self,
        client: UpstreamClient,
        metrics: Metrics,
        *,
        trust_forwarded: bool = False,
        body_timeout: float = 60.0,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.trust_forwarded = trust_forwarded
        self.body_timeout = body_timeout

    def upstream_headers(self, request: web.BaseRequest, ctx: RequestContext) -> CIMultiDict[str]:
        """The client's headers without hop-by-hop ones, Host first (where aiohttp puts it), then X-Forwarded-*,
        Via, and what the policies asked for."""
        incoming = request.headers
        tenant = ctx.tenant
        host = incoming.get(hdrs.HOST)
        forwarded = CIMultiDict(incoming)
        _drop(forwarded, _REQUEST_DROP, incoming)
        headers = CIMultiDict(((hdrs.HOST, host if (tenant.preserve_host and host) else tenant.upstream_host_header),))
        headers.extend(forwarded)
        client_ip = request.remote or "unknown"
        forwarded_for = incoming.get(hdrs.X_FORWARDED_FOR)
        headers[hdrs.X_FORWARDED_FOR] = f"{forwarded_for}, {client_ip}" if forwarded_for else client_ip
        if not (self.trust_forwarded and hdrs.X_FORWARDED_PROTO in incoming):
            headers[hdrs.X_FORWARDED_PROTO] = request.scheme
        if host and not (self.trust_forwarded and hdrs.X_FORWARDED_HOST in incoming):
            headers[hdrs.X_FORWARDED_HOST] = host
        via = incoming.get(hdrs.VIA)
        headers[hdrs.VIA] = f"{via}, {VIA}" if via else VIA
        for name, value in ctx.upstream_headers.items():
            if value is None:
                headers.popall(name, None)
            else:
                headers[name] = value
        return headers

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        ctx = request[CTX]
        url = URL(ctx.tenant.upstream_prefix + ctx.path + ("?" + ctx.query if ctx.query else ""), encoded=True)
        headers = self.upstream_headers(request, ctx)
        body: AsyncIterable[bytes] | None
        if ctx.body is not None:
            body = ctx.body
        elif request.body_exists:
            body = _stream_body(request, ctx, self.body_timeout)
        else:
            body = None
        started = time.monotonic()
        try:
            # The classified (effective) method, not the request line's: an upstream that ignores a method override
            # must not act on a method whose route chain the request never went through.
            upstream = await self.client.request(ctx.method, url, headers, body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            if ctx.body_timed_out:
                timed_out = json_error(
                    408, "CLIENT_BODY_TIMEOUT", "the request body stopped arriving", ctx.ensure_request_id()
                )
                timed_out.force_close()  # the rest of the body is unread: the connection cannot carry another request
                return timed_out
            if ctx.client_aborted:
                return web.Response(status=400)  # nobody reads it; the access log says 499
            return self._error(ctx, err)
        ctx.upstream_seconds = time.monotonic() - started
        return UpstreamResponse(upstream, ctx, self.metrics)

    def _error(self, ctx: RequestContext, err: BaseException) -> web.Response:
        if isinstance(err, asyncio.TimeoutError):
            status, kind, code, message = 504, "timeout", "UPSTREAM_TIMEOUT", "the upstream service did not answer in time"
        elif isinstance(err, aiohttp.ClientConnectorError):
            status, kind, code, message = 502, "connect", "UPSTREAM_UNAVAILABLE", "the upstream service cannot be reached"
        elif isinstance(err, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            status, kind, code, message = 502, "reset", "UPSTREAM_RESET", "the upstream service closed the connection"
        else:
            status, kind, code, message = 502, "other", "UPSTREAM_ERROR", "the upstream service sent an invalid response"
        self.metrics.upstream_errors.labels(kind).inc()
        ctx.upstream_error = f"{kind}: {type(err).__name__}"
        return json_error(status, code, message, ctx.ensure_request_id())


async def _stream_body(request: web.BaseRequest, ctx: RequestContext, timeout: float) -> AsyncIterator[bytes]:
    await ensure_continue(request)
    content = request.content
    loop = asyncio.get_running_loop()
    tap = ctx.body_tap
    try:
        # One timer, re-armed before each read and disarmed while a piece is being sent upstream: a client that
        # stalls (or whose framing broke: aiohttp then stops feeding the body without failing it) must not hold an
        # upstream connection forever, and a slow upstream is not the client's fault.
        async with asyncio.timeout(None) as deadline:
            while True:
                deadline.reschedule(loop.time() + timeout)
                chunk = await content.readany()
                deadline.reschedule(None)
                if tap is not None:
                    tap(chunk)
                if not chunk:
                    break
                yield chunk
    except TimeoutError:
        ctx.body_timed_out = True
        raise ConnectionResetError("request body timed out") from None
    except (ConnectionError, aiohttp.ClientPayloadError, asyncio.CancelledError):
        # The client went away or sent a broken body: the upstream request is abandoned with it.
        ctx.client_aborted = True
        raise
