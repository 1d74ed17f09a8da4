"""Type aliases and the per-request context shared by the app, the chains and the proxy core."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .http import new_request_id

if TYPE_CHECKING:
    from .routing import Route
    from .tenants import Tenant

__all__ = ("CTX", "Handler", "Middleware", "REFUSAL", "RequestContext")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.BaseRequest, Handler], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(slots=True)
class RequestContext:
    """What the gateway learned about one request; lives in the request under ``CTX``."""

    start: float
    tenant: Tenant
    route: Route
    params: dict[str, str]
    path: str  # canonical path: what was classified and what the upstream receives
    query: str  # raw query string, without '?'
    method: str  # effective method (method-override headers and ``_method`` included)
    request_id: str | None = None
    # Headers the upstream request gets on top of (value) or without (None) the client's.
    upstream_headers: dict[str, str | None] = dataclasses.field(default_factory=dict)
    # A policy that consumed part of the body hands the proxy core the body to send instead.
    body: AsyncIterable[bytes] | None = None
    # A policy that only watches the body: called with each piece the proxy core streams upstream, then with b"" at
    # its end (the core keeps the body timeout and the client-abort bookkeeping).
    body_tap: Callable[[bytes], None] | None = None
    # policy name -> decision label, for the access log and metrics.
    decisions: dict[str, str] = dataclasses.field(default_factory=dict)
    upstream_seconds: float | None = None
    upstream_error: str | None = None
    client_aborted: bool = False
    body_timed_out: bool = False  # the request body stopped arriving (server.client_body_timeout)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def ensure_request_id(self) -> str:
        """This request's id; one is made now if no ``request_id`` policy made one (an error answer names it)."""
        if self.request_id is None:
            self.request_id = new_request_id()
        return self.request_id


CTX: web.RequestKey[RequestContext] = web.RequestKey("gateway_ctx", RequestContext)
# (code, request id) of a request refused before routing, for the access log.
REFUSAL: web.RequestKey[tuple[str, str]] = web.RequestKey("gateway_refusal", tuple)
