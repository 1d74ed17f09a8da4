"""The effective method of a request, in one place: the request line's, unless an override header, the query's
``_method`` or a form body's ``_method`` field names another (as Rack, Symfony, Laravel and Express read them).

Overrides that disagree, or one that is not a method, are ``400 AMBIGUOUS_METHOD``. A form body is read only where
its override could land the request on a guarded route, and only up to ``server.method_override_look_ahead``; the
bytes read go upstream first (``FormMethod.prefix``), the rest is read on as it streams (``FormMethod.watch``).
docs/proxying.md, "Method overrides", has the rules.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from multidict import CIMultiDictProxy, istr

from ..core.exchange import Exchange, Flow, Refuse, Reply, RequestBodyFilter
from ..core.multipart import (
    Ambiguous,
    Boundary,
    MultipartReader,
    PartHeaders,
    Read,
    form_data_boundary,
    request_media_type,
)
from ..proxy.core import body_error_reply
from ..proxy.request_body import client_chunks
from .route_table import RouteTable
from .target import BadRequestTarget

__all__ = (
    "METHOD_OVERRIDE_HEADERS",
    "OVERRIDE_FIELD",
    "FormMethod",
    "effective_method",
    "form_method",
    "method_overrides",
    "override_fields",
    "valid_override",
)

_TOKEN_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

METHOD_OVERRIDE_HEADERS = (istr("X-HTTP-Method-Override"), istr("X-Method-Override"), istr("X-HTTP-Method"))
# The form field (in the query, or in a form body) that Rack, Symfony, Laravel and Express's method-override read as
# the method.
OVERRIDE_FIELD = "_method"




def method_overrides(headers: CIMultiDictProxy[str], query: str) -> set[str]:
    """The methods the override headers and the query's ``_method`` name (upper-cased; empty: no override)."""
    overrides: set[str] = set()
    for name in METHOD_OVERRIDE_HEADERS:
        if name in headers:
            overrides.update(v.strip().upper() for v in headers.getall(name))
    if query:
        overrides.update(override_fields(query))
    return overrides


def override_fields(form: str, encoding: str = "utf-8") -> list[str]:
    """The values of the ``_method`` fields of a query or of a urlencoded form body (upper-cased, in order)."""
    if OVERRIDE_FIELD not in (lowered := form.lower()) and "%" not in lowered:
        return []  # no field can be named _method
    # Some frameworks split a form on ';' as well as '&' (HTML 4's recommendation, older Python, Perl's CGI):
    # "?a=1;_method=PUT" is an override there.
    pairs = parse_qsl(form.replace(";", "&"), keep_blank_values=True, encoding=encoding)
    return [v.strip().upper() for k, v in pairs if k.lower() == OVERRIDE_FIELD]


def valid_override(method: str, overrides: set[str]) -> str:
    """The one method ``overrides`` agree on, for a request sent with ``method``; BadRequestTarget otherwise."""
    if len(overrides) > 1:
        raise BadRequestTarget("AMBIGUOUS_METHOD", "the request carries method overrides that disagree")
    (override,) = overrides
    if not _TOKEN_RE.fullmatch(override):
        raise BadRequestTarget("AMBIGUOUS_METHOD", "the method override is not a valid method name")
    if override in ("HEAD", "CONNECT") and override != method:
        # The upstream receives the effective method: a HEAD answer has no body for the client's non-HEAD request.
        raise BadRequestTarget("AMBIGUOUS_METHOD", f"a method override to {override} is not accepted")
    return override


def effective_method(method: str, headers: CIMultiDictProxy[str], query: str) -> str:
    """The method an upstream may act on: the request line's, unless an override header or ``_method`` says otherwise.

    Several overrides that disagree are refused: the gateway cannot know which one the upstream honours. (A form
    body's ``_method`` is read once the route is known, where it matters: ``form_method``.)
    """
    overrides = method_overrides(headers, query)
    return valid_override(method, overrides) if overrides else method


# --- a form body's _method --------------------------------------------------------------------------------------

# A Content-Type that is not a clean form but that some parser could still read as one.
_MENTIONS_FORM_RE = re.compile(r"multipart|boundary|form-data|urlencoded", re.IGNORECASE)
_MAX_VALUE = 64  # longest _method value read (a method name is a short token)
_MAX_PART_HEADER_BYTES = 16 << 10  # longest part header block read
# After an early answer, how much of the rest of the body is read and dropped, for how long, before closing.
_LINGER = (4 << 20, 2.0)


class _Undecided(Exception):
    """The body showed no decision within the bound."""


def _refusal(exchange: Exchange, status: int, code: str, rule: str, message: str) -> Reply:
    exchange.notes["method_override.rule"] = rule
    reply = Reply.error(status, code, message, exchange.ensure_request_id(), rule=rule)
    reply.linger = _LINGER
    reply.close_connection = True
    return reply


def _ambiguous(exchange: Exchange, rule: str, message: str) -> Reply:
    return _refusal(exchange, 400, "AMBIGUOUS_METHOD", rule, message)


def _unreadable(exchange: Exchange, err: Ambiguous) -> Reply:
    return _ambiguous(exchange, err.rule, f"the form body cannot be read unambiguously: {err.message}")


def _late(exchange: Exchange) -> Reply:
    return _ambiguous(exchange, "late_override",
                      f"a {OVERRIDE_FIELD} field after a file part names another method than the request was sent as")


class _OverrideFinder:
    """Reads every part's headers to the end of the body (a file part does not stop it), collecting the values of
    ``_method`` parts; the rules it breaks are the core reader's (``pending``: the first broken in a part's headers)."""

    def __init__(self, boundary: Boundary) -> None:
        self._reader = MultipartReader(boundary, self, max_header_bytes=_MAX_PART_HEADER_BYTES)
        self.values: list[str] = []
        self.file_seen = False
        self.values_before_file = 0  # how many of ``values`` came before the first file part
        self._value: bytearray | None = None  # the ``_method`` part being read

    @property
    def pending(self) -> Ambiguous | None:
        return self._reader.pending

    def feed(self, data: bytes) -> None:
        self._reader.feed(data)

    def feed_eof(self) -> None:
        self._reader.close()

    # --- the reader's events ---------------------------------------------------------------------------------------

    def on_part(self, part: PartHeaders) -> Read:
        if any(name.lower() == OVERRIDE_FIELD for name in part.names):
            if part.file_reason is not None:
                raise Ambiguous("override_file_part", f"the {OVERRIDE_FIELD} part is a file part ({part.file_reason})")
            self._value = bytearray()
            return Read.CONTENT
        if part.file_reason is not None and not self.file_seen:
            self.file_seen = True
            self.values_before_file = len(self.values)
        return Read.SKIP

    def on_content(self, data: bytes) -> None:
        assert self._value is not None
        self._value += data
        if len(self._value) > _MAX_VALUE:
            raise Ambiguous("override_value_too_long", f"the {OVERRIDE_FIELD} part is too long for a method")

    def on_part_end(self) -> None:
        if self._value is not None:
            self.values.append(self._value.decode("latin-1").strip().upper())
            self._value = None


class _TailWatch(RequestBodyFilter):
    """The rest of a multipart body, read on as it streams upstream (the first request filter: it sees the client's
    bytes): a ``_method`` part that names another method than the request was classified by, or a structure in
    doubt, breaks the upstream request off."""

    def __init__(self, exchange: Exchange, finder: _OverrideFinder, skip: int, method: str) -> None:
        self._exchange = exchange
        self._finder = finder
        self._skip = skip  # bytes the edge fed already (they are sent again first, from ``body_prefix``)
        self._method = method
        self._seen = len(finder.values)

    def on_data(self, chunk: bytes) -> Flow:
        if self._skip:
            taken = min(self._skip, len(chunk))
            self._skip -= taken
            chunk = chunk[taken:]
            if not chunk:
                return Flow.CONTINUE
        self._check(lambda: self._finder.feed(chunk))
        return Flow.CONTINUE

    def on_end(self) -> Flow:
        self._check(self._finder.feed_eof)
        return Flow.CONTINUE

    def _check(self, step: Callable[[], object]) -> None:
        finder = self._finder
        try:
            step()
        except Ambiguous as err:
            raise Refuse(_unreadable(self._exchange, err)) from None
        late = any(v != self._method for v in finder.values[self._seen :])
        self._seen = len(finder.values)
        if late:
            raise Refuse(_late(self._exchange))


def _form_kind(headers: CIMultiDictProxy[str]) -> str | Boundary | None:
    """"urlencoded", a multipart boundary, or None (a body no framework reads ``_method`` from); Ambiguous."""
    values = headers.getall("Content-Type", [])
    if not values:
        return "urlencoded"  # Rack reads the body of a POST without Content-Type as a form
    media = request_media_type(values, _MENTIONS_FORM_RE)
    if media is None:
        return None
    value = values[0]
    if media.essence == "application/x-www-form-urlencoded":
        kind: str | Boundary = "urlencoded"
    elif media.type == "multipart":
        kind = form_data_boundary(media)
    elif _MENTIONS_FORM_RE.search(value):
        raise Ambiguous("content_type_mentions_form", f"a {media.essence} Content-Type names a form")
    else:
        return None
    if "Content-Encoding" in headers:
        if isinstance(kind, Boundary):
            return None  # no multipart parser decodes a request's Content-Encoding: the upstream reads no field in it
        # Express's body-parser inflates an encoded urlencoded body, and its method-override reads the field then.
        raise Ambiguous("content_encoding", "a form body that could carry a method override must not be encoded")
    return kind


@dataclass(frozen=True, slots=True)
class FormMethod:
    """What a form body says: its ``_method`` (None: it has none before a file part), the bytes read of it (sent
    upstream first), and the watch over the rest of it as it streams (None when it was read to its end)."""

    method: str | None
    prefix: list[bytes]
    watch: RequestBodyFilter | None


def reads_form_method(exchange: Exchange, routes: RouteTable) -> bool:
    """Whether ``form_method`` reads anything of this request: a POST with a body, whose form body's ``_method``
    could route it to a guarded route."""
    return exchange.request.method == "POST" and exchange.has_body and routes.override_reaches_guard(exchange.route,
                                                                                                  exchange.path)


async def form_method(exchange: Exchange, routes: RouteTable, *, look_ahead: int, timeout: float
                      ) -> FormMethod | Reply | None:
    """A form body's ``_method``, read where it could route the request to a guarded route; an answer when the
    request is refused; None on other requests (nothing is read)."""
    if not reads_form_method(exchange, routes):
        return None
    headers = exchange.headers
    try:
        kind = _form_kind(headers)
    except Ambiguous as err:
        return _unreadable(exchange, err)
    if kind is None:
        return None
    prefix: list[bytes] = []
    source = client_chunks(exchange, timeout)
    try:
        finder: _OverrideFinder | None = None
        late: list[str] = []
        if isinstance(kind, Boundary):
            finder = _OverrideFinder(kind)
            ended = await _read_multipart(source, prefix, finder, look_ahead)
            split = finder.values_before_file if finder.file_seen else len(finder.values)
            values, late = finder.values[:split], finder.values[split:]
        else:
            values = await _read_urlencoded(source, prefix, look_ahead)
            ended = True
    except ConnectionError:
        return body_error_reply(exchange)  # the proxy core's answer to a broken body
    except Ambiguous as err:
        return _unreadable(exchange, err)
    except _Undecided:
        return _refusal(exchange, 413, "METHOD_OVERRIDE_UNDECIDED", "look_ahead_exceeded",
                        f"the form body shows neither its {OVERRIDE_FIELD} field, a file part nor its end within "
                        f"{look_ahead} bytes")
    finally:
        await source.aclose()
    method = exchange.method
    if values:
        overrides = method_overrides(headers, exchange.query) | set(values)
        try:
            method = valid_override(exchange.request.method, overrides)
        except BadRequestTarget as err:
            return _ambiguous(exchange, "disagreeing_overrides" if len(overrides) > 1 else "invalid_override",
                              err.message)
        exchange.notes["method_override"] = "body"
    if any(value != method for value in late):
        return _late(exchange)
    # The rest streams; its part headers are read on.
    watch = _TailWatch(exchange, finder, sum(map(len, prefix)), method) if finder is not None and not ended else None
    return FormMethod(method if values else None, prefix, watch)


async def _read_urlencoded(source: AsyncIterator[bytes], prefix: list[bytes], look_ahead: int) -> list[str]:
    size = 0
    async for chunk in source:
        prefix.append(chunk)
        size += len(chunk)
        if size > look_ahead:
            raise _Undecided
    values = override_fields(b"".join(prefix).decode("latin-1"), encoding="latin-1")
    if any(len(value) > _MAX_VALUE for value in values):
        raise Ambiguous("override_value_too_long", f"the {OVERRIDE_FIELD} field is too long for a method")
    return values


async def _read_multipart(source: AsyncIterator[bytes], prefix: list[bytes], finder: _OverrideFinder,
                          look_ahead: int) -> bool:
    """Until the first ``_method`` value or file part (the rest is read on as it streams), or the end (True)."""
    size = 0
    async for chunk in source:
        prefix.append(chunk)
        size += len(chunk)
        finder.feed(chunk)
        if finder.pending is not None:
            raise finder.pending
        if finder.values or finder.file_seen:
            return False  # the rest streams (and is read on by _TailWatch)
        if size > look_ahead:
            raise _Undecided
    finder.feed_eof()
    return True
