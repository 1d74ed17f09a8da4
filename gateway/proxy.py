"""The proxy core: the terminal handler of every chain. It forwards; it knows no policy and no route.

It returns an ``UpstreamResponse`` whose head is not yet sent and whose body is still the upstream's stream, so
outer policies can adjust headers, or read the body up to a cap when they must rewrite it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from .http import HOP_BY_HOP, connection_tokens, ensure_continue, json_error, new_request_id
from .observability import Metrics
from .typedefs import CTX, RequestContext

__all__ = ("BodyTooLarge", "ProxyCore", "UpstreamResponse", "VIA")

VIA = "1.1 deprecation-gateway"
# Dropped from the request on top of hop-by-hop headers: the gateway answers Expect itself (ensure_continue).
_REQUEST_DROP = HOP_BY_HOP | {"expect", "host"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length"}


class BodyTooLarge(Exception):
    """Raised by UpstreamResponse.read_body when the body exceeds the caller's cap."""


class UpstreamResponse(web.StreamResponse):
    """A response whose body is streamed from the upstream when aiohttp finishes it (``write_eof``)."""

    def __init__(self, upstream: aiohttp.ClientResponse, ctx: RequestContext, metrics: Metrics) -> None:
        super().__init__(status=upstream.status, reason=upstream.reason)
        self.upstream = upstream
        self._ctx = ctx
        self._metrics = metrics
        headers = self.headers
        raw = upstream.headers
        drop = _RESPONSE_DROP | connection_tokens(raw) if "Connection" in raw else _RESPONSE_DROP
        for name, value in raw.items():
            if name.lower() not in drop:
                headers.add(name, value)
        headers.add("Via", VIA)
        length = raw.get("Content-Length")
        if length is not None and "Transfer-Encoding" not in raw and length.isdigit():
            self.content_length = int(length)

    async def read_body(self, cap: int) -> bytes:
        """Read the whole upstream body into memory, refusing more than ``cap`` bytes."""
        chunks: list[bytes] = []
        size = 0
        content = self.upstream.content
        while chunk := await content.readany():
            size += len(chunk)
            if size > cap:
                raise BodyTooLarge(size)
            chunks.append(chunk)
        return b"".join(chunks)

    def release(self) -> None:
        self.upstream.release()

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            content = self.upstream.content
            try:
                while chunk := await content.readany():
                    await self.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                # The head is sent: all that is left is to cut the client's connection so it sees a short body.
                # aiohttp treats a ConnectionError here as a lost connection: it closes it and still logs access.
                kind = "timeout" if isinstance(err, asyncio.TimeoutError) else "reset"
                self._ctx.upstream_error = f"body_{kind}"
                self._metrics.upstream_errors.labels(kind).inc()
                raise ConnectionResetError(f"upstream body {kind}") from err
            await super().write_eof(data)
        finally:
            self.upstream.release()


class ProxyCore:
    """Forwards a classified request to its tenant's upstream over one pooled client session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        metrics: Metrics,
        *,
        trust_forwarded: bool = False,
        body_timeout: float = 60.0,
    ) -> None:
        self.session = session
        self.metrics = metrics
        self.trust_forwarded = trust_forwarded
        self.body_timeout = body_timeout

    def upstream_headers(self, request: web.BaseRequest, ctx: RequestContext) -> CIMultiDict[str]:
        incoming = request.headers
        drop = _REQUEST_DROP | connection_tokens(incoming) if "Connection" in incoming else _REQUEST_DROP
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in incoming.items():
            if name.lower() not in drop:
                headers.add(name, value)
        tenant = ctx.tenant
        host = incoming.get("Host")
        headers["Host"] = host if (tenant.preserve_host and host) else tenant.upstream_host_header
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client_ip = peer[0] if peer else "unknown"
        forwarded_for = incoming.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{forwarded_for}, {client_ip}" if forwarded_for else client_ip
        if not (self.trust_forwarded and "X-Forwarded-Proto" in incoming):
            headers["X-Forwarded-Proto"] = request.scheme
        if host and not (self.trust_forwarded and "X-Forwarded-Host" in incoming):
            headers["X-Forwarded-Host"] = host
        via = incoming.get("Via")
        headers["Via"] = f"{via}, {VIA}" if via else VIA
        for name, value in ctx.upstream_headers.items():
            if value is None:
                headers.popall(name, None)
            else:
                headers[name] = value
        return headers

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        ctx = request[CTX]
        url = URL(str(ctx.tenant.upstream) + ctx.path + ("?" + ctx.query if ctx.query else ""), encoded=True)
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
            upstream = await self.session.request(
                ctx.method, url, headers=headers, data=body, allow_redirects=False, auto_decompress=False
            )
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            if ctx.body_timed_out:
                timed_out = json_error(408, "CLIENT_BODY_TIMEOUT", "the request body stopped arriving", ctx.request_id)
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
        if ctx.request_id is None:
            ctx.request_id = new_request_id()
        return json_error(status, code, message, ctx.request_id)


async def _stream_body(request: web.BaseRequest, ctx: RequestContext, timeout: float) -> AsyncIterator[bytes]:
    await ensure_continue(request)
    content = request.content
    loop = asyncio.get_running_loop()
    try:
        # One timer, re-armed before each read and disarmed while a piece is being sent upstream: a client that
        # stalls (or whose framing broke: aiohttp then stops feeding the body without failing it) must not hold an
        # upstream connection forever, and a slow upstream is not the client's fault.
        async with asyncio.timeout(None) as deadline:
            while True:
                deadline.reschedule(loop.time() + timeout)
                chunk = await content.readany()
                deadline.reschedule(None)
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
