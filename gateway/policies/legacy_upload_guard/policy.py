"""legacy_upload_guard: the company setting "Forbid uploading files without restricted access through the public API".

Spec, "Deprecated upload routes and their replacements", "Errors" and "States and transitions": with the setting on,
an upload through a deprecated route is answered 403 ``PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED`` and nothing of it
reaches the upstream; with it off, the upload passes and the response says that the route is deprecated (RFC 9745).
A security policy: a body it cannot read unambiguously is refused, never forwarded. docs/policies/legacy_upload_guard.md
lists every rule.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDictProxy
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...core.http import ensure_continue
from .multipart_sniffer import (
    Ambiguous,
    Boundary,
    MalformedValue,
    MultipartSniffer,
    Verdict,
    form_data_boundary,
    parse_media_type,
)
from ...core.exchange import CTX, Handler, Middleware, RequestContext

if TYPE_CHECKING:
    from ...core.tenants import Tenant
    from .. import BuildContext

__all__ = ("DISABLED_CODE", "NAME", "Options", "build", "forbid_in_force")

NAME = "legacy_upload_guard"
DISABLED_CODE = "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
DEFAULT_MESSAGE = (
    "Uploading files outside restricted file access is disabled for the public API by company settings."
)
# Spec, "Versioning" 3: the date from which new companies have the forbid setting on.
DEFAULT_DEPRECATED_SINCE = dt.date(2026, 5, 21)

_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SUCCESSOR_PATTERN = r"^/(?:[A-Za-z0-9\-._~!$&'()*+,=:@/]|%[0-9A-Fa-f]{2}|\{[A-Za-z_][A-Za-z0-9_]*\})*$"
# A Content-Type that is not a clean multipart/form-data but that some parser could still take for one.
_MENTIONS_MULTIPART_RE = re.compile(r"multipart|boundary|form-data", re.IGNORECASE)
_STATUS_OF_RULE = {"content_encoding": 415, "look_ahead_exceeded": 413, "body_timeout": 408}
_CODE_OF_STATUS = {
    400: "LEGACY_UPLOAD_AMBIGUOUS",
    408: "LEGACY_UPLOAD_TIMEOUT",
    413: "LEGACY_UPLOAD_UNDECIDED",
    415: "LEGACY_UPLOAD_ENCODED",
}
# What reading a request body raises when the client goes away or breaks the framing mid-body.
_BODY_ERRORS = (ConnectionError, aiohttp.ClientPayloadError, HttpProcessingError)


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # "route": the route exists to upload (PUT .../files): decided from method, route and headers, body unread.
    # "file_parts": an upload only when the multipart body has a file part (comment routes): part headers are read.
    detect: Literal["route", "file_parts"]
    # Path of the replacement route; {placeholders} naming this route's path parameters are filled in.
    successor: str = Field(pattern=_SUCCESSOR_PATTERN, max_length=500)
    successor_method: str = Field(default="POST", pattern=r"^[A-Z]+$")
    # The Deprecation header's date (a date is midnight in rollout.timezone).
    deprecated_since: dt.datetime | dt.date = DEFAULT_DEPRECATED_SINCE
    message: str = Field(default=DEFAULT_MESSAGE, min_length=1, max_length=500)
    # How much of a multipart body may be read (and held) before it must have shown a file part or its end.
    look_ahead_bytes: int = Field(default=1 << 20, ge=64 << 10, le=64 << 20)
    max_part_header_bytes: int = Field(default=16 << 10, ge=1 << 10, le=1 << 20)
    # Longest silence while the part headers are being read (the upstream, which would time out a slow body,
    # is not involved yet).
    body_read_timeout: float = Field(default=30.0, gt=0, le=3600)
    # Field names that are files whatever their part headers say (the upstream reads them as files); "files"
    # also covers "files[]" and "files[0]".
    file_fields: tuple[str, ...] = ("files", "file")
    # After an early answer: how much of the rest of the body to read and drop, for how long at most, before
    # closing, so that the client can read the answer before the connection is reset.
    linger_bytes: int = Field(default=4 << 20, ge=0, le=1 << 30)
    linger_seconds: float = Field(default=2.0, ge=0, le=60)

    @field_validator("file_fields")
    @classmethod
    def _valid_fields(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_.\-]+(\[\])?", n)]
        if bad:
            raise ValueError(f"invalid field names {bad!r}")
        return names

    @model_validator(mode="after")
    def _consistent(self) -> Options:
        if self.max_part_header_bytes > self.look_ahead_bytes:
            raise ValueError("max_part_header_bytes must not exceed look_ahead_bytes")
        return self


def forbid_in_force(tenant: Tenant, now: dt.datetime, headers: Mapping[str, str]) -> bool:
    """Whether uploads through deprecated routes are forbidden for this company, for this request, at ``now``.

    The one place that decides it: a dated, per-tenant rollout of the setting replaces this function's body.
    """
    return tenant.forbid_legacy_uploads


@dataclass(frozen=True, slots=True)
class _Successor:
    """The replacement route, split once into literals and path parameters."""

    method: str
    pieces: tuple[tuple[str, bool], ...]  # (text, is a parameter of this route)

    @classmethod
    def compile(cls, method: str, template: str, params: frozenset[str]) -> _Successor:
        pieces: list[tuple[str, bool]] = []
        pos = 0
        for m in _PLACEHOLDER_RE.finditer(template):
            pieces.append((template[pos : m.start()], False))
            known = m.group(1) in params
            pieces.append((m.group(1) if known else m.group(0), known))
            pos = m.end()
        pieces.append((template[pos:], False))
        return cls(method, tuple(p for p in pieces if p[0]))

    def render(self, params: Mapping[str, str]) -> tuple[str, str]:
        """(path for people, URI reference for the Link header: unknown placeholders percent-encoded)."""
        text = "".join(params.get(t, t) if known else t for t, known in self.pieces)
        return text, text.replace("{", "%7B").replace("}", "%7D")


@dataclass(frozen=True, slots=True)
class _Settings:
    """Everything the middleware needs, built once: the options and what is derived from them."""

    options: Options
    successor: _Successor
    deprecation: str  # the Deprecation header's value
    counters: Mapping[str, Any]  # decision -> this route's counter

    def sniffer(self, boundary: Boundary) -> MultipartSniffer:
        options = self.options
        return MultipartSniffer(
            boundary, max_header_bytes=options.max_part_header_bytes, file_fields=options.file_fields
        )


def _epoch(value: dt.datetime | dt.date, tz: dt.tzinfo) -> int:
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return int(value.timestamp())


def _route_params(config: Any, route_name: str) -> frozenset[str]:
    for route in getattr(config, "routes", ()):
        if route.name == route_name:
            return frozenset(p for path in route.paths for p in _PLACEHOLDER_RE.findall(path))
    return frozenset()


def build(options: Options, ctx: BuildContext) -> Middleware:
    rollout = getattr(ctx.config, "rollout", None)
    tz = rollout.tzinfo if rollout is not None else dt.UTC
    settings = _Settings(
        options=options,
        successor=_Successor.compile(
            options.successor_method, options.successor, _route_params(ctx.config, ctx.route_name)
        ),
        deprecation=f"@{_epoch(options.deprecated_since, tz)}",
        counters={d: ctx.metrics.legacy_uploads.labels(ctx.route_name, d) for d in ("allowed", "blocked", "refused")},
    )
    clock = ctx.clock
    # The dated, per-tenant rollout of the forbid setting (rollout.forbid_legacy_uploads); a tenant the plan
    # does not know (a policy exercised alone, with a hand-made tenant) falls back to the company setting.
    plan = ctx.rollout

    def forbidden(tenant: Tenant, now: dt.datetime, headers: Mapping[str, str]) -> bool:
        if tenant.name in plan.schedules:
            return plan.forbids_legacy_uploads(tenant.name, now, headers)
        return forbid_in_force(tenant, now, headers)

    async def legacy_upload_guard(request: web.BaseRequest, handler: Handler) -> web.StreamResponse:
        state = request[CTX]
        if forbidden(state.tenant, clock.now(), request.headers):
            if settings.options.detect == "route":
                return await _enforce_route(request, state, handler, settings)
            return await _enforce_file_parts(request, state, handler, settings)
        return await _observe(request, state, handler, settings)

    return legacy_upload_guard


# --- the setting is on ------------------------------------------------------------------------------------------


async def _enforce_route(
    request: web.BaseRequest, state: RequestContext, handler: Handler, settings: _Settings
) -> web.StreamResponse:
    # Decided from the head alone: no 100 Continue is sent and no body byte is read before the answer.
    if request.body_exists or _declares_multipart(request.headers):
        return _block(request, state, settings)
    return await _pass(request, state, handler)


async def _enforce_file_parts(
    request: web.BaseRequest, state: RequestContext, handler: Handler, settings: _Settings
) -> web.StreamResponse:
    try:
        boundary = _multipart_boundary(request.headers)
    except Ambiguous as err:
        return _refuse(request, state, settings, err)
    if boundary is None:
        return await _pass(request, state, handler)
    if not request.body_exists:
        return _refuse(request, state, settings, Ambiguous("unterminated_body", "the multipart body is empty"))
    sniffer = settings.sniffer(boundary)
    look_ahead = settings.options.look_ahead_bytes
    # The part headers are in the body: the client is invited to send it (Expect: 100-continue) only now.
    await ensure_continue(request)
    content = request.content
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            try:
                async with asyncio.timeout(settings.options.body_read_timeout):
                    chunk = await content.readany()
            except TimeoutError:
                raise Ambiguous("body_timeout", "the body stalled before its part headers could be read") from None
            if not chunk:
                verdict = sniffer.feed_eof()
                break
            # The sniffer sees no byte past the look-ahead, however the body happens to be chunked.
            room = look_ahead - size
            verdict = sniffer.feed(chunk if len(chunk) <= room else chunk[:room])
            chunks.append(chunk)
            size += len(chunk)
            if verdict is Verdict.FILE:
                break
            if size > look_ahead:
                raise Ambiguous(
                    "look_ahead_exceeded",
                    f"the multipart body shows neither a file part nor its end within {look_ahead} bytes",
                )
    except Ambiguous as err:
        return _refuse(request, state, settings, err)
    except _BODY_ERRORS:
        state.client_aborted = True
        return _refuse(request, state, settings, Ambiguous("incomplete_body", "the request body was cut off"))
    if verdict is Verdict.FILE:
        return _block(request, state, settings)
    # No file part, and the whole body is in hand: the upstream gets exactly these bytes (and the client's
    # Content-Length, which the proxy core forwards).
    state.body = _replay(b"".join(chunks))
    return await _pass(request, state, handler)


def _multipart_boundary(headers: CIMultiDictProxy[str]) -> Boundary | None:
    """The boundary of a multipart/form-data body; None when the body is not multipart; Ambiguous otherwise."""
    values = headers.getall("Content-Type", ())
    if len(values) > 1:
        raise Ambiguous("duplicate_content_type", "the request has more than one Content-Type header")
    if not values:
        return None
    value = values[0]
    try:
        media = parse_media_type(value)
    except MalformedValue:
        if _MENTIONS_MULTIPART_RE.search(value):
            raise Ambiguous("malformed_content_type", "the Content-Type cannot be parsed") from None
        return None
    if media.type != "multipart":
        if _MENTIONS_MULTIPART_RE.search(value):
            raise Ambiguous("content_type_mentions_multipart", f"a {media.essence} Content-Type names multipart")
        return None
    boundary = form_data_boundary(media)
    if "Content-Encoding" in headers:
        raise Ambiguous("content_encoding", "a multipart upload body must not carry a Content-Encoding")
    codings = [t.strip().lower() for v in headers.getall("Transfer-Encoding", ()) for t in v.split(",")]
    if codings and codings != ["chunked"]:
        raise Ambiguous("transfer_coding", "a multipart upload body must use no transfer coding but chunked")
    return boundary


def _declares_multipart(headers: CIMultiDictProxy[str]) -> bool:
    return any(_MENTIONS_MULTIPART_RE.search(v) for v in headers.getall("Content-Type", ()))


async def _replay(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body


def _block(request: web.BaseRequest, state: RequestContext, settings: _Settings) -> web.StreamResponse:
    state.decisions[NAME] = "blocked"
    settings.counters["blocked"].inc()
    path, link = settings.successor.render(state.params)
    response = _answer(
        request,
        settings,
        403,
        {
            "code": DISABLED_CODE,
            "message": settings.options.message,
            "request_id": state.ensure_request_id(),
            "replacement": f"{settings.successor.method} {path}",
        },
    )
    _mark_deprecated(response, settings, link)
    return response


def _refuse(request: web.BaseRequest, state: RequestContext, settings: _Settings, err: Ambiguous) -> web.StreamResponse:
    state.decisions[NAME] = "refused"
    state.extra[f"{NAME}.rule"] = err.rule
    settings.counters["refused"].inc()
    status = _STATUS_OF_RULE.get(err.rule, 400)
    body = {
        "code": _CODE_OF_STATUS[status],
        "message": f"This upload route cannot accept the request: {err.message}.",
        "rule": err.rule,
        "request_id": state.ensure_request_id(),
    }
    return _answer(request, settings, status, body)


def _answer(request: web.BaseRequest, settings: _Settings, status: int, body: dict[str, str]) -> web.Response:
    data = json.dumps(body).encode()
    if request.content.is_eof():
        # The whole body has already arrived: an ordinary answer, and the connection may be kept.
        return web.Response(status=status, body=data, content_type="application/json")
    return _EarlyAnswer(request, status, data, settings.options.linger_bytes, settings.options.linger_seconds)


class _EarlyAnswer(web.Response):
    """A final answer sent while the client may still be sending its body.

    Closing a socket with unread data makes the kernel reset the connection, and a reset can destroy the answer
    before the client reads it; reading the whole body instead (aiohttp's own lingering, 10 s) costs as much as
    the upload. So: answer with ``Connection: close``, half-close (the client sees the end of the answer), read
    and drop at most ``linger_bytes`` for at most ``linger_seconds``, then close.
    """

    def __init__(self, request: web.BaseRequest, status: int, body: bytes, linger_bytes: int, linger_seconds: float) -> None:
        super().__init__(status=status, body=body, content_type="application/json")
        self.force_close()
        self._early_request: web.BaseRequest | None = request
        self._linger_bytes = linger_bytes
        self._linger_seconds = linger_seconds

    async def write_eof(self, data: bytes = b"") -> None:
        request, self._early_request = self._early_request, None
        await super().write_eof(data)
        if request is None:
            return
        transport = request.transport
        if transport is not None and transport.can_write_eof():
            transport.write_eof()
        content = request.content
        await _discard(content, self._linger_bytes, self._linger_seconds)
        if not content.is_eof():
            # Stop here instead of aiohttp's lingering, which would read the rest of the upload.
            request.protocol.force_close()


async def _discard(content: aiohttp.StreamReader, max_bytes: int, max_seconds: float) -> None:
    if max_bytes <= 0 or max_seconds <= 0:
        return
    read = 0
    try:
        async with asyncio.timeout(max_seconds):
            while read < max_bytes:
                chunk = await content.readany()
                if not chunk:
                    return
                read += len(chunk)
    except (TimeoutError, *_BODY_ERRORS):
        return


# --- the setting is off -----------------------------------------------------------------------------------------


class _Watch:
    """The part headers of a multipart body, read (up to ``budget`` bytes) as the proxy core streams it upstream."""

    __slots__ = ("budget", "sniffer", "verdict", "watching")

    def __init__(self, sniffer: MultipartSniffer, budget: int) -> None:
        self.sniffer = sniffer
        self.budget = budget
        self.verdict = Verdict.NEED_MORE
        self.watching = True

    def __call__(self, chunk: bytes) -> None:
        """The proxy core's body tap: each piece, then b"" at the end of the body."""
        if not self.watching:
            return
        try:
            if not chunk:
                self.watching = False
                self.verdict = self.sniffer.feed_eof()
                return
            room = self.budget - self.sniffer.bytes_fed
            self.verdict = self.sniffer.feed(chunk if len(chunk) <= room else chunk[:room])
            self.watching = self.verdict is Verdict.NEED_MORE and len(chunk) <= room
        except Ambiguous:
            self.watching = False


async def _observe(
    request: web.BaseRequest, state: RequestContext, handler: Handler, settings: _Settings
) -> web.StreamResponse:
    """Uploads pass unchanged; they are counted and their responses say the route is deprecated."""
    if settings.options.detect == "route":
        if not (request.body_exists or _declares_multipart(request.headers)):
            return await _pass(request, state, handler)
        response = await handler(request)
        return _allowed(state, settings, response)
    try:
        boundary = _multipart_boundary(request.headers)
    except Ambiguous:
        # Nothing to enforce, and a file part cannot be ruled out: counted as an allowed upload.
        response = await handler(request)
        return _allowed(state, settings, response)
    if boundary is None or not request.body_exists:
        return await _pass(request, state, handler)
    watch = _Watch(settings.sniffer(boundary), settings.options.look_ahead_bytes)
    # The proxy core streams the body (with its timeout and abort handling) and shows each piece to the watch.
    state.body_tap = watch
    response = await handler(request)
    if watch.verdict is Verdict.NO_FILE:
        state.decisions[NAME] = "passed"
        return response
    # A file part, or a body that could not be read to a verdict (cut short, ambiguous, too long): an upload.
    return _allowed(state, settings, response)


def _allowed(state: RequestContext, settings: _Settings, response: web.StreamResponse) -> web.StreamResponse:
    state.decisions[NAME] = "allowed"
    settings.counters["allowed"].inc()
    _mark_deprecated(response, settings, settings.successor.render(state.params)[1])
    return response


async def _pass(request: web.BaseRequest, state: RequestContext, handler: Handler) -> web.StreamResponse:
    state.decisions[NAME] = "passed"
    return await handler(request)


def _mark_deprecated(response: web.StreamResponse, settings: _Settings, link: str) -> None:
    if response.prepared:
        return
    response.headers["Deprecation"] = settings.deprecation
    response.headers.add("Link", f'<{link}>; rel="successor-version"')
