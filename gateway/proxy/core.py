"""The proxy core's forwarder: the terminal handler of every chain. It forwards; it knows no policy and no route.

It sends the exchange to its tenant's upstream (the request body through the route's request-body filters) and
returns a ``Reply`` whose head is not yet sent and whose body is still the upstream's stream, so outer policies can
adjust headers, filter the body, or read it up to a cap. Upstream failures become the gateway's JSON error replies,
which the chain unwinds through like any other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator

import aiohttp
from aiohttp import hdrs
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from ..core.exchange import Body, BodyBroken, Exchange, Refuse, Reply
from ..core.http import HOP_BY_HOP, connection_tokens
from .gate import Gate
from .request_body import RequestBody, client_chunks
from .upstream import UpstreamClient

__all__ = ("ProxyCore", "VIA", "body_error_reply", "upstream_error_reply")

VIA = "1.1 deprecation-gateway"
# Dropped from the request on top of hop-by-hop headers: the gateway answers Expect itself (ensure_continue).
_REQUEST_DROP = tuple(istr(name) for name in sorted(HOP_BY_HOP | {"expect", "host"}))
_RESPONSE_DROP = tuple(istr(name) for name in sorted(HOP_BY_HOP | {"content-length"}))
# Statuses and methods whose response has no body (RFC 9110 6.4.1).
_NO_BODY_STATUS = frozenset({204, 304})
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def _drop(headers: CIMultiDict[str], names: tuple[istr, ...], source: CIMultiDictProxy[str]) -> None:
    """Remove hop-by-hop headers (and those the source's Connection header names) from a copy of the source."""
    for name in names:
        if name in headers:
            del headers[name]
    for token in connection_tokens(source):
        headers.popall(token, None)


def upstream_error_reply(exchange: Exchange, err: BaseException) -> Reply:
    """The answer to an upstream that could not be reached or broke before its response head."""
    if isinstance(err, asyncio.TimeoutError):
        status, kind, code, message = 504, "timeout", "UPSTREAM_TIMEOUT", "the upstream service did not answer in time"
    elif isinstance(err, aiohttp.ClientConnectorError):
        status, kind, code, message = 502, "connect", "UPSTREAM_UNAVAILABLE", "the upstream service cannot be reached"
    elif isinstance(err, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        status, kind, code, message = 502, "reset", "UPSTREAM_RESET", "the upstream service closed the connection"
    else:
        status, kind, code, message = 502, "other", "UPSTREAM_ERROR", "the upstream service sent an invalid response"
    exchange.upstream_error_kind = kind
    exchange.upstream_error = f"{kind}: {type(err).__name__}"
    return Reply.error(status, code, message, exchange.ensure_request_id())


def body_error_reply(exchange: Exchange) -> Reply:
    """The answer to a request whose body could not be read to its end (``exchange.body_error`` says why)."""
    if exchange.body_error == "timeout":
        reply = Reply.error(408, "CLIENT_BODY_TIMEOUT", "the request body stopped arriving", exchange.ensure_request_id())
    else:
        # "malformed": the client is still there; "aborted": nobody reads it (the access log says 499).
        reply = Reply.error(400, "MALFORMED_BODY", "the request body is malformed or was cut off",
                            exchange.ensure_request_id())
    reply.close_connection = True  # the rest of the body is unread: the connection cannot carry another request
    return reply


class UpstreamBody(Body):
    """The upstream's response body, streamed as it arrives; a failure part way becomes ``BodyBroken``."""

    def __init__(self, response: aiohttp.ClientResponse, exchange: Exchange, length: int | None,
                 gate: Gate | None) -> None:
        self._response = response
        self._exchange = exchange
        self._gate = gate  # the tenant's turn, given back once the body is read (or let go)
        self.length = length

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            if as_they_come:
                # readchunk hands over the parser's pieces as they are; readany would first join what is buffered.
                while True:
                    chunk, end_of_http_chunk = await content.readchunk()
                    if chunk:
                        yield chunk
                    elif not end_of_http_chunk:
                        break
            else:
                while chunk := await content.readany():
                    yield chunk
        except _UPSTREAM_ERRORS as err:
            kind = "timeout" if isinstance(err, asyncio.TimeoutError) else "reset"
            exchange = self._exchange
            exchange.upstream_error_kind = kind
            exchange.upstream_error = f"body_{kind}"
            status, code = (504, "UPSTREAM_TIMEOUT") if kind == "timeout" else (502, "UPSTREAM_RESET")
            raise BodyBroken(Reply.error(status, code, "the upstream service's response broke off part way",
                                         exchange.ensure_request_id())) from err
        finally:
            # Back to the pool when read to its end; closed otherwise (aiohttp decides).
            self._response.release()
            self._leave()

    def close(self) -> None:
        self._response.close()
        self._leave()

    def _leave(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.leave()


class _Declared(Body):
    """No body to send (a HEAD, a 204, a 304), with the length the upstream declared for the representation."""

    def __init__(self, length: int | None) -> None:
        self.length = length

    async def chunks(self, *, as_they_come: bool = False) -> AsyncIterator[bytes]:
        return
        yield b""  # an async generator that yields nothing

    def close(self) -> None:
        return


class ProxyCore:
    """Forwards a classified request to its tenant's upstream over the pooled connections of one client."""

    def __init__(self, client: UpstreamClient, *, trust_forwarded: bool = False, body_timeout: float = 60.0,
                 max_concurrent_per_tenant: int = 0, queue_timeout: float = 1.0) -> None:
        self.client = client
        self.trust_forwarded = trust_forwarded
        self.body_timeout = body_timeout
        self.max_concurrent = max_concurrent_per_tenant  # 0: no bound but the pool's
        self.queue_timeout = queue_timeout
        self._gates: dict[str, Gate] = {}

    def upstream_headers(self, exchange: Exchange) -> CIMultiDict[str]:
        """The client's headers without hop-by-hop ones, Host first (where aiohttp puts it), then X-Forwarded-*,
        Via, and what the policies asked for."""
        request = exchange.request
        incoming = request.headers
        tenant = exchange.tenant
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
        for name, value in exchange.upstream_headers.items():
            if value is None:
                headers.popall(name, None)
            else:
                headers[name] = value
        return headers

    async def __call__(self, exchange: Exchange) -> Reply:
        headers = self.upstream_headers(exchange)
        body: AsyncIterable[bytes] | None = None
        filtered: RequestBody | None = None
        if exchange.has_body:
            if exchange.request_filters:
                filtered = RequestBody(exchange, self.body_timeout)
                try:
                    # Nothing is sent upstream before every filter has let a first byte through.
                    await filtered.prime()
                except Refuse as refused:
                    return refused.reply
                except ConnectionError:
                    return body_error_reply(exchange)
                if any(f.changes_length for f in exchange.request_filters):
                    headers.popall(hdrs.CONTENT_LENGTH, None)
                body = filtered
            else:
                body = client_chunks(exchange, self.body_timeout)
        url = URL(exchange.tenant.upstream_prefix + exchange.path + ("?" + exchange.query if exchange.query else ""),
                  encoded=True)
        gate: Gate | None = None
        if self.max_concurrent:
            gate = self._gate(exchange.tenant.name)
            if not gate.try_enter() and not await gate.enter(self.queue_timeout):
                exchange.notes["queue"] = "full"
                busy = Reply.error(503, "UPSTREAM_BUSY", "this company's upstream has as many requests in flight as "
                                   "the gateway sends it; retry shortly", exchange.ensure_request_id())
                busy.headers["Retry-After"] = "1"
                if exchange.has_body:
                    busy.close_connection = True  # its body is unread
                return busy
        started = time.monotonic()
        try:
            # The classified (effective) method, not the request line's: an upstream that ignores a method override
            # must not act on a method whose route chain the request never went through.
            upstream = await self.client.request(exchange.method, url, headers, body, exchange.upstream_retries)
        except BaseException as err:
            if gate is not None:
                gate.leave()
            if not isinstance(err, _UPSTREAM_ERRORS):
                raise
            if filtered is not None and filtered.refused is not None:
                return filtered.refused.reply
            if exchange.body_error is not None:
                return body_error_reply(exchange)
            return upstream_error_reply(exchange, err)
        exchange.upstream_seconds = time.monotonic() - started
        if not 100 <= upstream.status <= 599:
            upstream.close()
            if gate is not None:
                gate.leave()
            exchange.upstream_error_kind = "other"
            exchange.upstream_error = f"other: status {upstream.status}"
            return Reply.error(502, "UPSTREAM_ERROR", "the upstream service sent an invalid response",
                               exchange.ensure_request_id())
        return self._reply(upstream, exchange, gate)

    def _gate(self, tenant: str) -> Gate:
        gate = self._gates.get(tenant)
        if gate is None:
            gate = self._gates[tenant] = Gate(self.max_concurrent)
        return gate

    def _reply(self, upstream: aiohttp.ClientResponse, exchange: Exchange, gate: Gate | None) -> Reply:
        raw = upstream.headers
        headers = CIMultiDict(raw)
        _drop(headers, _RESPONSE_DROP, raw)
        headers.add(hdrs.VIA, VIA)
        length: int | None = None
        declared = raw.get(hdrs.CONTENT_LENGTH)
        if declared is not None and hdrs.TRANSFER_ENCODING not in raw and declared.isdigit():
            length = int(declared)
        status = upstream.status
        content = upstream.content
        result: bytes | Body
        if exchange.method == "HEAD" or status in _NO_BODY_STATUS or status < 200:
            upstream.release()
            result = _Declared(length)
        elif content.is_eof() and content.exception() is None:
            # The whole body is here: it leaves with the head in one write.
            result = content.read_nowait()
            upstream.release()
        else:
            return Reply(status, headers, UpstreamBody(upstream, exchange, length, gate), reason=upstream.reason)
        if gate is not None:
            gate.leave()
        return Reply(status, headers, result, reason=upstream.reason)
