"""legacy_upload_guard: the company setting "Forbid uploading files without restricted access through the public API".

Spec, "Deprecated upload routes and their replacements", "Errors" and "States and transitions": with the setting on,
an upload through a deprecated route is answered 403 ``PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED`` and nothing of it
reaches the upstream; with it off, the upload passes and the response says that the route is deprecated (RFC 9745).
A security policy: a body it cannot read unambiguously is refused, never forwarded (nor translated).
Where the 403 would be the answer, the upload upgrade bridge (``upgrade``) may perform the upload on the restricted
access routes instead, for a client whose company or exemption turns it on.
docs/policies/legacy_upload_guard.md lists every rule.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from multidict import CIMultiDictProxy
from prometheus_client import CollectorRegistry, Counter
from pydantic import AnyHttpUrl, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ...core.exchange import BodyBroken, BodyError, Exchange, Flow, Next, Policy, Refuse, Reply, RequestBodyFilter
from ...core.http import transfer_codings
from ...core.multipart import Ambiguous, Boundary, form_data_boundary, request_media_type
from ...core.series import CompanyCounter
from ...core.spec import (
    RESTRICTED_BY_DEFAULT_FROM,
    deprecation_link,
    deprecation_value,
    epoch,
    successor_link,
)
from ...core.template import PathTemplate
from ...rollout.behaviour import Base, Behaviour, DateFlag
from ...rollout.clock import parse_date, parse_instant_value
from ..base import BuildContext, PolicySpec
from .multipart_sniffer import MultipartSniffer, Verdict
from .multipart_splitter import MultipartSplitter
from .upgrade import PATH_TEMPLATE_PATTERN, GuardHooks, Outcome, Upgrade, UpgradeFamilies, UpgradeOptions

if TYPE_CHECKING:
    from ...core.tenants import Tenant
    from ...rollout.config import Brownout

__all__ = ("DECISIONS", "DISABLED_CODE", "Families", "LEGACY_UPLOADS", "NAME", "Options", "SPEC", "build")

NAME = "legacy_upload_guard"
DISABLED_CODE = "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
DEFAULT_MESSAGE = (
    "Uploading files outside restricted file access is disabled for the public API by company settings."
)

# A Content-Type that is not a clean multipart/form-data but that some parser could still take for one.
_MENTIONS_MULTIPART_RE = re.compile(r"multipart|boundary|form-data", re.IGNORECASE)
_STATUS_OF_RULE = {"content_encoding": 415, "look_ahead_exceeded": 413, "body_timeout": 408}
_CODE_OF_STATUS = {
    400: "LEGACY_UPLOAD_AMBIGUOUS",
    408: "LEGACY_UPLOAD_TIMEOUT",
    413: "LEGACY_UPLOAD_UNDECIDED",
    415: "LEGACY_UPLOAD_ENCODED",
}


# --- the dated behaviour: the forbid setting, by company and by date ---------------------------------------------


def _base(tenant: Tenant) -> Base:
    if tenant.forbid_legacy_uploads:
        return Base(1, "setting", "company setting forbid_legacy_uploads is on", dated=False)
    if not tenant.restricted_file_access:
        return Base(0, "setting", "restricted file access is off, so uploads cannot be forbidden", dated=False)
    return Base(0, "setting", "company setting forbid_legacy_uploads is off; ")


def _forbid_date_problems(tenant: Tenant, where: str) -> list[str]:
    """A company's own date for forbid_legacy_uploads needs its restricted file access on and its setting off."""
    if not tenant.restricted_file_access:
        return [f"{where}.forbid_legacy_uploads: needs restricted_file_access on for this company"]
    if tenant.forbid_legacy_uploads:
        return [f"{where}.forbid_legacy_uploads: the company's forbid_legacy_uploads setting is already on; set "
                "forbid_legacy_uploads: false on the tenant to turn it on by date"]
    return []


def _check_tenant(
    tenant: Tenant, own: Mapping[str, dt.date | None], brownouts: Sequence[Brownout], where: str
) -> list[str]:
    problems = _forbid_date_problems(tenant, where) if own.get("forbid_legacy_uploads") is not None else []
    for j, brownout in enumerate(brownouts):
        if brownout.behaviour == LEGACY_UPLOADS.name and not tenant.restricted_file_access:
            problems.append(
                f"{where}.brownouts[{j}]: legacy_uploads cannot be forbidden without restricted_file_access"
            )
    return problems


# Spec, "States and transitions": the setting is on from the start for companies created on or after 2026-05-21;
# ``rollout.forbid_legacy_uploads`` turns it on by date for a company whose setting is off (restricted access on).
# Its bridge, the upload upgrade, performs a forbidden upload on the restricted access routes instead of refusing it.
LEGACY_UPLOADS = Behaviour(
    "legacy_uploads",
    ("allowed", "forbidden"),
    (DateFlag("forbid_legacy_uploads"),),
    security=True,
    base=_base,
    check_tenant=_check_tenant,
    bridge="upload_upgrade",
    bridge_of=lambda tenant: tenant.upload_upgrade,
    bridge_phases=("forbidden",),  # where the answer would be 403
)
# The decisions counted (bridged: taken on by the upload upgrade; would_block: allowed in a shadow window of the
# forbidden phase: the upload went through; forbidden, it would not).
DECISIONS = ("allowed", "blocked", "refused", "bridged", "would_block")
_FORBIDDEN = LEGACY_UPLOADS.index("forbidden")


def _date_or_instant(value: object) -> object:
    """``deprecated_since``: YAML dates reach the options as text; a date (YYYY-MM-DD) or an ISO 8601 date-time."""
    if isinstance(value, str) and len(value.strip()) > len("YYYY-MM-DD"):
        return parse_instant_value(value)
    return value if isinstance(value, dt.datetime) else parse_date(value)


def _list_as_tuple(value: object) -> object:
    """``file_fields``: a YAML list (a string stays a string, and is refused as one)."""
    return tuple(value) if isinstance(value, list) else value


class Families:
    """This policy's metric families."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.uploads = Counter(
            "gateway_legacy_uploads",
            "Uploads on deprecated routes, by tenant, route and decision (" + ", ".join(DECISIONS)
            + "; bridged: taken on by the upload upgrade).", ("tenant", "route", "decision"), registry=registry,
        )


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    # "route": the route exists to upload (PUT .../files): decided from method, route and headers, body unread.
    # "file_parts": an upload only when the multipart body has a file part (comment routes): part headers are read.
    detect: Literal["route", "file_parts"]
    # Path of the replacement route; {placeholders} naming this route's path parameters are filled in.
    successor: str = Field(pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    successor_method: str = Field(default="POST", pattern=r"^[A-Z]+$")
    # The Deprecation header's date (a date is midnight in rollout.timezone).
    deprecated_since: Annotated[dt.date | dt.datetime, BeforeValidator(_date_or_instant)] = RESTRICTED_BY_DEFAULT_FROM
    # The deprecation's documentation, sent as Link rel="deprecation" (RFC 9745 3) on every deprecated answer.
    deprecation_link: AnyHttpUrl | None = None
    message: str = Field(default=DEFAULT_MESSAGE, min_length=1, max_length=500)
    # How much of a multipart body may be read (and held) before it must have shown a file part or its end.
    look_ahead_bytes: int = Field(default=1 << 20, ge=64 << 10, le=64 << 20)
    max_part_header_bytes: int = Field(default=16 << 10, ge=1 << 10, le=1 << 20)
    # Longest silence while the part headers are being read (the upstream, which would time out a slow body,
    # is not involved yet).
    body_read_timeout: float = Field(default=30.0, gt=0, le=3600)
    # Field names that are files whatever their part headers say (the upstream reads them as files); "files"
    # also covers "files[]" and "files[0]".
    file_fields: Annotated[tuple[str, ...], BeforeValidator(_list_as_tuple)] = ("files", "file")
    # After an early answer: how much of the rest of the body to read and drop, for how long at most, before
    # closing, so that the client can read the answer before the connection is reset.
    linger_bytes: int = Field(default=4 << 20, ge=0, le=1 << 30)
    linger_seconds: float = Field(default=2.0, ge=0, le=60)
    # The upload upgrade bridge's routes and bounds (whether it applies: the tenant's bridges.upload_upgrade, or an
    # exemption's bridge).
    upgrade: UpgradeOptions = UpgradeOptions()

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


@dataclass(frozen=True, slots=True)
class _Successor:
    """The replacement route: its method and path template, and whether this route's parameters fill it."""

    method: str
    template: PathTemplate
    filled: bool  # every placeholder is a parameter of this route

    @classmethod
    def of(cls, method: str, template: str, params: frozenset[str]) -> _Successor:
        path = PathTemplate.of(template)
        return cls(method, path, path.fills(params))

    def text(self, params: Mapping[str, str]) -> str:
        """The path for people: this request's parameters filled in, other placeholders as written."""
        return self.template.render(params)

    def link(self, params: Mapping[str, str], path: str) -> str | None:
        """The successor as a URL a client can follow from a request for ``path``; None when it is not one: a
        placeholder this request does not fill (``{card_uid}`` on a route that has only the numeric id), or the
        request's own path (the replacement differs by method only)."""
        if not (self.filled and self.template.fills(params)):
            return None  # (a route of several paths may name the successor's parameters in some of them only)
        target = self.template.render(params)
        return None if target.lower() == path.lower() else target


@dataclass(frozen=True, slots=True)
class _Settings:
    """Everything the policy needs, built once per route: the options and what is derived from them."""

    options: Options
    route: str
    successor: _Successor
    deprecation: str  # the Deprecation header's value
    uploads: CompanyCounter  # gateway_legacy_uploads_total: (tenant, route, decision)

    def count(self, tenant: str, decision: str) -> None:
        self.uploads.inc((tenant, self.route, decision))

    def sniffer(self, boundary: Boundary) -> MultipartSniffer:
        options = self.options
        return MultipartSniffer(
            boundary, max_header_bytes=options.max_part_header_bytes, file_fields=options.file_fields
        )

    def splitter(self, boundary: Boundary) -> MultipartSplitter:
        options = self.options
        return MultipartSplitter(
            boundary, max_header_bytes=options.max_part_header_bytes, file_fields=options.file_fields
        )


def build(options: Options, ctx: BuildContext) -> Policy:
    file_parts = options.detect == "file_parts"
    settings = _Settings(
        options=options,
        route=ctx.route,
        successor=_Successor.of(options.successor_method, options.successor, ctx.params),
        deprecation=deprecation_value(epoch(options.deprecated_since, ctx.timezone)),
        uploads=CompanyCounter(ctx.families(Families).uploads, ctx.companies),
    )
    def count(exchange: Exchange, decision: str) -> None:
        settings.count(exchange.tenant.name, decision)

    hooks = GuardHooks(
        name=NAME, refuse=lambda exchange, err: _refuse(exchange, settings, err), count=count,
        mark=lambda reply, exchange, successor: _mark_deprecated(reply, settings, exchange, successor),
        splitter=settings.splitter, linger=(options.linger_bytes, options.linger_seconds),
    )
    upgrade = Upgrade(options.upgrade, hooks, CompanyCounter(ctx.families(UpgradeFamilies).upgrades, ctx.companies),
                      ctx.spool, ctx.limits, default_flow="comment" if file_parts else "card_file")

    bridged = upgrade.flow != "none"

    async def legacy_upload_guard(exchange: Exchange, next: Next) -> Reply:
        # The forbid setting's phase for this request: the company setting, its date, and the rollout's rules for
        # this client (the request's one decision, ``exchange.decide``).
        decision = exchange.decide(LEGACY_UPLOADS.name)
        if decision.index == _FORBIDDEN:
            # Where the answer would be 403, the upload upgrade may carry the upload out instead.
            bridge = upgrade if decision.bridge and bridged else None
            if file_parts:
                return await _enforce_file_parts(exchange, next, settings, bridge)
            if bridge is not None:
                return await _upgrade_route(exchange, next, settings, bridge)
            return await _enforce_route(exchange, next, settings)
        return await _observe(exchange, next, settings, shadow=decision.shadow == _FORBIDDEN)

    return legacy_upload_guard


# --- the setting is on ------------------------------------------------------------------------------------------


async def _enforce_route(exchange: Exchange, next: Next, settings: _Settings) -> Reply:
    # Decided from the head alone: no 100 Continue is sent and no body byte is read before the answer.
    if exchange.has_body or _declares_multipart(exchange.headers):
        return _block(exchange, settings)
    return await _pass(exchange, next)


async def _upgrade_route(exchange: Exchange, next: Next, settings: _Settings, upgrade: Upgrade) -> Reply:
    """``detect: route`` with the bridge: what would be blocked is uploaded to the card (a body the guard would
    refuse is refused all the same)."""
    if not (exchange.has_body or _declares_multipart(exchange.headers)):
        return await _pass(exchange, next)
    try:
        boundary = _multipart_boundary(exchange.headers)
    except Ambiguous as err:
        return _refuse_unbridged(exchange, settings, err, upgrade)
    return await upgrade.card_file(exchange, boundary)


async def _enforce_file_parts(exchange: Exchange, next: Next, settings: _Settings, upgrade: Upgrade | None) -> Reply:
    try:
        boundary = _multipart_boundary(exchange.headers)
    except Ambiguous as err:
        return _refuse_unbridged(exchange, settings, err, upgrade)
    if boundary is None:
        return await _pass(exchange, next)
    if not exchange.has_body:
        return _refuse_unbridged(exchange, settings, Ambiguous("unterminated_body", "the multipart body is empty"),
                                 upgrade)
    if upgrade is not None and upgrade.may_take(exchange.body):
        # The guard is the first to read the body (it sees it as the client sent it): it may hand it to the bridge.
        return await _read_then_decide(exchange, next, settings, upgrade, boundary)
    # The proxy core reads the body (inviting it with 100 Continue only now) and shows it to the filter, which holds
    # it until it decides: nothing reaches the upstream before, and nothing at all if it refuses.
    exchange.body.add_filter(_FileParts(exchange, settings, settings.sniffer(boundary)))
    reply = await next(exchange)
    _decided_in_passing(exchange, settings, upgrade)
    return reply


def _decided_in_passing(exchange: Exchange, settings: _Settings, upgrade: Upgrade | None) -> None:
    """The decision on a body the filter watched on its way upstream: refused (cut short before a verdict, or by
    the filter), else passed."""
    if NAME not in exchange.decisions and exchange.body_error is not None:
        _refused_incomplete(exchange, settings)
    if upgrade is not None and exchange.decisions.get(NAME) == "refused":
        # Refused as without the bridge (a policy before the guard reads the body: the bridge cannot take it over),
        # and counted among its outcomes too.
        upgrade.count(exchange, Outcome.ABORTED if exchange.body_error is not None else Outcome.REFUSED)
    exchange.decisions.setdefault(NAME, "passed")


async def _read_then_decide(exchange: Exchange, next: Next, settings: _Settings, upgrade: Upgrade,
                            boundary: Boundary) -> Reply:
    """With the bridge: the guard peeks at the start of the body itself, through the same filter (the same rules,
    the same look-ahead and idle timeout) the proxy core would run it through, and then takes one explicit step: a
    file part hands the request to the bridge (nothing reaches the upstream), a body without one is forwarded
    exactly as it came (what was peeked, then the rest), a refusal is answered."""
    watch = _FileParts(exchange, settings, settings.sniffer(boundary), bridged=True)
    try:
        await exchange.body.peek(watch)
    except Refuse as refused:
        upgrade.count(exchange, Outcome.REFUSED)
        return refused.reply
    except BodyBroken as broken:
        _refused_incomplete(exchange, settings)
        upgrade.count(exchange, Outcome.ABORTED)
        return broken.reply
    if watch.file_found:
        # The explicit step: the request is the bridge's from here, with the bytes read so far; the rest of the body
        # is read with the server's idle timeout, as for an upload the gateway forwards.
        return await upgrade.take_over(exchange, boundary)
    return await _pass(exchange, next)


def _refused_incomplete(exchange: Exchange, settings: _Settings) -> None:
    """The body broke off or stalled before the guard could decide: refused (the proxy core's answer says why)."""
    exchange.decisions[NAME] = "refused"
    exchange.notes[f"{NAME}.rule"] = ("incomplete_body" if exchange.body_error is not BodyError.TIMEOUT
                                      else "body_timeout")
    settings.count(exchange.tenant.name, "refused")


class _FileParts(RequestBodyFilter):
    """Holds a multipart body until its part headers show a file part (403; with the bridge, ``file_found``), a
    structure in doubt (4xx), or its end (forwarded, or 4xx for a rule broken in part headers)."""

    def __init__(self, exchange: Exchange, settings: _Settings, sniffer: MultipartSniffer, *,
                 bridged: bool = False) -> None:
        self._exchange = exchange
        self._settings = settings
        self._sniffer = sniffer
        self.hold_limit = settings.options.look_ahead_bytes
        self.idle_timeout = settings.options.body_read_timeout
        self._bridged = bridged
        self.file_found = False  # with the bridge: a file part, and no rule broken before it

    def on_data(self, chunk: bytes) -> Flow:
        # The sniffer sees no byte past the look-ahead, however the body happens to be chunked.
        room = self.hold_limit - self._sniffer.bytes_fed
        self._decide(lambda: self._sniffer.feed(chunk if len(chunk) <= room else chunk[:room]))
        return Flow.CONTINUE if self.file_found else Flow.HOLD  # found: the guard's peek ends, the bridge reads on

    def on_end(self) -> Flow:
        self._decide(self._sniffer.feed_eof)
        # No file part, and the whole body is held: the upstream gets exactly these bytes (and the client's length).
        return Flow.CONTINUE

    def on_hold_limit(self) -> Flow:
        look_ahead = self.hold_limit
        # A body already found ambiguous (no file part yet) is refused for that.
        raise Refuse(_refuse(self._exchange, self._settings, self._sniffer.pending or Ambiguous(
            "look_ahead_exceeded", f"the multipart body shows neither a file part nor its end within {look_ahead} bytes"
        )))

    def on_idle_timeout(self) -> None:
        raise Refuse(_refuse(self._exchange, self._settings, Ambiguous(
            "body_timeout", "the body stalled before its part headers could be read"
        )))

    def _decide(self, step: Callable[[], Verdict]) -> None:
        try:
            verdict = step()
        except Ambiguous as err:
            raise Refuse(_refuse(self._exchange, self._settings, err)) from None
        if verdict is Verdict.FILE:
            if self._bridged:
                pending = self._sniffer.pending
                if pending is not None:
                    # A file part wins over an ambiguity for the 403, never for a translation.
                    raise Refuse(_refuse(self._exchange, self._settings, pending))
                self.file_found = True
                return
            raise Refuse(_block(self._exchange, self._settings))


def _multipart_boundary(headers: CIMultiDictProxy[str]) -> Boundary | None:
    """The boundary of a multipart/form-data body; None when the body is not multipart; Ambiguous otherwise."""
    values = headers.getall("Content-Type", [])
    media = request_media_type(values, _MENTIONS_MULTIPART_RE)
    if media is None:
        return None
    if media.type != "multipart":
        if _MENTIONS_MULTIPART_RE.search(values[0]):
            raise Ambiguous("content_type_mentions_multipart", f"a {media.essence} Content-Type names multipart")
        return None
    boundary = form_data_boundary(media)
    _check_upload_codings(headers)
    return boundary


def _check_upload_codings(headers: CIMultiDictProxy[str]) -> None:
    """A multipart upload's body as sent is the body parsers read: no content coding, no transfer coding but
    chunked."""
    if "Content-Encoding" in headers:
        raise Ambiguous("content_encoding", "a multipart upload body must not carry a Content-Encoding")
    codings = transfer_codings(headers)
    if codings and codings != ["chunked"]:
        raise Ambiguous("transfer_coding", "a multipart upload body must use no transfer coding but chunked")


def _declares_multipart(headers: CIMultiDictProxy[str]) -> bool:
    return any(_MENTIONS_MULTIPART_RE.search(v) for v in headers.getall("Content-Type", ()))


def _block(exchange: Exchange, settings: _Settings) -> Reply:
    exchange.decisions[NAME] = "blocked"
    settings.count(exchange.tenant.name, "blocked")
    return _blocked(exchange, settings)


def _blocked(exchange: Exchange, settings: _Settings) -> Reply:
    path = settings.successor.text(exchange.params)
    reply = _answer(settings, Reply.error(
        403, DISABLED_CODE, settings.options.message, exchange.ensure_request_id(),
        replacement=f"{settings.successor.method} {path}",
    ))
    _mark_deprecated(reply, settings, exchange)
    return reply


def _refuse(exchange: Exchange, settings: _Settings, err: Ambiguous) -> Reply:
    exchange.decisions[NAME] = "refused"
    exchange.notes[f"{NAME}.rule"] = err.rule
    settings.count(exchange.tenant.name, "refused")
    status = _STATUS_OF_RULE.get(err.rule, 400)
    return _answer(settings, Reply.json(status, {
        "code": _CODE_OF_STATUS[status],
        "message": f"This upload route cannot accept the request: {err.message}.",
        "rule": err.rule,
        "request_id": exchange.ensure_request_id(),
    }))


def _refuse_unbridged(exchange: Exchange, settings: _Settings, err: Ambiguous, upgrade: Upgrade | None) -> Reply:
    """Refused from the head, before the bridge (if on) could take the request: as without the bridge, and counted
    among the bridge's outcomes too."""
    if upgrade is not None:
        upgrade.count(exchange, Outcome.REFUSED)
    return _refuse(exchange, settings, err)


def _answer(settings: _Settings, reply: Reply) -> Reply:
    # Sent while the client may still be sending its body: the proxy core answers with Connection: close, then reads
    # and drops a bounded amount of the rest so that the client can read the answer before the connection closes.
    reply.linger = (settings.options.linger_bytes, settings.options.linger_seconds)
    return reply


# --- the setting is off -----------------------------------------------------------------------------------------


class _Watch(RequestBodyFilter):
    """The part headers of a multipart body, read (up to ``budget`` bytes) as the proxy core streams it upstream."""

    def __init__(self, sniffer: MultipartSniffer, budget: int) -> None:
        self.sniffer = sniffer
        self.budget = budget
        self.verdict = Verdict.NEED_MORE
        self.watching = True

    def on_data(self, chunk: bytes) -> Flow:
        if self.watching:
            room = self.budget - self.sniffer.bytes_fed
            try:
                self.verdict = self.sniffer.feed(chunk if len(chunk) <= room else chunk[:room])
            except Ambiguous:
                self.watching = False
            else:
                self.watching = self.verdict is Verdict.NEED_MORE and len(chunk) <= room
        return Flow.CONTINUE

    def on_end(self) -> Flow:
        if self.watching:
            self.watching = False
            try:
                self.verdict = self.sniffer.feed_eof()
            except Ambiguous:
                pass
        return Flow.CONTINUE


async def _observe_route(exchange: Exchange, next: Next, settings: _Settings, shadow: bool) -> Reply:
    """With ``detect: route``: a request with a body (or one that says it is multipart) is counted as an upload."""
    if not (exchange.has_body or _declares_multipart(exchange.headers)):
        return await _pass(exchange, next)
    return _allowed(exchange, settings, await next(exchange), shadow)


async def _observe(exchange: Exchange, next: Next, settings: _Settings, *, shadow: bool = False) -> Reply:
    """Uploads pass unchanged; they are counted and their responses say the route is deprecated. In a shadow window
    of the forbidden phase they are recorded as ``would_block``: what that phase would have done to them."""
    if settings.options.detect == "route":
        return await _observe_route(exchange, next, settings, shadow)
    try:
        boundary = _multipart_boundary(exchange.headers)
    except Ambiguous:
        # Nothing to enforce, and a file part cannot be ruled out: counted as an allowed upload.
        return _allowed(exchange, settings, await next(exchange), shadow)
    if boundary is None or not exchange.has_body:
        return await _pass(exchange, next)
    watch = _Watch(settings.sniffer(boundary), settings.options.look_ahead_bytes)
    exchange.body.add_filter(watch)
    reply = await next(exchange)
    if watch.verdict is Verdict.NO_FILE:
        exchange.decisions[NAME] = "passed"
        return reply
    # A file part, or a body that could not be read to a verdict (cut short, ambiguous, too long): an upload.
    return _allowed(exchange, settings, reply, shadow)


def _allowed(exchange: Exchange, settings: _Settings, reply: Reply, shadow: bool = False) -> Reply:
    decision = "would_block" if shadow else "allowed"
    exchange.decisions[NAME] = decision
    settings.count(exchange.tenant.name, decision)
    _mark_deprecated(reply, settings, exchange)
    return reply


async def _pass(exchange: Exchange, next: Next) -> Reply:
    reply = await next(exchange)
    # A refusal by this policy's filter has recorded its own decision.
    exchange.decisions.setdefault(NAME, "passed")
    return reply


def _mark_deprecated(reply: Reply, settings: _Settings, exchange: Exchange, successor: str | None = None) -> None:
    """RFC 9745: the Deprecation date, and Links a client can follow: the successor (``successor``, else the route's
    own when this request fills it in, see ``_Successor.link``) and the deprecation's documentation
    (``deprecation_link``)."""
    reply.headers["Deprecation"] = settings.deprecation
    target = successor or settings.successor.link(exchange.params, exchange.path)
    if target is not None:
        reply.headers.add("Link", successor_link(target))
    if settings.options.deprecation_link is not None:
        reply.headers.add("Link", deprecation_link(str(settings.options.deprecation_link)))


SPEC = PolicySpec(NAME, Options, build, behaviours=(LEGACY_UPLOADS,))
