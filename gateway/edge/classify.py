"""The edge's classification of a request, in the order of the road: one Host and headers that can be forwarded as
sent, the canonical path, the effective method (headers and query), the tenant, the route; then, where it could
matter, a form body's ``_method`` (``method.FormMethod``, the one step that reads). A request that cannot be
classified safely is refused here and reaches no policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import hdrs, http_exceptions, web

from ..core.exchange import Exchange, Reply, Services
from ..core.http import new_request_id, transfer_codings
from ..core.reply import internal_error
from ..core.tenants import canonical_host
from .method import FormMethod, effective_method, form_method
from .route_table import RouteTable
from .target import BadRequestTarget, normalise_target
from .tenancy import TenantResolver

__all__ = ("Classifier", "EdgeRefusal", "classify", "parser_error_text")

_PARSER_CODES = {400: "MALFORMED_REQUEST", 413: "REQUEST_TOO_LARGE", 431: "HEADERS_TOO_LARGE"}
# What the answer says, by the kind of error (most specific first). The parser's own text is never echoed: it can
# quote the request's bytes (a header with a token, a signed query string), whatever parser (C or Python) wrote it.
_PARSER_TEXTS: tuple[tuple[type[BaseException], str], ...] = (
    (http_exceptions.LineTooLong, "a request line or header is too long"),
    (http_exceptions.BadHttpMethod, "the request method is not valid"),
    (http_exceptions.BadStatusLine, "the request line is not valid"),
    (http_exceptions.InvalidURLError, "the request target is not valid"),
    (http_exceptions.InvalidHeader, "a header is not valid"),
    (http_exceptions.PayloadEncodingError, "the request body's framing is not valid"),
)


def parser_error_text(exc: BaseException | None) -> str:
    """What a 4xx answer to a request the HTTP parser rejected says: fixed text by kind, never the parser's own."""
    return next((text for kind, text in _PARSER_TEXTS if isinstance(exc, kind)), "the request is not valid HTTP/1.1")


class Classifier(Protocol):
    """What classification reads of the state in force: the tenants, the routes, and the server's bounds on a
    body (``server.client_body_timeout``, ``server.method_override_look_ahead``)."""

    @property
    def tenants(self) -> TenantResolver: ...
    @property
    def routes(self) -> RouteTable: ...
    @property
    def body_timeout(self) -> float: ...
    @property
    def look_ahead(self) -> int: ...


@dataclass(slots=True)
class EdgeRefusal:
    """A request answered before routing: its answer, its code and its request id (for the record)."""

    reply: Reply
    code: str
    request_id: str

    @classmethod
    def of(cls, status: int, code: str, message: str) -> EdgeRefusal:
        rid = new_request_id()
        return cls._closing(Reply.error(status, code, message, rid), code, rid)

    @classmethod
    def _closing(cls, reply: Reply, code: str, rid: str) -> EdgeRefusal:
        reply.close_connection = True
        return cls(reply, code, rid)

    @classmethod
    def unparsed(cls, status: int, exc: BaseException | None) -> EdgeRefusal:
        """A request the HTTP parser rejected: a JSON answer naming the kind of error (never its text)."""
        if status >= 500:
            rid = new_request_id()
            return cls._closing(internal_error(rid), "INTERNAL_ERROR", rid)
        return cls.of(status, _PARSER_CODES.get(status, "BAD_REQUEST"), parser_error_text(exc))


def _utf8_values(request: web.BaseRequest) -> bool:
    """Whether every header value is UTF-8. aiohttp reads other bytes (obs-text, RFC 9110 5.5) into strings it can
    only write back without them, so such a request would reach the upstream altered."""
    try:
        for _, value in request.raw_headers:
            value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def classify(request: web.BaseRequest, started: float, state: Classifier, services: Services
             ) -> tuple[Exchange, FormMethod | None] | EdgeRefusal:
    """The request's head, classified: its ``Exchange`` (served by ``services``, the proxy core) and, where a form
    body's ``_method`` could route it to a guarded route, the last step still to take (``FormMethod.read``); or its
    refusal. Each step runs once."""
    headers = request.headers
    hosts = headers.getall(hdrs.HOST, ())
    refusal = _head_refusal(request, hosts)
    if refusal is not None:
        return refusal
    host = hosts[0] if hosts else None
    try:
        target = normalise_target(request.raw_path)
        if target.authority is not None:
            _check_authority(target.authority, host)
        method, overrides = effective_method(request.method, headers, target.query)
    except BadRequestTarget as err:
        return EdgeRefusal.of(400, err.code, err.message)
    tenant = state.tenants.resolve(host)
    if tenant is None:
        return EdgeRefusal.of(421, "UNKNOWN_HOST", "this gateway serves no company at the requested host")
    matches = state.routes.lookup(target.path)
    route, params = matches.route(method)
    exchange = Exchange(request, started, tenant, route, params, target.path, target.query, method,
                        body_timeout=state.body_timeout)
    exchange.services = services
    return exchange, form_method(exchange, overrides, matches, state.look_ahead)


def _head_refusal(request: web.BaseRequest, hosts: Sequence[str]) -> EdgeRefusal | None:
    """The refusal of a head whose Host, Transfer-Encoding or header bytes could not be forwarded as they came."""
    if len(hosts) > 1:
        return EdgeRefusal.of(400, "BAD_HOST", "the request has more than one Host header")
    headers = request.headers
    if hdrs.TRANSFER_ENCODING in headers and transfer_codings(headers) != ["chunked"]:
        # aiohttp takes "gzip, chunked" and decodes only the chunked framing: the upstream would be sent gzip
        # bytes labelled as plain.
        return EdgeRefusal.of(400, "BAD_TRANSFER_ENCODING", "a request body may use no transfer coding but chunked")
    # aiohttp decodes each value from its bytes, so a value is ASCII exactly when its bytes are: one check in C.
    if not "".join(headers.values()).isascii() and not _utf8_values(request):
        return EdgeRefusal.of(400, "BAD_HEADER", "a header value is not UTF-8: it cannot be forwarded as it was sent")
    return None


def _check_authority(authority: str, host: str | None) -> None:
    """An absolute-form target must name the Host's own authority."""
    if host is None or canonical_host(authority) != canonical_host(host):
        raise BadRequestTarget("BAD_REQUEST_TARGET", "the absolute-form request target names another host")
