"""A form body's ``_method`` field: the method override that a header or the query would carry, sent in the body.

Rack, Symfony, Laravel and Express's method-override read ``_method`` from the body of a POST form. A client can
then send ``POST /api/v1/cards/1/files`` (the restricted upload route, not guarded) with ``_method=PUT`` and a file:
to such an upstream it is the deprecated ``PUT /cards/{card_id}/files``, which the forbid setting refuses. The edge
reads the override before the chain runs, on the requests where it could land on a guarded route only (a POST with a
form body, on a path where another method reaches a route whose chain enforces a security behaviour):

- ``application/x-www-form-urlencoded`` (and a POST without Content-Type, which Rack reads as one): the whole body,
  up to ``server.method_override_look_ahead``, every ``_method`` pair (``&`` and ``;`` separators);
- ``multipart/form-data``: the part headers until a ``_method`` part and its value, a file part, or the end, up to
  the same bound. The rest streams upstream while its part headers keep being read: a ``_method`` part after a file
  part (too late to choose the chain) that names another method breaks the upstream request off, so that the
  upstream never receives the complete body, and is answered 400.

The override joins the header and query overrides: one method, and the request is classified (and sent upstream)
by it; several that disagree, a value that is not a method, or a body whose structure parsers could read apart is
``400 AMBIGUOUS_METHOD``; a body that shows nothing decisive within the bound is ``413 METHOD_OVERRIDE_UNDECIDED``.
What was read is sent upstream first (``Exchange.body_prefix``), byte for byte. Uploads without an override are not
held: a multipart body streams from its first file part on.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

from multidict import CIMultiDictProxy

from ..core.exchange import Exchange, Flow, Refuse, Reply, RequestBodyFilter
from ..core.routing import (
    OVERRIDE_FIELD,
    BadRequestTarget,
    RouteTable,
    method_overrides,
    override_fields,
    valid_override,
)
from ..policies.legacy_upload_guard.multipart_sniffer import (
    Ambiguous,
    Boundary,
    MultipartSniffer,
    form_data_boundary,
    request_media_type,
)
from .core import body_error_reply
from .request_body import client_chunks

__all__ = ("resolve_body_override",)

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


class _OverrideFinder(MultipartSniffer):
    """The multipart sniffer, reading every part's headers to the end (a file part does not stop it) and collecting
    the values of ``_method`` parts."""

    def __init__(self, boundary: Boundary) -> None:
        super().__init__(boundary, max_header_bytes=_MAX_PART_HEADER_BYTES)
        self.values: list[str] = []
        self.file_seen = False
        self.values_before_file = 0  # how many of ``values`` came before the first file part
        self._part_names: list[str] = []
        self._capturing = False
        self._value = bytearray()

    def _has_filename(self, raw: str, names: list[str]) -> bool:
        found = super()._has_filename(raw, names)
        self._part_names = names
        return found

    def _classify_part(self, block: bytes) -> str | None:
        self._part_names = []
        reason = super()._classify_part(block)
        if any(name.lower() == OVERRIDE_FIELD for name in self._part_names):
            if reason is not None:
                raise Ambiguous("override_file_part", f"the {OVERRIDE_FIELD} part is a file part ({reason})")
            self._capturing = True
            self._value = bytearray()
        elif reason is not None and not self.file_seen:
            self.file_seen = True
            self.values_before_file = len(self.values)
        return None  # never a finding: the sniffer reads on

    def _take(self, n: int) -> None:
        if self._capturing and n > 0:
            self._content(bytes(self._buf[:n]), n)
        super()._take(n)

    def _content(self, data: bytes, end: int) -> None:
        if self._capturing:
            self._value += data[:end]
            if len(self._value) > _MAX_VALUE:
                raise Ambiguous("override_value_too_long", f"the {OVERRIDE_FIELD} part is too long for a method")

    def _part_end(self) -> None:
        if self._capturing:
            self._capturing = False
            self.values.append(self._value.decode("latin-1").strip().upper())


class _TailWatch(RequestBodyFilter):
    """The rest of a multipart body, read on as it streams upstream: a ``_method`` part that names another method
    than the request was classified by, or a structure in doubt, breaks the upstream request off."""

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


async def resolve_body_override(exchange: Exchange, routes: RouteTable, *, look_ahead: int, timeout: float
                                ) -> Reply | None:
    """Read a form body's ``_method`` where it could route the request to a guarded route, and classify the exchange
    by it (route, params, method); an answer when the request is refused. Does nothing on other requests."""
    request = exchange.request
    if request.method != "POST" or not exchange.has_body or not routes.override_reaches_guard(exchange.route,
                                                                                               exchange.path):
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
    exchange.body_prefix = prefix
    overrides = method_overrides(headers, exchange.query) | set(values)
    method = exchange.method
    if values:
        try:
            method = valid_override(request.method, overrides)
        except BadRequestTarget as err:
            return _ambiguous(exchange, "disagreeing_overrides" if len(overrides) > 1 else "invalid_override",
                              err.message)
        exchange.notes["method_override"] = "body"
        if method != exchange.method:
            exchange.route, exchange.params = routes.match(method, exchange.path)
            exchange.method = method
    if any(value != method for value in late):
        return _late(exchange)
    if finder is not None and not ended:
        # The rest streams; its part headers are read on (first in filter order: it sees the client's bytes).
        exchange.request_filters.insert(0, _TailWatch(exchange, finder, sum(map(len, prefix)), method))
    return None


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
