"""The effective method of a request, in one place: the request line's, unless an override header, the query's
``_method`` or a form body's ``_method`` field names another (as Rack, Symfony, Laravel and Express read them).

Overrides that disagree, or one that is not a method, are ``400 AMBIGUOUS_METHOD``. A form body is read only where
its override could land the request on a guarded route, and only up to ``server.method_override_look_ahead``: it
is peeked at through the client body's pipeline (``FormMethod``), the bytes read go upstream first, and a multipart
body's rest is read on as it streams.
docs/proxying.md, "Method overrides", has the rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qsl

from multidict import CIMultiDictProxy, istr

from ..core.exchange import BodyBroken, Exchange, Flow, Refuse, Reply, RequestBodyFilter
from ..core.multipart import (
    Ambiguous,
    Boundary,
    MediaType,
    MultipartReader,
    PartHeaders,
    Read,
    form_data_boundary,
    request_media_type,
)
from .route_table import PathMatches
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


def effective_method(method: str, headers: CIMultiDictProxy[str], query: str) -> tuple[str, set[str]]:
    """The method an upstream may act on: the request line's, unless an override header or ``_method`` says
    otherwise; and the overrides found (a form body's ``_method`` is weighed against them, ``form_method``).

    Several overrides that disagree are refused: the gateway cannot know which one the upstream honours. (A form
    body's ``_method`` is read once the route is known, where it matters: ``form_method``.)
    """
    overrides = method_overrides(headers, query)
    return (valid_override(method, overrides) if overrides else method), overrides


# --- a form body's _method --------------------------------------------------------------------------------------

# A Content-Type that is not a clean form but that some parser could still read as one.
_MENTIONS_FORM_RE = re.compile(r"multipart|boundary|form-data|urlencoded", re.IGNORECASE)
_MAX_VALUE = 64  # longest _method value read (a method name is a short token)
_MAX_PART_HEADER_BYTES = 16 << 10  # longest part header block read
# After an early answer, how much of the rest of the body is read and dropped, for how long, before closing.
_LINGER = (4 << 20, 2.0)


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


class _MultipartFields(RequestBodyFilter):
    """A multipart form body's ``_method`` parts. Peeked at first: held until a ``_method`` value, a file part or
    the end shows (up to the look-ahead); then, once the request is classified by it (``watch``), read on as the
    body streams upstream (the first request filter: it sees the client's bytes): a ``_method`` part that names
    another method, or a structure in doubt, breaks the upstream request off."""

    def __init__(self, exchange: Exchange, boundary: Boundary, look_ahead: int) -> None:
        self._exchange = exchange
        self.finder = _OverrideFinder(boundary)
        self.hold_limit = look_ahead
        self.ended = False
        self._method: str | None = None  # set by ``watch``: the method the request was classified by
        self._seen = 0

    def values(self) -> tuple[list[str], list[str]]:
        """The ``_method`` values before the first file part, and those after it."""
        finder = self.finder
        split = finder.values_before_file if finder.file_seen else len(finder.values)
        return finder.values[:split], finder.values[split:]

    def watch(self, method: str) -> None:
        self._method = method
        self._seen = len(self.finder.values)

    def on_data(self, chunk: bytes) -> Flow:
        finder = self.finder
        self._check(lambda: finder.feed(chunk))
        if self._method is None:
            if finder.pending is not None:
                raise Refuse(_unreadable(self._exchange, finder.pending))
            if not (finder.values or finder.file_seen):
                return Flow.HOLD
        return Flow.CONTINUE

    def on_end(self) -> Flow:
        self.ended = True
        self._check(self.finder.feed_eof)
        return Flow.CONTINUE

    def on_hold_limit(self) -> Flow:
        raise Refuse(_undecided(self._exchange, self.hold_limit))

    def _check(self, step: Callable[[], object]) -> None:
        finder = self.finder
        try:
            step()
        except Ambiguous as err:
            raise Refuse(_unreadable(self._exchange, err)) from None
        if self._method is not None:
            late = any(v != self._method for v in finder.values[self._seen :])
            self._seen = len(finder.values)
            if late:
                raise Refuse(_late(self._exchange))


class _UrlencodedFields(RequestBodyFilter):
    """A urlencoded form body's ``_method`` fields: the whole body held (up to the look-ahead), read at its end."""

    def __init__(self, exchange: Exchange, look_ahead: int) -> None:
        self._exchange = exchange
        self.hold_limit = look_ahead
        self._chunks: list[bytes] = []
        self.found: list[str] = []
        self.ended = False

    def values(self) -> tuple[list[str], list[str]]:
        return self.found, []

    def on_data(self, chunk: bytes) -> Flow:
        self._chunks.append(chunk)
        return Flow.HOLD

    def on_end(self) -> Flow:
        self.ended = True
        found = override_fields(b"".join(self._chunks).decode("latin-1"), encoding="latin-1")
        if any(len(value) > _MAX_VALUE for value in found):
            raise Refuse(_unreadable(self._exchange, Ambiguous(
                "override_value_too_long", f"the {OVERRIDE_FIELD} field is too long for a method")))
        self.found = found
        return Flow.CONTINUE

    def on_hold_limit(self) -> Flow:
        raise Refuse(_undecided(self._exchange, self.hold_limit))


def _undecided(exchange: Exchange, look_ahead: int) -> Reply:
    return _refusal(exchange, 413, "METHOD_OVERRIDE_UNDECIDED", "look_ahead_exceeded",
                    f"the form body shows neither its {OVERRIDE_FIELD} field, a file part nor its end within "
                    f"{look_ahead} bytes")


def _form_kind(headers: CIMultiDictProxy[str]) -> str | Boundary | None:
    """"urlencoded", a multipart boundary, or None (a body no framework reads ``_method`` from); Ambiguous."""
    values = headers.getall("Content-Type", [])
    if not values:
        return "urlencoded"  # Rack reads the body of a POST without Content-Type as a form
    media = request_media_type(values, _MENTIONS_FORM_RE)
    kind = None if media is None else _media_kind(media, values[0])
    if kind is None or "Content-Encoding" not in headers:
        return kind
    if isinstance(kind, Boundary):
        return None  # no multipart parser decodes a request's Content-Encoding: the upstream reads no field in it
    # Express's body-parser inflates an encoded urlencoded body, and its method-override reads the field then.
    raise Ambiguous("content_encoding", "a form body that could carry a method override must not be encoded")


def _media_kind(media: MediaType, value: str) -> str | Boundary | None:
    """The form a Content-Type (``value``, read as ``media``) names, if any."""
    if media.essence == "application/x-www-form-urlencoded":
        return "urlencoded"
    if media.type == "multipart":
        return form_data_boundary(media)
    if _MENTIONS_FORM_RE.search(value):
        raise Ambiguous("content_type_mentions_form", f"a {media.essence} Content-Type names a form")
    return None


class FormMethod:
    """The last step of classification, made only where a POST's form body could carry a ``_method`` that routes it
    to a guarded route (``RouteTable``'s ``override_reaches_guard``): the body is peeked at, bounded, and the
    exchange classified by what it says (method, route). The bytes read go upstream first; a multipart body's rest
    is read on as it streams."""

    __slots__ = ("_overrides", "_matches", "_look_ahead")

    def __init__(self, overrides: set[str], matches: PathMatches, look_ahead: int) -> None:
        self._overrides = overrides  # the header's and the query's (classification's first step)
        self._matches = matches
        self._look_ahead = look_ahead

    async def read(self, exchange: Exchange) -> Reply | None:
        """Classify ``exchange`` by its form body; the answer when the request is refused."""
        try:
            kind = _form_kind(exchange.headers)
        except Ambiguous as err:
            return _unreadable(exchange, err)
        if kind is None:
            return None
        fields: _MultipartFields | _UrlencodedFields
        if isinstance(kind, Boundary):
            fields = _MultipartFields(exchange, kind, self._look_ahead)
        else:
            fields = _UrlencodedFields(exchange, self._look_ahead)
        body = exchange.body
        try:
            await body.peek(fields)
        except BodyBroken as broken:
            return broken.reply  # the core's answer to a broken body
        except Refuse as refused:
            return refused.reply
        return self._classify(exchange, fields)

    def _classify(self, exchange: Exchange, fields: _MultipartFields | _UrlencodedFields) -> Reply | None:
        values, late = fields.values()
        method = exchange.method
        if values:
            overrides = self._overrides | set(values)
            try:
                method = valid_override(exchange.request.method, overrides)
            except BadRequestTarget as err:
                return _ambiguous(exchange, "disagreeing_overrides" if len(overrides) > 1 else "invalid_override",
                                  err.message)
            exchange.notes["method_override"] = "body"
        if any(value != method for value in late):
            return _late(exchange)
        self._settle(exchange, fields, method)
        return None

    def _settle(self, exchange: Exchange, fields: _MultipartFields | _UrlencodedFields, method: str) -> None:
        """The exchange routed by the body's method; a multipart body's rest watched for a late one."""
        if method != exchange.method:
            exchange.route, exchange.params = self._matches.route(method)
            exchange.method = method
        if isinstance(fields, _MultipartFields) and not fields.ended:
            fields.watch(method)
            exchange.body.add_filter(fields, peeked=True)  # the first filter: no policy has run yet


def form_method(exchange: Exchange, overrides: set[str], matches: PathMatches, look_ahead: int) -> FormMethod | None:
    """The form-body step for this request, where it could matter: a POST with a body, whose form body's
    ``_method`` could route it to a guarded route; None for every other request (nothing is read)."""
    if exchange.request.method != "POST" or not exchange.has_body:
        return None
    if not matches.override_reaches_guard(exchange.route):
        return None
    return FormMethod(overrides, matches, look_ahead)
