"""The proxy core's forwarder: the terminal handler of every chain. It forwards; it knows no policy and no route.

It sends the exchange to its tenant's upstream (the request body through the route's request-body filters) and
returns a ``Reply`` whose head is not yet sent and whose body is still the upstream's stream, so outer policies can
adjust headers, filter the body, or read it up to a cap. Upstream failures become the gateway's JSON error replies,
which the chain unwinds through like any other.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Protocol

import aiohttp
from aiohttp import hdrs
from multidict import CIMultiDict, CIMultiDictProxy, istr

from ..core import aiohttp_fast
from ..core.exchange import (
    Body,
    BodyBroken,
    ClientBody,
    Exchange,
    Reply,
    Services,
    UpstreamError,
    UpstreamFailed,
)
from ..core.http import HOP_BY_HOP, connection_tokens
from ..core.tracecontext import TRACEPARENT, TRACESTATE, ClientSpan
from .gate import Gate
from .upstream import Response, UpstreamClient

__all__ = ("ProxyCore", "VIA", "upstream_error_reply")

VIA = "1.1 deprecation-gateway"
# Dropped from the request on top of hop-by-hop headers: the gateway answers Expect itself (ensure_continue); the
# trace context is the gateway's to send (``headers``: the client's trace continued, with the gateway's span as parent).
_REQUEST_DROP = tuple(istr(name) for name in sorted(HOP_BY_HOP | {"expect", "host", TRACEPARENT, TRACESTATE}))
# Addresses a client may claim for itself: the upstream sees them only from a trusted hop (trust_forwarded_headers).
_CLAIMS = ("forwarded", "x-real-ip", "x-client-ip")
_UNTRUSTED_DROP = tuple(istr(name) for name in sorted({*_REQUEST_DROP, *_CLAIMS}))
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


def _without_cookie(headers: CIMultiDict[str], name: str) -> CIMultiDict[str]:
    """``headers`` without the cookie ``name`` in its ``Cookie`` lines: the other cookies of a line stay as they were
    sent, byte for byte, and a line that held only that cookie goes."""
    kept: CIMultiDict[str] = CIMultiDict()
    for header, value in headers.items():
        if header.lower() == "cookie" and name in value:
            pieces = value.split(";")
            left = [piece for piece in pieces if piece.partition("=")[0].strip() != name]
            if len(left) < len(pieces):
                value = ";".join(left)
                if pieces[0].partition("=")[0].strip() == name:
                    value = value.lstrip(" \t")  # the first cookie went: the next one's separating space goes too
                if not value.strip():
                    continue
        kept.add(header, value)
    return kept


def _declared_length(raw: CIMultiDictProxy[str]) -> int | None:
    """The length an upstream response declares for its body, when it is a plain Content-Length."""
    declared = raw.get(hdrs.CONTENT_LENGTH)
    if declared is not None and hdrs.TRANSFER_ENCODING not in raw and declared.isdigit():
        return int(declared)
    return None


def _forwarded_element(ip: str, proto: str, host: str | None) -> str:
    """This hop's RFC 7239 element: ``for`` (an IPv6 address quoted, in brackets), ``proto``, ``host`` (quoted)."""
    node = f'"[{ip}]"' if ":" in ip else ip
    element = f"for={node};proto={proto}"
    if host and all(0x21 <= ord(c) <= 0x7E and c not in '"\\' for c in host):
        element += f';host="{host}"'
    return element


def upstream_error_reply(exchange: Exchange, err: BaseException) -> Reply:
    """The answer to an upstream that could not be reached or broke before its response head."""
    status, kind, code, message = _error_kind(err)
    exchange.record.upstream_failed(kind, f"{kind}: {type(err).__name__}")
    return Reply.error(status, code, message, exchange.ensure_request_id())


def _error_kind(err: BaseException) -> tuple[int, UpstreamError, str, str]:
    if isinstance(err, asyncio.TimeoutError):
        status, kind, code = 504, UpstreamError.TIMEOUT, "UPSTREAM_TIMEOUT"
        message = "the upstream service did not answer in time"
    elif isinstance(err, aiohttp.ClientConnectorError):
        status, kind, code = 502, UpstreamError.CONNECT, "UPSTREAM_UNAVAILABLE"
        message = "the upstream service cannot be reached"
    elif isinstance(err, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        status, kind, code = 502, UpstreamError.RESET, "UPSTREAM_RESET"
        message = "the upstream service closed the connection"
    else:
        status, kind, code = 502, UpstreamError.OTHER, "UPSTREAM_ERROR"
        message = "the upstream service sent an invalid response"
    return status, kind, code, message


class UpstreamBody(Body):
    """The upstream's response body, streamed as it arrives; a failure part way becomes ``BodyBroken``."""

    def __init__(self, response: Response, exchange: Exchange, length: int | None,
                 gate: Gate | None, *, record: bool = True) -> None:
        self._response = response
        self._exchange = exchange
        self._record = record  # a failure is the exchange's upstream_error (False for a policy's own request)
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
            raise self._broken(err) from err
        finally:
            self.release()

    def _broken(self, err: BaseException) -> BodyBroken:
        """The failure part way (recorded as the exchange's), as the answer the proxy core gives for it."""
        kind = UpstreamError.TIMEOUT if isinstance(err, asyncio.TimeoutError) else UpstreamError.RESET
        exchange = self._exchange
        if self._record:
            exchange.record.upstream_failed(kind, f"body_{kind}")
        status, code = (504, "UPSTREAM_TIMEOUT") if kind is UpstreamError.TIMEOUT else (502, "UPSTREAM_RESET")
        return BodyBroken(Reply.error(status, code, "the upstream service's response broke off part way",
                                      exchange.ensure_request_id()))

    async def read_whole(self, each: Callable[[bytes | bytearray], object] | None
                         ) -> list[bytes | bytearray] | None:
        """Straight into the gateway's buffers (``aiohttp_fast.read_body_into``), when the length is known and the
        response came by the bodyless road."""
        response = self._response
        if self.length is None or not isinstance(response, aiohttp_fast.BodylessResponse):
            return None
        try:
            pieces = await aiohttp_fast.read_body_into(response, self.length, each)
        except _UPSTREAM_ERRORS as err:
            self.release()
            raise self._broken(err) from err
        except BaseException:
            self.release()
            raise
        if pieces is not None:
            self.release()
        return pieces

    def release(self) -> None:
        """Back to the pool when read to its end; closed otherwise (aiohttp decides)."""
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


# A path or query a policy sends on its own: already percent-encoded, nothing that would change the request line.
_WIRE_TARGET = re.compile(r"[\x21-\x7e]*")
_PURPOSE = re.compile(r"[a-z][a-z0-9_]{0,39}")
# The forwarding headers: what a request of a policy's own carries of the client's request (as the client's own
# request carries them), besides the request id. Names starting with ``x-forwarded-`` are forwarding headers too.
_FORWARDING = frozenset({"forwarded", "via", "x-real-ip", "x-client-ip"})


def _is_forwarding(name: str) -> bool:
    lower = name.lower()
    return lower in _FORWARDING or lower.startswith("x-forwarded-")


class _NoAnswer(Exception):
    """The upstream gave no usable response head (``ProxyCore._transmit``): ``kind`` says why, ``reply`` is the proxy
    core's answer for it."""

    def __init__(self, kind: UpstreamError, reply: Reply) -> None:
        super().__init__(kind)
        self.kind = kind
        self.reply = reply


class _Road(Protocol):
    """What one upstream request records of itself: the client's own on the exchange's record (``CoreRecord``), a
    policy's own as a ``SubRequest``."""

    def busy(self, seconds: float) -> None: ...
    def failed(self, kind: UpstreamError, seconds: float) -> None: ...
    def answered(self, status: int, seconds: float) -> None: ...


class ProxyCore(Services):
    """Forwards a classified request to its tenant's upstream over the pooled connections of one client; does the
    same for the requests of a policy's own (``Exchange.fetch``). Each has its header builder (``client_headers``,
    ``own_headers``, over the same forwarding headers); both go through ``_transmit``: the one road."""

    def __init__(self, client: UpstreamClient, *, trust_forwarded: bool = False, forwarded_header: bool = False,
                 max_concurrent_per_tenant: int = 0, queue_timeout: float = 1.0,
                 strip_cookie: str | None = None) -> None:
        self.client = client
        self.strip_cookie = strip_cookie  # the admin listener's cookie: never sent upstream
        self.trust_forwarded = trust_forwarded
        self.forwarded_header = forwarded_header  # emit RFC 7239 Forwarded
        self._drop_names = _REQUEST_DROP if trust_forwarded else _UNTRUSTED_DROP
        self.max_concurrent = max_concurrent_per_tenant  # 0: no bound but the pool's
        self.queue_timeout = queue_timeout
        self._gates: dict[str, Gate] = {}

    def _host(self, exchange: Exchange) -> tuple[str | None, str]:
        """The client's Host, and the one the upstream is sent."""
        host = exchange.request.headers.get(hdrs.HOST)
        tenant = exchange.tenant
        return host, host if (tenant.preserve_host and host) else tenant.upstream_host_header

    # --- the one road ----------------------------------------------------------------------------------------------

    def _span(self, exchange: Exchange, method: str, path: str, purpose: str | None
              ) -> tuple[ClientSpan | None, str | None]:
        """The upstream request's place in the trace: a span of the gateway's own when it is exported (told its end
        by ``_transmit``), and the ``traceparent`` it is sent."""
        trace = exchange.trace
        if trace is None:
            return None, None
        if trace.recording:
            span = trace.client_span(method, exchange.tenant.upstream_prefix + path, purpose)
            return span, span.traceparent
        return None, trace.traceparent()  # a span nobody records: its traceparent is all there is of it

    async def _transmit(self, exchange: Exchange, method: str, target: str, headers: CIMultiDict[str],
                        body: AsyncIterable[bytes] | None, road: _Road, span: ClientSpan | None
                        ) -> tuple[Response, Gate | None]:
        """Every request the gateway sends upstream goes through here, its headers built: the tenant's turn in
        ``max_concurrent_per_tenant`` is taken, the request is sent with the upstream client's retry policy and
        timeouts, and ``road`` and ``span`` are told what happened. Returns the response (head read, body streaming)
        and the turn to give back once its body is done with; raises ``_NoAnswer`` (no response head), or what the
        request body raised."""
        started = time.monotonic()
        gate = await self._turn(exchange) if self.max_concurrent else None
        if isinstance(gate, Reply):
            road.busy(time.monotonic() - started)
            if span is not None:
                span.end(error=UpstreamError.BUSY)
            raise _NoAnswer(UpstreamError.BUSY, gate)
        started = time.monotonic()
        retries = exchange.record.upstream_retries
        before = len(retries)
        try:
            response = await self.client.request_to(method, exchange.tenant.upstream_prefix, target, headers, body,
                                                    retries)
        except BaseException as err:
            if gate is not None:
                gate.leave()
            if not isinstance(err, _UPSTREAM_ERRORS):
                if span is not None:  # the client left, or its body broke or was refused part way
                    span.end(error="abandoned", retries=len(retries) - before)
                raise
            status, kind, code, message = _error_kind(err)
            road.failed(kind, time.monotonic() - started)
            if span is not None:
                span.end(error=kind, retries=len(retries) - before)
            raise _NoAnswer(kind, Reply.error(status, code, message, exchange.ensure_request_id())) from err
        road.answered(response.status, time.monotonic() - started)
        if span is not None:
            span.end(response.status, retries=len(retries) - before)
        return response, gate

    def client_headers(self, exchange: Exchange, traceparent: str | None = None) -> CIMultiDict[str]:
        """The client's own request's headers, Host first (where aiohttp puts it): the client's headers without
        hop-by-hop ones (and without the cookie ``strip_cookie``, the admin listener's: a browser sends it to every
        port of the host), then the forwarding headers (``_forwarding``), then what the policies asked for
        (``exchange.upstream_headers``)."""
        request = exchange.request
        host, upstream_host = self._host(exchange)
        headers = CIMultiDict(((hdrs.HOST, upstream_host),))
        passed = self._passed(exchange)
        cookie = self.strip_cookie
        if cookie is not None and any(cookie in line for line in passed.getall(hdrs.COOKIE, ())):
            passed = _without_cookie(passed, cookie)
        headers.extend(passed)
        if hdrs.CONTENT_LENGTH in headers:
            if exchange.has_body and exchange.body.changes_length:
                del headers[hdrs.CONTENT_LENGTH]  # a filter may change it: sent chunked
            else:
                headers[hdrs.CONTENT_LENGTH] = str(request.content_length)  # "05" reaches the upstream as "5"
        self._forwarding(exchange, headers, host, traceparent)
        for name, value in exchange.upstream_headers.items():
            if value is None:
                headers.popall(name, None)
            else:
                headers[name] = value
        return headers

    def own_headers(self, exchange: Exchange, own: Mapping[str, str], traceparent: str | None = None
                    ) -> CIMultiDict[str]:
        """A policy's own request's headers: Host, the forwarding headers where they pass (they pass on every
        request), the gateway's forwarding headers (``_forwarding``), then ``own``; nothing else of the client's."""
        host, upstream_host = self._host(exchange)
        headers = CIMultiDict(((hdrs.HOST, upstream_host),))
        headers.extend((name, value) for name, value in self._passed(exchange).items() if _is_forwarding(name))
        self._forwarding(exchange, headers, host, traceparent)
        headers.update(own)
        return headers

    def _passed(self, exchange: Exchange) -> CIMultiDict[str]:
        """The client's headers that may pass: without hop-by-hop ones (and, from an untrusted hop, its claims)."""
        incoming = exchange.request.headers
        passed = CIMultiDict(incoming)
        _drop(passed, self._drop_names, incoming)
        return passed

    def _forwarding(self, exchange: Exchange, headers: CIMultiDict[str], host: str | None,
                    traceparent: str | None) -> None:
        """The gateway's forwarding headers, the same on both roads, and the trace context given (``traceparent``,
        and the client's ``tracestate``), never the client's own headers of it.

        ``X-Forwarded-For``: every line the client sent, combined, then the client's address appended. Without
        ``trust_forwarded_headers`` the client's ``Forwarded``, ``X-Real-IP`` and ``X-Client-IP`` are removed and
        ``X-Forwarded-Proto``/``-Host`` set by the gateway: the upstream sees no address the gateway does not vouch
        for as the last hop's. With ``forwarded_header``, an RFC 7239 ``Forwarded`` element for this hop is sent
        (appended to the client's only when it is trusted). Then ``Via`` and the request id."""
        request = exchange.request
        incoming = request.headers
        client_ip = request.remote or "unknown"
        claimed = [v.strip() for v in incoming.getall(hdrs.X_FORWARDED_FOR, ()) if v.strip()]
        headers[hdrs.X_FORWARDED_FOR] = ", ".join([*claimed, client_ip])
        if not (self.trust_forwarded and hdrs.X_FORWARDED_PROTO in incoming):
            headers[hdrs.X_FORWARDED_PROTO] = request.scheme
        if host and not (self.trust_forwarded and hdrs.X_FORWARDED_HOST in incoming):
            headers[hdrs.X_FORWARDED_HOST] = host
        if self.forwarded_header:
            element = _forwarded_element(client_ip, request.scheme, host)
            earlier = ", ".join(incoming.getall(hdrs.FORWARDED, ())) if self.trust_forwarded else ""
            headers[hdrs.FORWARDED] = f"{earlier}, {element}" if earlier else element
        via = incoming.get(hdrs.VIA)
        headers[hdrs.VIA] = f"{via}, {VIA}" if via else VIA
        if exchange.request_id is not None:
            headers[exchange.request_id_header] = exchange.request_id
        if traceparent is not None:
            headers[TRACEPARENT] = traceparent
            tracestate = exchange.trace.tracestate if exchange.trace is not None else ""
            if tracestate:
                headers[TRACESTATE] = tracestate

    # --- a policy's own requests ----------------------------------------------------------------------------------

    async def fetch(self, exchange: Exchange, method: str, path: str, *, query: str = "",
                    headers: Mapping[str, str] | None = None, body: bytes | AsyncIterator[bytes] | None = None,
                    purpose: str = "policy") -> Reply:
        if not (path.startswith("/") and _WIRE_TARGET.fullmatch(path) and _WIRE_TARGET.fullmatch(query)):
            raise ValueError("a policy's request target must be a percent-encoded absolute path")
        if not _PURPOSE.fullmatch(purpose):
            raise ValueError("a policy's request purpose is a few lower-case words joined by '_'")
        own = dict(headers) if headers else {}
        data: AsyncIterable[bytes] | None
        if isinstance(body, bytes):
            own[hdrs.CONTENT_LENGTH] = str(len(body))
            data = _one_chunk(body) if body else None
        else:
            data = body
        road = exchange.record.subrequest(purpose, method)
        span, traceparent = self._span(exchange, method, path, purpose)
        sent = self.own_headers(exchange, own, traceparent)
        try:
            upstream, gate = await self._transmit(exchange, method, _target(path, query), sent, data, road, span)
        except _NoAnswer as failed:
            raise UpstreamFailed(failed.kind, failed.reply) from failed.__cause__
        if not 200 <= upstream.status <= 599:
            # No interim answer is expected (no Expect is sent) and none is relayed: a 1xx here is as invalid as 999.
            _let_go(upstream, gate, close=True)
            road.error = UpstreamError.OTHER
            raise UpstreamFailed(UpstreamError.OTHER, _invalid_response(exchange))
        raw = upstream.headers
        answer = CIMultiDict(raw)
        _drop(answer, _RESPONSE_DROP, raw)
        length = _declared_length(raw)
        if method == "HEAD" or upstream.status in _NO_BODY_STATUS:
            _let_go(upstream, gate)
            return Reply(upstream.status, answer, _Declared(length), reason=upstream.reason)
        return Reply(upstream.status, answer, UpstreamBody(upstream, exchange, length, gate, record=False),
                     reason=upstream.reason)

    # --- the client's request -------------------------------------------------------------------------------------

    async def __call__(self, exchange: Exchange) -> Reply:
        body: ClientBody | None = None
        if exchange.has_body:
            body = exchange.body
            refused = await body.prime()
            if refused is not None:
                return refused
        # The classified (effective) method, not the request line's: an upstream that ignores a method override
        # must not act on a method whose route chain the request never went through.
        method = exchange.upstream_method
        span, traceparent = self._span(exchange, method, exchange.path, None)
        headers = self.client_headers(exchange, traceparent)
        try:
            upstream, gate = await self._transmit(exchange, method, _target(exchange.path, exchange.query), headers,
                                                  body, exchange.record, span)
        except _NoAnswer as failed:
            return self._no_answer(exchange, failed)
        if upstream.status == 101:
            # The gateway asks for no upgrade (Upgrade is hop-by-hop): a switch of protocols it did not ask for cannot
            # be relayed, and the connection can no longer be read as HTTP.
            _let_go(upstream, gate, close=True)
            exchange.record.upstream_failed(UpstreamError.OTHER, "other: unsolicited 101")
            return Reply.error(502, "UPSTREAM_UPGRADE", "the upstream service switched protocols unasked",
                               exchange.ensure_request_id())
        if not 100 <= upstream.status <= 599:
            _let_go(upstream, gate, close=True)
            exchange.record.upstream_failed(UpstreamError.OTHER, f"other: status {upstream.status}")
            return _invalid_response(exchange)
        return self._reply(upstream, exchange, gate)

    def _no_answer(self, exchange: Exchange, failed: _NoAnswer) -> Reply:
        """The answer to a client's request that got no response head: busy, refused or broken on the way (its
        body), or the upstream's failure."""
        if failed.kind is UpstreamError.BUSY:
            if exchange.has_body:
                failed.reply.close_connection = True  # its body is unread
            return failed.reply
        if exchange.has_body:
            body = exchange.body
            if body.refused is not None:
                return body.refused.reply
            if body.error is not None:
                return body.broken_reply()
        cause = failed.__cause__
        assert cause is not None
        return upstream_error_reply(exchange, cause)

    async def _turn(self, exchange: Exchange) -> Gate | Reply | None:
        """The tenant's turn in ``max_concurrent_per_tenant``: its gate (to leave once the upstream is done with), None
        when there is no bound, or the 503 when no turn came within ``queue_timeout``."""
        if not self.max_concurrent:
            return None
        tenant = exchange.tenant.name
        gate = self._gates.get(tenant)
        if gate is None:
            gate = self._gates[tenant] = Gate(self.max_concurrent)
        if gate.try_enter() or await gate.enter(self.queue_timeout):
            return gate
        busy = Reply.error(503, "UPSTREAM_BUSY", "this company's upstream has as many requests in flight as the "
                           "gateway sends it; retry shortly", exchange.ensure_request_id())
        busy.headers["Retry-After"] = "1"
        return busy

    def _reply(self, upstream: Response, exchange: Exchange, gate: Gate | None) -> Reply:
        raw = upstream.headers
        headers = CIMultiDict(raw)
        _drop(headers, _RESPONSE_DROP, raw)
        headers.add(hdrs.VIA, VIA)
        length = _declared_length(raw)
        status = upstream.status
        content = upstream.content
        result: bytes | Body
        if exchange.upstream_method == "HEAD" or status in _NO_BODY_STATUS or status < 200:
            result = _Declared(length)
        elif content.is_eof() and content.exception() is None:
            # The whole body is here: it leaves with the head in one write.
            result = content.read_nowait()
        else:
            return Reply(status, headers, UpstreamBody(upstream, exchange, length, gate), reason=upstream.reason)
        _let_go(upstream, gate)
        return Reply(status, headers, result, reason=upstream.reason)


def _target(path: str, query: str) -> str:
    return path + "?" + query if query else path


def _let_go(upstream: Response, gate: Gate | None, *, close: bool = False) -> None:
    """The response is done with: its connection back to the pool (or closed), and the tenant's turn given back."""
    if close:
        upstream.close()
    else:
        upstream.release()
    if gate is not None:
        gate.leave()


def _invalid_response(exchange: Exchange) -> Reply:
    return Reply.error(502, "UPSTREAM_ERROR", "the upstream service sent an invalid response",
                       exchange.ensure_request_id())


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data
