"""One exchange: a classified request on its way through its route's chain, and the reply that comes back. This is the
whole interface a policy works with (``Exchange``, ``Reply``, the body-phase types, the proxy core's ``Services``,
``Budget``): the reply and the response body live in ``core.reply``, the client's body in ``core.client_body``, both
named here too. docs/architecture.md ("The phases a policy can act in", "A policy's own requests, and its bounds")
says how a policy uses them and which rules the core enforces."""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import hdrs, web
from multidict import CIMultiDictProxy

from .client_body import BodyError, ClientBody, Flow, Refuse, RequestBodyFilter
from .decision import Decider, Decision
from .http import new_request_id, token_fingerprint
from .reply import (
    Body,
    BodyBroken,
    BodyNotRead,
    BodyTooLarge,
    BodyUnavailable,
    Budget,
    Pieces,
    Reply,
    ResponseBodyFilter,
)
from .tracecontext import TraceContext

if TYPE_CHECKING:
    from .route import Route
    from .tenants import Tenant

__all__ = (
    "Body",
    "BodyBroken",
    "BodyError",
    "BodyNotRead",
    "BodyTooLarge",
    "BodyUnavailable",
    "Budget",
    "ClientBody",
    "CoreRecord",
    "Cut",
    "Decider",
    "Decision",
    "Delivery",
    "Exchange",
    "Flow",
    "Next",
    "Pieces",
    "Policy",
    "Refuse",
    "Reply",
    "RequestBodyFilter",
    "ResponseBodyFilter",
    "Services",
    "SubRequest",
    "UpstreamError",
    "UpstreamFailed",
)


# --- what the parts of the gateway tell each other about an exchange -------------------------------------------


class UpstreamError(enum.StrEnum):
    """Why an upstream request got no (whole) answer: the ``kind`` of gateway_upstream_errors_total, and ``BUSY``
    when the tenant's turn in ``upstream.max_concurrent_per_tenant`` did not come."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    RESET = "reset"
    OTHER = "other"
    BUSY = "busy"


class Cut(enum.StrEnum):
    """Why the gateway itself cut an exchange short (``Exchange.cut``)."""

    SHUTDOWN = "shutdown"  # the shutdown deadline passed before it had started its answer


class Delivery:
    """What became of a reply: ``complete`` once its last byte was handed to the connection (lingering after it,
    and a client that leaves then, does not change what it was answered)."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False



# --- the proxy core's services to a policy ---------------------------------------------------------------------


class UpstreamFailed(Exception):
    """A request of a policy's own got no response head: ``kind`` says why; ``reply`` is what the proxy core would
    answer for it."""

    def __init__(self, kind: UpstreamError, reply: Reply) -> None:
        super().__init__(kind)
        self.kind = kind
        self.reply = reply


@dataclass(slots=True)
class SubRequest:
    """One request of a policy's own, as the proxy core sent it (the access log and the metrics read them)."""

    purpose: str  # what the policy named it (bounded: a metric label)
    method: str
    status: int | None = None  # the response head's; None when none came
    error: UpstreamError | None = None  # when no response head came
    seconds: float = 0.0  # from sending it to its response head (or its failure)

    def busy(self, seconds: float) -> None:
        self.error, self.seconds = UpstreamError.BUSY, seconds

    def failed(self, kind: UpstreamError, seconds: float) -> None:
        self.error, self.seconds = kind, seconds

    def answered(self, status: int, seconds: float) -> None:
        self.status, self.seconds = status, seconds


class Services(abc.ABC):
    """What the proxy core does for a policy besides forwarding its request: its own requests (``Exchange.fetch``)."""

    @abc.abstractmethod
    async def fetch(self, exchange: Exchange, method: str, path: str, *, query: str = "",
                    headers: Mapping[str, str] | None = None, body: bytes | AsyncIterator[bytes] | None = None,
                    purpose: str = "policy") -> Reply: ...


# --- the exchange -----------------------------------------------------------------------------------------------

Next = Callable[["Exchange"], Awaitable[Reply]]
Policy = Callable[["Exchange", Next], Awaitable[Reply]]


class _Unset:
    """Not worked out yet."""


_UNSET = _Unset()


class CoreRecord:
    """What the core saw of one exchange (the access log, the metrics and the traces read it; a policy may read it,
    never write it): set by the proxy core and the edge only."""

    __slots__ = ("upstream_seconds", "upstream_error", "upstream_error_kind", "upstream_retries", "subrequests",
                 "queue_full", "cut")

    def __init__(self) -> None:
        self.upstream_seconds: float | None = None  # from sending upstream to its response head
        self.upstream_error: str | None = None  # "<kind>: <error>", or "body_reset" / "body_timeout" mid-body
        self.upstream_error_kind: UpstreamError | None = None
        # Why a request was sent again ("unsent", "safe_method"): the client's, and those of a policy's own.
        self.upstream_retries: list[str] = []
        # The requests of a policy's own sent for this exchange (None until the first).
        self.subrequests: list[SubRequest] | None = None
        self.queue_full = False  # answered 503 UPSTREAM_BUSY: the tenant's turn did not come
        self.cut: Cut | None = None  # cut short by the gateway itself (a policy that undoes its work reads it)

    def upstream_failed(self, kind: UpstreamError, error: str) -> None:
        self.upstream_error_kind = kind
        self.upstream_error = error

    # The client's own upstream request records itself here (the proxy core's road: ``busy``, ``failed``,
    # ``answered``): its time to the response head, and a full queue; its failures are recorded with the answer
    # made for them.

    def busy(self, seconds: float) -> None:
        self.queue_full = True

    def failed(self, kind: UpstreamError, seconds: float) -> None:
        return

    def answered(self, status: int, seconds: float) -> None:
        self.upstream_seconds = seconds

    def subrequest(self, purpose: str, method: str) -> SubRequest:
        """A request of a policy's own, recorded as it is sent."""
        sub = SubRequest(purpose, method)
        if self.subrequests is None:
            self.subrequests = []
        self.subrequests.append(sub)
        return sub


class Exchange:
    """What the gateway knows about one request while it is being served; made once it is classified.

    A policy reads the request's classification (tenant, route, params, path, query, method, headers) and writes
    only ``method`` (its effective method), ``request_id``/``request_id_header``, ``upstream_headers``,
    ``decisions`` and ``notes``, and the body's filters (``body.add_filter``). ``record`` is the core's."""

    __slots__ = ("request", "start", "tenant", "route", "params", "path", "query", "method", "request_id",
                 "request_id_header", "upstream_headers", "decisions", "notes", "services", "trace",
                 "rollout_maker", "record", "_body", "_body_timeout", "_client", "_head_as_get", "_rollout")

    def __init__(self, request: web.BaseRequest, start: float, tenant: Tenant, route: Route,
                 params: dict[str, str], path: str, query: str, method: str, *, body_timeout: float = 60.0) -> None:
        self.request = request  # the client's request: the core reads its body; policies read the fields below
        self.start = start  # time.monotonic() when it arrived
        self.tenant = tenant
        self.route = route
        self.params = params  # the route template's path parameters
        self.path = path  # canonical path: what was classified and what the upstream receives
        self.query = query  # raw query string, without '?'
        # Effective method (method-override headers and ``_method`` included): what the upstream receives.
        self.method = method
        self.request_id: str | None = None
        # The header every upstream request of this exchange carries its id in (the client's own and each request
        # of a policy's own): the request_id policy's ``header``.
        self.request_id_header = "X-Request-Id"
        # Headers the upstream request gets on top of (value) or without (None) the client's.
        self.upstream_headers: dict[str, str | None] = {}
        # Policy name -> decision label, for the access log, the metrics and the usage report.
        self.decisions: dict[str, str] = {}
        # A policy's fields for the access-log line ("legacy_upload_guard.rule": the rule behind a refusal).
        self.notes: dict[str, str] = {}
        self.services: Services | None = None  # set by the gateway: the proxy core
        # Its place in a trace (set by the edge; None when it has none): every upstream request carries it on.
        self.trace: TraceContext | None = None
        # Its phase of each dated behaviour, decided once for the whole request: made by the edge's maker when a
        # policy first asks (a request that no dated policy serves allocates nothing for it).
        self.rollout_maker: Callable[[Exchange], Decider] | None = None
        self._rollout: Decider | None = None
        self.record = CoreRecord()
        self._body: ClientBody | None = None
        self._body_timeout = body_timeout  # server.client_body_timeout
        self._client: str | None | _Unset = _UNSET
        self._head_as_get = False

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The client's request headers, as received."""
        return self.request.headers

    @property
    def has_body(self) -> bool:
        return self.request.body_exists

    def answer_from_body(self) -> None:
        """Said by a policy that answers from the upstream's body (rewrites it): a HEAD request is then sent upstream
        as GET, so that its answer carries GET's headers, and the client gets the head only (RFC 9110 9.3.2)."""
        self._head_as_get = True

    @property
    def upstream_method(self) -> str:
        """The method the upstream is sent: the effective method, but GET for a HEAD answered from the body."""
        return "GET" if self._head_as_get and self.method == "HEAD" else self.method

    @property
    def body(self) -> ClientBody:
        """The client's body, read once through one pipeline (``core.client_body``): made when first asked for."""
        body = self._body
        if body is None:
            body = self._body = ClientBody(self.request, self._body_timeout, self.ensure_request_id)
        return body

    @property
    def body_error(self) -> BodyError | None:
        """Why the client's body could not be read to its end (None: it was, or it was not read)."""
        return None if self._body is None else self._body.error

    def close_body(self) -> None:
        """The exchange is over (the edge's record): the body's idle deadline, if any, goes."""
        if self._body is not None:
            self._body.close()

    @property
    def client(self) -> str | None:
        """The client's token fingerprint (``core.http.token_fingerprint``), worked out once per request."""
        client = self._client
        if isinstance(client, _Unset):
            client = self._client = token_fingerprint(self.request.headers.get(hdrs.AUTHORIZATION))
        return client

    async def fetch(self, method: str, path: str, *, query: str = "", headers: Mapping[str, str] | None = None,
                    body: bytes | AsyncIterator[bytes] | None = None, purpose: str = "policy") -> Reply:
        """A request of the policy's own to this tenant's upstream: ``path`` and ``query`` as they go on the wire
        (percent-encoded), ``headers`` on top of what the client's own request would carry of the gateway's: Host,
        the forwarding headers (``X-Forwarded-*``, ``Forwarded``, ``Via``) and the request id. No other header of
        the client's is sent unless given here (a bridge passes the client's own ``Authorization``, never another).
        ``purpose`` names it in the metrics and the access log (a few lower-case words joined by ``_``).

        It waits for the tenant's turn and is retried like a forwarded request; its answer's body streams (read it
        with ``reply.read(cap)``, or let it go with ``reply.discard()``). ``UpstreamFailed`` when no response head
        came; the caller bounds the total time (``asyncio.timeout``)."""
        if self.services is None:
            raise RuntimeError("this exchange is not served by a proxy core")
        return await self.services.fetch(self, method, path, query=query, headers=headers, body=body, purpose=purpose)

    @property
    def rollout(self) -> Decider | None:
        """The request's rollout, made when first asked for (None without the edge's maker)."""
        rollout = self._rollout
        if rollout is None and self.rollout_maker is not None:
            rollout = self._rollout = self.rollout_maker(self)
        return rollout

    @rollout.setter
    def rollout(self, value: Decider | None) -> None:
        self._rollout = value

    @property
    def rollout_made(self) -> Decider | None:
        """The request's rollout if a policy asked for it, without making one."""
        return self._rollout

    def decide(self, behaviour: str) -> Decision:
        """This request's phase of a dated behaviour (the same for every policy of the request)."""
        rollout = self.rollout
        if rollout is None:
            raise RuntimeError("this exchange has no rollout (the edge sets it)")
        return rollout.decide(behaviour)

    def ensure_request_id(self) -> str:
        """This request's id; one is made now if no ``request_id`` policy made one (an error answer names it)."""
        if self.request_id is None:
            self.request_id = new_request_id()
        return self.request_id
