"""The upload upgrade bridge: a legacy upload that the guard would refuse with 403 is performed on the restricted
access routes instead (spec, "Deprecated upload routes and their replacements", "Restricted access file operations",
"Get card", "Limits" 1), for a client whose company (``bridges.upload_upgrade``) or exemption (``bridge``) says so.

- ``PUT /cards/{card_id}/files``: the card's uid comes from ``GET /api/v1/cards/{card_id}`` (the id mapping alone is
  cached; the service checks access on every upload), then the file part streams to ``POST /cards/{card_uid}/files``.
- A comment created or updated with ``files[]``: the comment is saved with the body's text parts, then each file part
  streams to ``POST /cards/{card_uid}/comments/{comment_uid}/files``, one upload per file (spec, "Limits" 1), in
  order. A file part that comes before the text is spooled to a bounded temporary file until the comment exists.

Every request to the service carries the client's own ``Authorization`` and nothing else of the client's. A file is
never held in memory: its bytes go to the service (or the spool) as they arrive, and an upload's close delimiter is
only sent once the file part has ended cleanly (for the card route, once the whole body has): a body that breaks off,
turns out ambiguous or is abandoned leaves the service an incomplete upload, which creates no file. What the bridge
created before a client went away is deleted; what it created before another failure is named in the answer.
docs/policies/legacy_upload_guard.md ("Upload upgrade bridge") lists every answer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import secrets
import tempfile
import types
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from cachetools import TTLCache
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...core.exchange import BodyBroken, BodyNotRead, Exchange, Reply, UpstreamFailed
from ...core.spec import TEMPLATE_PARAM, TEMPLATE_PARAM_RE, template_params
from .multipart_sniffer import Ambiguous, Boundary
from .multipart_splitter import PART_END, Event, MultipartSplitter, PartHead

__all__ = ("OUTCOMES", "PATH_TEMPLATE_PATTERN", "UPGRADE_HEADER", "GuardHooks", "Upgrade", "UpgradeFamilies",
           "UpgradeOptions")

log = logging.getLogger("gateway.legacy_upload_guard")

# What became of a request the bridge took on (bounded: the label of gateway_legacy_upload_upgrades_total).
OUTCOMES = ("upgraded", "partial", "failed", "denied", "aborted", "refused")
# The response header that says what the bridge did.
UPGRADE_HEADER = "X-Gateway-Upload-Upgrade"
PARTIAL_CODE = "LEGACY_UPLOAD_UPGRADE_PARTIAL"
_CODE_OF_STATUS = {400: "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", 413: "LEGACY_UPLOAD_UPGRADE_TOO_LARGE"}
# The spec's "type" of a restricted access file in a card's files array ("File kinds inside a card's files array").
RESTRICTED_FILE_TYPE = 11
MiB = 1 << 20

# A path template of the options (and the guard's successor): percent-encoded characters and {placeholders}.
PATH_TEMPLATE_PATTERN = rf"^/(?:[A-Za-z0-9\-._~!$&'()*+,=:@/]|%[0-9A-Fa-f]{{2}}|{TEMPLATE_PARAM})*$"
_FIELD_PATTERN = r"^[A-Za-z0-9_.\-\[\]]{1,64}$"
# A uid or file id the service returns: it goes into a path, percent-encoded all the same.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~\-]{0,127}")
_CARD_ID_RE = re.compile(r"[0-9]{1,18}")
# A file name that can go into a quoted-string as it is; any other also goes into filename* (RFC 8187), and its
# other characters are replaced in the quoted fallback.
_PLAIN_FILENAME_RE = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]{1,255}")
_NOT_PLAIN_RE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")
_CHUNK = 256 << 10
# Refusals after which the rest of a comment's body is still read to list its file parts; the most listed.
_LISTABLE = ("too_many_files", "text_after_files")
_MAX_LISTED = 10_000


class UpgradeOptions(BaseModel):
    """The bridge's bounds and the service's routes it uses (whether it applies is the tenant's and the exemptions')."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The service's routes: the card lookup (GET, JSON with "uid", and "comments" for a files-only comment update)
    # and the restricted access uploads.
    card_lookup: str = Field(default="/api/v1/cards/{card_id}", pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    card_upload: str = Field(default="/api/v1/cards/{card_uid}/files", pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    comment_upload: str = Field(default="/api/v1/cards/{card_uid}/comments/{comment_uid}/files",
                                pattern=PATH_TEMPLATE_PATTERN, max_length=500)
    # The restricted upload's form field (spec: "file"), and the comment's text field.
    upload_field: str = Field(default="file", pattern=_FIELD_PATTERN)
    text_field: str = Field(default="text", pattern=_FIELD_PATTERN)
    # card id -> card uid mappings kept, and for how long (seconds).
    id_cache_size: int = Field(default=10_000, ge=0, le=1_000_000)
    id_cache_ttl: float = Field(default=300.0, gt=0, le=86_400)
    # The card lookup, and each other request of the bridge's own (a comment, a rollback, the answer to an upload
    # whose client left once its whole file was sent).
    lookup_timeout: float = Field(default=10.0, gt=0, le=600)
    request_timeout: float = Field(default=30.0, gt=0, le=600)
    # File parts per comment; bytes of a comment's text parts together; bytes of the file parts spooled before a
    # comment's text together (0: a file part before the text is refused); where they are spooled (default: the
    # system's temporary directory).
    max_files: int = Field(default=20, ge=1, le=1000)
    max_field_bytes: int = Field(default=1 * MiB, ge=1024, le=64 * MiB)
    spool_bytes: int = Field(default=64 * MiB, ge=0, le=64 << 30)
    spool_dir: str | None = Field(default=None, max_length=4096)
    # The most read of one answer of the service (the card lookup's, a comment's, an upload's).
    max_answer_bytes: int = Field(default=8 * MiB, ge=64 << 10, le=256 * MiB)
    # After a comment's upload failed: how much more of the body is read (and dropped) to list the file parts that
    # were not sent (0: only those already read are listed).
    rest_bytes: int = Field(default=64 * MiB, ge=0, le=64 << 30)

    @field_validator("spool_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError("spool_dir must be an absolute path")
        return value

    @model_validator(mode="after")
    def _placeholders(self) -> UpgradeOptions:
        wanted = {"card_lookup": {"card_id"}, "card_upload": {"card_uid"},
                  "comment_upload": {"card_uid", "comment_uid"}}
        for key, names in wanted.items():
            found = set(template_params(getattr(self, key)))
            if found != names:
                raise ValueError(f"{key} must have the placeholders {sorted(names)}, not {sorted(found)}")
        return self


class UpgradeFamilies:
    """The bridge's metric family (per tenant: tenant names come from the config, the label is bounded)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.upgrades = Counter(
            "gateway_legacy_upload_upgrades", "Legacy uploads the upload upgrade bridge took on, by tenant and "
            "outcome (" + ", ".join(OUTCOMES) + ").", ("tenant", "outcome"), registry=registry,
        )


@dataclass(frozen=True, slots=True)
class GuardHooks:
    """What the bridge takes from the guard that owns it."""

    name: str  # the policy's name: its key in the access log's decisions
    # The guard's answer to an ambiguous body (counted in its family and decided, as without the bridge).
    refuse: Callable[[Exchange, Ambiguous], Reply]
    # Counts a request in the guard's family (gateway_legacy_uploads_total) under a decision.
    count: Callable[[Exchange, str], None]
    splitter: Callable[[Boundary], MultipartSplitter]
    linger: tuple[int, float]
    # Marks an answer deprecated as the guard does (Deprecation, Links), with this successor URL when one is known.
    mark: Callable[[Reply, Exchange, str | None], None]


class _Template:
    """A path template of the options, split once; values are percent-encoded into it."""

    def __init__(self, template: str) -> None:
        self.pieces: list[tuple[str, bool]] = []
        pos = 0
        for m in TEMPLATE_PARAM_RE.finditer(template):
            self.pieces += [(template[pos : m.start()], False), (m.group(1), True)]
            pos = m.end()
        self.pieces.append((template[pos:], False))

    def render(self, **values: str) -> str:
        return "".join(quote(values[text], safe="") if param else text for text, param in self.pieces)


class Upgrade:
    """Built once per route: the options, the id cache, the counters; ``card_file`` and ``comment`` serve one
    request each (their state lives in a per-request ``_Run``)."""

    def __init__(self, options: UpgradeOptions, hooks: GuardHooks, counter: Counter, tenants: Iterable[str]) -> None:
        self.options = options
        self.hooks = hooks
        self.card_lookup = _Template(options.card_lookup)
        self.card_upload = _Template(options.card_upload)
        self.comment_upload = _Template(options.comment_upload)
        # (tenant, card id) -> card uid. Only ids: access is the service's to check, on every upload.
        self.ids: TTLCache[tuple[str, str], str] | None = (
            TTLCache(maxsize=options.id_cache_size, ttl=options.id_cache_ttl) if options.id_cache_size else None
        )
        # Every configured tenant's series exist from the start (at 0), so that increase() sees the first one.
        self.counters = {(tenant, outcome): counter.labels(tenant, outcome)
                         for tenant in tenants for outcome in OUTCOMES}

    def count(self, exchange: Exchange, outcome: str) -> None:
        """Counts a request among the bridge's outcomes (the guard calls it for a request it ended before handing it
        over: refused as without the bridge)."""
        self.counters[(exchange.tenant.name, outcome)].inc()

    async def card_file(self, exchange: Exchange, boundary: Boundary | None) -> Reply:
        """``PUT /cards/{card_id}/files``: its one file part uploaded to the card."""
        run = _Run(self, exchange)
        return await run.settle(run.card_file(boundary))

    async def comment(self, exchange: Exchange, boundary: Boundary, prefix: list[bytes]) -> Reply:
        """A comment create or update with file parts; ``prefix``: the body bytes the guard already read."""
        run = _Run(self, exchange)
        return await run.settle(run.comment(boundary, prefix))


# --- the per-request machinery ----------------------------------------------------------------------------------


class _Refusal(Exception):
    """A body the bridge cannot translate (not ambiguous: unsupported, or over a bound)."""

    def __init__(self, rule: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.status = status


class _Partial(Exception):
    """The run ends after it changed something (a comment saved, a file uploaded): the answer names what was done,
    built when the run ends (``status``: the answer's; ``reason``: bounded, for the header, the log and the note)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class _Stop(Exception):
    """The run ends with this answer."""

    def __init__(self, outcome: str, reply: Reply, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reply = reply
        self.reason = reason


@dataclass(slots=True)
class _File:
    """One file part of the client's body and what became of it."""

    index: int  # among the file parts, 0-based
    field: str
    filename: str | None
    status: str = "not_sent"  # not_sent | uploaded | failed | rolled_back | rollback_failed
    id: str | None = None
    path: str | None = None  # the upload route it went to
    upstream_status: int | None = None
    record: dict[str, Any] | None = None  # the service's answer, in the legacy shape

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "field": self.field, "filename": self.filename,
                               "status": self.status}
        if self.id is not None:
            out["id"] = self.id
        if self.upstream_status is not None:
            out["upstream_status"] = self.upstream_status
        return out


class _Parts:
    """The client's multipart body as parts, split as it arrives. Read by one task at a time.

    Each read of the client's body is a task of its own that the reader waits for shielded: an upload broken off
    while its writer waits for the client (cancelled by aiohttp) leaves the read, and the body, to the next reader,
    which can still list the parts that follow. ``close`` ends a read still pending."""

    def __init__(self, source: AsyncIterator[bytes], splitter: MultipartSplitter) -> None:
        self._source = source
        self._splitter = splitter
        self._events: deque[Event] = deque()
        self._ended = False
        self._reading: asyncio.Future[bytes] | None = None

    @property
    def ended(self) -> bool:
        """The whole body has been read (and found well formed)."""
        return self._ended and not self._events

    @property
    def bytes_read(self) -> int:
        return self._splitter.bytes_fed

    async def _fill(self) -> bool:
        """At least one event in hand; False once the body has ended (whole: ``end`` raises otherwise)."""
        while not self._events:
            if self._ended:
                return False
            reading = self._reading
            if reading is None:
                reading = self._reading = asyncio.ensure_future(anext(self._source))
            try:
                chunk = await asyncio.shield(reading)
            except StopAsyncIteration:
                self._reading = None
                self._ended = True
                self._events.extend(self._splitter.end())
                continue
            except asyncio.CancelledError:
                raise  # this reader was cancelled: the read goes on for the next one
            except BaseException:
                self._reading = None
                raise
            self._reading = None
            self._events.extend(self._splitter.split(chunk))
        return True

    async def close(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    async def next_part(self, limit: int | None = None) -> PartHead | None:
        """The next part's head (what is left of the current part is skipped); None at the end of the body.
        ``limit``: the most of the body read by then (``_Refusal`` past it)."""
        while await self._fill():
            event = self._events.popleft()
            if isinstance(event, PartHead):
                return event
            if limit is not None and self.bytes_read > limit:
                raise _Refusal("rest_bytes", "the rest of the body is longer than rest_bytes")
        return None

    async def content(self) -> AsyncIterator[bytes]:
        """The current part's content, as it arrives, to its end."""
        while await self._fill():
            event = self._events.popleft()
            if event is PART_END:
                return
            assert isinstance(event, bytes)
            yield event


class _Pipe:
    """One upload's request body as aiohttp's writer pulls it: the new form's framing around the file's bytes.

    The close delimiter goes last, after ``after`` (the card route: the rest of the client's body must end cleanly);
    whatever fails before it (the client's body, a rule) is kept in ``failure`` and breaks the upload off."""

    def __init__(self, source: AsyncIterator[bytes], head: bytes, tail: bytes,
                 after: Callable[[], Awaitable[None]] | None = None) -> None:
        self._source = source
        self._head = head
        self._tail = tail
        self._after = after
        self._gen: AsyncGenerator[bytes, None] | None = None
        self.failure: Exception | None = None
        self.tail_sent = False  # the whole file went (the service may have made it)
        self.stopped = asyncio.Event()

    def body(self) -> AsyncGenerator[bytes, None]:
        self._gen = self._chunks()
        return self._gen

    async def _chunks(self) -> AsyncGenerator[bytes, None]:
        try:
            yield self._head
            async for data in self._source:
                yield data
            if self._after is not None:
                await self._after()
            self.tail_sent = True
            yield self._tail
        except Exception as err:
            self.failure = err
            raise
        finally:
            self.stopped.set()

    async def stop(self, timeout: float) -> bool:
        """The upload ended before its whole file went (an early answer, a broken connection): make sure nothing
        reads the client's body for it any more (aiohttp cancels its writer when the answer ends or is let go; the
        writer may be waiting for the client's body right now). False if it could not be made sure of."""
        gen = self._gen
        if gen is None or self.stopped.is_set():
            return True
        if isinstance(gen, types.AsyncGeneratorType) and gen.ag_running:
            try:
                async with asyncio.timeout(timeout):
                    await self.stopped.wait()
            except TimeoutError:
                return False
        else:
            await gen.aclose()
        return True


class _Spool:
    """A file part held on disk until its comment exists: a named temporary file, removed on every path."""

    def __init__(self, directory: str | None) -> None:
        fd, self.path = tempfile.mkstemp(prefix="gateway-upload-", suffix=".part", dir=directory)
        self._file = os.fdopen(fd, "w+b")

    async def write(self, data: bytes) -> None:
        await asyncio.to_thread(self._file.write, data)

    async def chunks(self) -> AsyncIterator[bytes]:
        await asyncio.to_thread(self._file.flush)
        await asyncio.to_thread(self._file.seek, 0)
        while data := await asyncio.to_thread(self._file.read, _CHUNK):
            yield data

    def close(self) -> None:
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


async def _chained(prefix: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in prefix:
        yield chunk
    async for chunk in rest:
        yield chunk


@dataclass(slots=True)
class _Comment:
    id: Any
    uid: str | None
    answer: dict[str, Any]  # what the service answered for it (the base of the client's answer)
    status: int = 200


@dataclass(slots=True)
class _Run:
    """One request the bridge took on: what it has done so far, so that every ending can say so."""

    up: Upgrade
    exchange: Exchange
    auth: dict[str, str] = field(default_factory=dict)
    card_id: str = ""
    card: dict[str, Any] | None = None  # the card lookup's answer, when one was made for this request
    upload_path: str | None = None
    files: list[_File] = field(default_factory=list)
    saved: _Comment | None = None  # the comment the files go to
    changed: bool = False  # the bridge saved a comment or uploaded a file for this request
    spools: list[_Spool] = field(default_factory=list)
    spooled: int = 0
    parts: _Parts | None = None
    body_usable: bool = True  # no upload broken off half way may still be reading the client's body

    def __post_init__(self) -> None:
        auth = self.exchange.headers.get("Authorization")
        if auth is not None:
            self.auth["Authorization"] = auth

    @property
    def options(self) -> UpgradeOptions:
        return self.up.options

    # --- the two routes -----------------------------------------------------------------------------------------

    async def card_file(self, boundary: Boundary | None) -> Reply:
        exchange = self.exchange
        self.need_card_id()
        if boundary is None:
            raise _Refusal("no_file_part", "the body is not multipart/form-data: it has no file part to upload")
        if not exchange.has_body:
            raise _Refusal("no_file_part", "the multipart body is empty")
        # Before any body byte is read (and before 100 Continue): a client without access gets the service's answer.
        card_uid = await self.resolve_card()
        path = self.upload_path = self.up.card_upload.render(card_uid=card_uid)
        parts = self.parts = _Parts(exchange.client_body(), self.up.hooks.splitter(boundary))
        head = await parts.next_part()
        if head is None:
            raise _Refusal("no_file_part", "the multipart body has no file part")
        if not head.is_file:
            raise _Refusal("not_a_file_part", f"part {head.index} ({head.name!r}) is not a file part: this route "
                           "takes one file part and nothing else")
        entry = self.add_file(head)

        async def only_part() -> None:
            later = await parts.next_part()
            if later is not None:
                raise _Refusal("several_parts", f"part {later.index} ({later.name!r}) follows the file part: this "
                               "route takes one file part and nothing else")

        failed = await self.upload(parts.content(), head, path, entry, after=only_part)
        if failed is not None:
            raise self.passed_on(failed, "upload", entry.upstream_status)
        assert entry.record is not None
        return self.answer(200, entry.record)

    async def comment(self, boundary: Boundary, prefix: list[bytes]) -> Reply:
        exchange = self.exchange
        self.need_card_id()
        comment_id = exchange.params.get("comment_id")
        if comment_id is not None and not _CARD_ID_RE.fullmatch(comment_id):
            raise _Refusal("comment_id", "the comment id in the path is not a number")
        card_uid = await self.resolve_card()
        parts = self.parts = _Parts(_chained(prefix, exchange.client_body()), self.up.hooks.splitter(boundary))
        try:
            await self.comment_parts(parts, boundary, card_uid)
        except (_Partial, _Refusal) as stopped:
            if self.changed and (isinstance(stopped, _Partial) or stopped.rule in _LISTABLE):
                await self.list_rest(parts)
            raise
        assert self.saved is not None
        answer = dict(self.saved.answer)
        kept = answer.get("files")
        answer["files"] = [*(kept if isinstance(kept, list) else ()),
                           *(f.record for f in self.files if f.record is not None)]
        return self.answer(self.saved.status, answer)

    async def comment_parts(self, parts: _Parts, boundary: Boundary, card_uid: str) -> None:
        options = self.options
        # The text parts as they were written (each with its delimiter line), within max_field_bytes together.
        fields = bytearray()
        text_seen = False
        waiting: list[tuple[PartHead, _File, _Spool]] = []
        while (head := await parts.next_part()) is not None:
            if not head.is_file:
                if self.saved is not None:
                    raise _Refusal("text_after_files", f"part {head.index} ({head.name!r}) is a text part after a "
                                   "file part that went to the comment already saved")
                fields += boundary.delimiter + b"\r\n" + head.raw + b"\r\n\r\n"
                async for piece in parts.content():
                    fields += piece
                    self.check_fields(fields)
                fields += b"\r\n"
                self.check_fields(fields)
                text_seen = text_seen or head.name == options.text_field
                continue
            entry = self.add_file(head)
            if self.saved is None and text_seen:
                await self.save_comment(boundary, fields, card_uid)
                await self.upload_waiting(waiting)
            if self.saved is None:
                waiting.append((head, entry, await self.spool(parts)))
            else:
                await self.to_comment(parts.content(), head, entry)
        if self.saved is None:
            await self.save_comment(boundary, fields, card_uid)
            await self.upload_waiting(waiting)

    def check_fields(self, fields: bytearray) -> None:
        limit = self.options.max_field_bytes
        if len(fields) > limit:
            raise _Refusal("fields_too_large", f"the comment's text parts are over {limit} bytes", 413)

    async def list_rest(self, parts: _Parts) -> None:
        """After a failure: read on (dropping file contents, within ``rest_bytes``) to list the file parts not sent."""
        if not self.body_usable:
            return
        limit = parts.bytes_read + self.options.rest_bytes
        try:
            async with asyncio.timeout(self.options.request_timeout):
                while len(self.files) < _MAX_LISTED:
                    head = await parts.next_part(limit)
                    if head is None:
                        return
                    if head.is_file:
                        self.files.append(_File(len(self.files), head.name, head.filename))
        except (Ambiguous, BodyBroken, TimeoutError, _Refusal):
            pass

    # --- steps --------------------------------------------------------------------------------------------------

    def need_card_id(self) -> None:
        card_id = self.exchange.params.get("card_id", "")
        if not _CARD_ID_RE.fullmatch(card_id):
            raise _Refusal("card_id", "the card id in the path is not a number: the card cannot be looked up")
        self.card_id = str(int(card_id))

    def add_file(self, head: PartHead) -> _File:
        entry = _File(len(self.files), head.name, head.filename)
        self.files.append(entry)
        limit = self.options.max_files
        if len(self.files) > limit:
            raise _Refusal("too_many_files", f"the body has more than {limit} file parts")
        return entry

    async def resolve_card(self) -> str:
        """The card's uid: from the id cache, else from the card lookup (with the client's token)."""
        ids = self.up.ids
        key = (self.exchange.tenant.name, self.card_id)
        cached = ids.get(key) if ids is not None else None
        if cached is not None:
            return cached
        card = await self.lookup()
        uid = card.get("uid")
        if not isinstance(uid, str) or not _ID_RE.fullmatch(uid):
            raise self.bad_answer("lookup", "the card lookup's answer has no usable uid")
        if ids is not None:
            ids[key] = uid
        return uid

    async def lookup(self) -> dict[str, Any]:
        path = self.up.card_lookup.render(card_id=self.card_id)
        reply, data = await self.call("GET", path, stage="lookup", timeout=self.options.lookup_timeout)
        if data is None:
            raise self.passed_on(reply, "lookup", reply.status)
        self.card = data
        return data

    async def save_comment(self, boundary: Boundary, fields: bytearray, card_uid: str) -> None:
        """The comment created or updated with the text parts; a files-only update changes nothing and only needs
        the comment's uid."""
        exchange = self.exchange
        comment_id = exchange.params.get("comment_id")
        if not fields and comment_id is not None:
            self.saved = await self.existing_comment(comment_id, card_uid)
            return
        if not fields:
            # A comment of files alone: the service needs its text, which is empty.
            fields += (boundary.delimiter + b"\r\nContent-Disposition: form-data; name=\""
                       + self.options.text_field.encode() + b"\"\r\n\r\n\r\n")
        fields += boundary.delimiter + b"--\r\n"
        body = bytes(fields)
        reply, data = await self.call(exchange.method, exchange.path, query=exchange.query, body=body,
                                      stage="comment", timeout=self.options.request_timeout,
                                      headers={"Content-Type": exchange.headers.get("Content-Type", "")})
        if data is None:
            raise self.passed_on(reply, "comment", reply.status)
        self.changed = True
        uid = data.get("uid")
        if not isinstance(uid, str) or not _ID_RE.fullmatch(uid):
            self.saved = _Comment(data.get("id"), None, data, reply.status)
            raise _Partial(502, "comment_answer", "the service saved the comment but its answer names no usable uid, "
                           "so no file could be uploaded to it")
        self.saved = _Comment(data.get("id"), uid, data, reply.status)
        self.upload_path = self.up.comment_upload.render(card_uid=card_uid, comment_uid=uid)

    async def existing_comment(self, comment_id: str, card_uid: str) -> _Comment:
        """A comment updated with files alone: its uid and record from the card lookup (made for this request, so
        that the answer is the comment as it is now)."""
        card = self.card if self.card is not None else await self.lookup()
        comments = card.get("comments")
        found = next((c for c in comments if isinstance(c, dict) and str(c.get("id")) == str(int(comment_id))),
                     None) if isinstance(comments, list) else None
        if found is None:
            raise _Stop("denied", self.error(404, "LEGACY_UPLOAD_UPGRADE_NOT_FOUND", "the comment is not among the "
                                             "card's comments as the service lists them"), "comment_not_found")
        uid = found.get("uid")
        if not isinstance(uid, str) or not _ID_RE.fullmatch(uid):
            raise self.bad_answer("lookup", "the card lookup's answer has no usable uid for the comment")
        self.upload_path = self.up.comment_upload.render(card_uid=card_uid, comment_uid=uid)
        return _Comment(found.get("id"), uid, found)

    async def spool(self, parts: _Parts) -> _Spool:
        """The current file part to a temporary file, within ``spool_bytes`` for the whole request."""
        limit = self.options.spool_bytes
        over = _Refusal("spool_limit", f"a file part comes before the comment's text and the file parts before the "
                        f"text are over spool_bytes ({limit} bytes)", 413)
        if self.spooled >= limit:
            raise over
        try:
            spool = _Spool(self.options.spool_dir)
        except OSError as err:
            log.error("legacy_upload_guard: cannot create a spool file in %s: %s", self.options.spool_dir or
                      tempfile.gettempdir(), err)
            raise _Stop("failed", self.error(503, "LEGACY_UPLOAD_UPGRADE_SPOOL_UNAVAILABLE", "the gateway cannot "
                                             "hold a file part that comes before the comment's text right now"),
                        "spool_unavailable") from None
        self.spools.append(spool)
        async for data in parts.content():
            self.spooled += len(data)
            if self.spooled > limit:
                raise over
            await spool.write(data)
        return spool

    async def upload_waiting(self, waiting: list[tuple[PartHead, _File, _Spool]]) -> None:
        for head, entry, spool in waiting:
            await self.to_comment(spool.chunks(), head, entry)
            spool.close()
        waiting.clear()

    async def to_comment(self, source: AsyncIterator[bytes], head: PartHead, entry: _File) -> None:
        assert self.upload_path is not None
        failed = await self.upload(source, head, self.upload_path, entry)
        if failed is None:
            self.changed = True
            return
        if not self.changed:
            # A files-only update whose first upload failed: nothing was done, the service's answer is passed on.
            raise self.passed_on(failed, "upload", entry.upstream_status)
        failed.discard()
        reason = "upload_status" if entry.upstream_status is not None else "upload_error"
        why = (f"the service answered {entry.upstream_status}" if entry.upstream_status is not None
               else "the service could not be reached or did not answer")
        raise _Partial(502, reason, f"file {entry.index + 1} of the comment was not uploaded ({why})")

    async def upload(self, source: AsyncIterator[bytes], head: PartHead, path: str, entry: _File,
                     after: Callable[[], Awaitable[None]] | None = None) -> Reply | None:
        """One file part to a restricted upload route, streamed. None when the file was created (``entry`` says
        so); else the answer to pass on (the service's, or the proxy core's when the service gave none)."""
        boundary = secrets.token_hex(16)
        pipe = _Pipe(source, _form_head(boundary, self.options.upload_field, head),
                     f"\r\n--{boundary}--\r\n".encode(), after)
        headers = {**self.auth, "Accept": "application/json",
                   "Content-Type": f"multipart/form-data; boundary={boundary}"}
        entry.path = path
        # A task of its own, so that a client that leaves once its whole file was sent does not cancel the upload
        # half way through its answer: the file it made is then deleted (``abandon``).
        task = asyncio.ensure_future(self.exchange.fetch("POST", path, headers=headers, body=pipe.body()))
        try:
            reply = await asyncio.shield(task)
        except asyncio.CancelledError:
            await self.abandon(task, pipe, entry)
            raise
        except UpstreamFailed as failed:
            if pipe.failure is not None:
                raise pipe.failure from None  # the client's body broke off, or broke a rule: the upload with it
            entry.status = "failed"
            self.body_usable = await pipe.stop(self.options.request_timeout)
            return failed.reply
        if not pipe.tail_sent:
            # The service answered before it had the whole file (an early refusal): it made nothing.
            entry.status, entry.upstream_status = "failed", reply.status
            try:
                await reply.read(self.options.max_answer_bytes)
            except BodyNotRead:
                reply.discard()
                reply = self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service answered the upload before it "
                                   "had the whole file, and its answer could not be read")
            self.body_usable = await pipe.stop(self.options.request_timeout)
            if 200 <= reply.status < 300:
                return self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service answered the upload before it "
                                  "had the whole file")
            return reply
        if not 200 <= reply.status < 300:
            entry.status, entry.upstream_status = "failed", reply.status
            return reply
        record = await self.read_json(reply, "upload")
        file_id = record.get("id") if record is not None else None
        if record is None or not isinstance(file_id, str) or not _ID_RE.fullmatch(file_id):
            entry.status, entry.upstream_status = "failed", reply.status
            return self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service's answer to the upload is not a "
                              "file record")
        entry.status, entry.id = "uploaded", file_id
        comment = self.saved
        entry.record = _legacy_file(record, int(self.card_id), comment.id if comment is not None else None)
        return None

    async def abandon(self, task: asyncio.Future[Reply], pipe: _Pipe, entry: _File) -> None:
        """The client left during an upload: an upload still missing its end is broken off (the service makes no
        file of it); one whose whole file went is waited for, so that the file it made can be deleted."""
        if pipe.tail_sent:
            try:
                async with asyncio.timeout(self.options.request_timeout):
                    reply = await task
                    if 200 <= reply.status < 300:
                        record = json.loads(await reply.read(self.options.max_answer_bytes))
                        if isinstance(record, dict) and isinstance(record.get("id"), str):
                            entry.status, entry.id = "uploaded", record["id"]
                    else:
                        reply.discard()
                return
            except (TimeoutError, UpstreamFailed, BodyNotRead, ValueError):
                pass
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def rollback(self) -> None:
        """Delete the files this request uploaded (its client went away before it could be told)."""
        made = [f for f in self.files if f.status == "uploaded"]
        if not made:
            return
        try:
            async with asyncio.timeout(self.options.request_timeout):
                for entry in made:
                    assert entry.path is not None and entry.id is not None
                    entry.status = "rollback_failed"
                    reply = await self.exchange.fetch("DELETE", f"{entry.path}/{quote(entry.id, safe='')}",
                                                      headers=self.auth)
                    reply.discard()
                    if 200 <= reply.status < 300 or reply.status == 404:
                        entry.status = "rolled_back"
        except (TimeoutError, UpstreamFailed):
            pass
        left = [f.id for f in made if f.status != "rolled_back"]
        if left:
            log.warning("legacy_upload_guard: upload upgrade could not delete %d file(s) of a client that went away "
                        "(%s); tenant %s, card %s, request id %s", len(left), ", ".join(str(i) for i in left),
                        self.exchange.tenant.name, self.card_id, self.exchange.request_id)

    # --- requests of the bridge's own -----------------------------------------------------------------------------

    async def call(self, method: str, path: str, *, stage: str, timeout: float, query: str = "",
                   body: bytes | None = None, headers: Mapping[str, str] | None = None
                   ) -> tuple[Reply, dict[str, Any] | None]:
        """A small request with the client's token; its answer, and its JSON object when the status is 2xx (None
        otherwise: the answer's body is then left to stream on)."""
        sent = {**self.auth, "Accept": "application/json", **(headers or {})}
        try:
            async with asyncio.timeout(timeout):
                reply = await self.exchange.fetch(method, path, query=query, headers=sent, body=body)
                if not 200 <= reply.status < 300:
                    return reply, None
                data = await self.read_json(reply, stage)
        except UpstreamFailed as failed:
            raise _Stop("failed", failed.reply, f"{stage}_{failed.kind}") from None
        except TimeoutError:
            raise _Stop("failed", self.error(504, "LEGACY_UPLOAD_UPGRADE_TIMEOUT", f"the service did not answer the "
                                             f"{stage} request within {timeout:g} s"), f"{stage}_timeout") from None
        if data is None:
            raise self.bad_answer(stage, f"the service's answer to the {stage} request is not a JSON object")
        return reply, data

    async def read_json(self, reply: Reply, stage: str) -> dict[str, Any] | None:
        try:
            raw = await reply.read(self.options.max_answer_bytes)
        except BodyNotRead:
            reply.discard()
            raise self.bad_answer(stage, f"the service's answer to the {stage} request is over "
                                  f"{self.options.max_answer_bytes} bytes or broke off") from None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    # --- answers ------------------------------------------------------------------------------------------------

    def error(self, status: int, code: str, message: str) -> Reply:
        return Reply.error(status, code, _sentence(message), self.exchange.ensure_request_id())

    def bad_answer(self, stage: str, message: str) -> _Stop | _Partial:
        if self.changed:
            return _Partial(502, f"{stage}_answer", message)
        return _Stop("failed", self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", message), f"{stage}_answer")

    def passed_on(self, reply: Reply, stage: str, status: int | None) -> _Stop:
        """The answer to pass on when nothing was created: the service's (its ``status``), or the proxy core's when
        the service gave none (``status`` None)."""
        if status is None:
            return _Stop("failed", reply, f"{stage}_error")
        return _Stop("denied" if status in (401, 403, 404) else "failed", reply, f"{stage}_status_{status}")

    def partial(self, status: int, reason: str, message: str) -> Reply:
        """The answer that names what was created and what was not."""
        comment = self.saved
        payload: dict[str, Any] = {
            "reason": reason,
            "comment": None if comment is None else {"id": comment.id, "uid": comment.uid},
            "files": [f.report() for f in self.files],
            # Whether every file part of the body is listed (the body was read to its end).
            "files_complete": self.parts is not None and self.parts.ended,
        }
        if self.upload_path is not None:
            payload["replacement"] = f"POST {self.upload_path}"
        done = "the comment was saved" if comment is not None else "the request was partly carried out"
        text = _sentence(f"{done}, but not every file was uploaded: {message}; the files are listed with what became "
                         "of each (uploaded, failed, not_sent, rolled_back, rollback_failed)")
        return Reply.json(status, {"code": PARTIAL_CODE, "message": text,
                                   "request_id": self.exchange.ensure_request_id(), **payload})

    def answer(self, status: int, payload: Mapping[str, Any]) -> Reply:
        reply = Reply.json(status, payload)
        reply.headers["Cache-Control"] = "no-store"  # it holds signed links
        return reply

    async def settle(self, work: Awaitable[Reply]) -> Reply:
        """Runs the route's steps; whatever way they end is answered, counted and logged here, and what they hold
        (spool files, a pending read of the client's body) let go."""
        exchange = self.exchange
        try:
            reply = await work
        except _Stop as stop:
            return self.finish(stop.outcome, stop.reply, stop.reason)
        except _Partial as partial:
            return self.finish("partial", self.partial(partial.status, partial.reason, partial.message),
                               partial.reason)
        except Ambiguous as err:
            if self.changed:
                return self.finish("partial", self.partial(400, err.rule, f"the rest of the body cannot be read "
                                                                        f"unambiguously ({err.message})"), err.rule)
            # Refused exactly as without the bridge: counted, decided and answered by the guard.
            return self.finish("refused", self.up.hooks.refuse(exchange, err), err.rule, guard_counted=True)
        except _Refusal as err:
            if self.changed:
                return self.finish("partial", self.partial(err.status, err.rule, err.message), err.rule)
            reply = Reply.json(err.status, {
                "code": _CODE_OF_STATUS[err.status],
                "message": f"This legacy upload cannot be upgraded to the restricted access routes: {err.message}.",
                "rule": err.rule, "request_id": exchange.ensure_request_id(),
            })
            return self.finish("refused", reply, err.rule)
        except BodyBroken as broken:
            reason = {"timeout": "body_timeout", "malformed": "malformed_body"}.get(exchange.body_error or "",
                                                                                  "client_gone")
            await self.rollback()
            reply = broken.reply
            if self.changed:
                reply = self.partial(reply.status, reason, "the request body did not arrive whole, so the files "
                                     "uploaded for it were deleted")
                reply.close_connection = True
            return self.finish("aborted", reply, reason)
        except asyncio.CancelledError:
            # The client went away (aiohttp cancels its handler): undo what can be undone, and say so in the log.
            await self.rollback()
            self.record("aborted", "client_gone")
            raise
        else:
            return self.finish("upgraded", reply, "")
        finally:
            for spool in self.spools:
                spool.close()
            if self.parts is not None:
                await self.parts.close()

    def finish(self, outcome: str, reply: Reply, reason: str, *, guard_counted: bool = False) -> Reply:
        self.record(outcome, reason, guard_counted=guard_counted)
        if not guard_counted:
            # (The guard's own refusals are answered exactly as without the bridge.)
            if outcome == "upgraded":
                reply.headers[UPGRADE_HEADER] = f"upgraded; files={sum(f.status == 'uploaded' for f in self.files)}"
            else:
                reply.headers[UPGRADE_HEADER] = f"{outcome}; reason={reason}"
            # The upload route this request used (the card's uid filled in), else the guard's own Links. Only once
            # the service took something from this client: a uid from the id cache is no proof that it may see the
            # card, and a refused client is not told the card's uid.
            known = self.upload_path if outcome in ("upgraded", "partial") else None
            self.up.hooks.mark(reply, self.exchange, known)
        # An answer may leave part of the client's body unread: answered at once, then a bounded linger.
        reply.linger = self.up.hooks.linger
        return reply

    def record(self, outcome: str, reason: str, *, guard_counted: bool = False) -> None:
        """The counters, the access log's decision and note, and a warning when something was left done."""
        exchange = self.exchange
        hooks = self.up.hooks
        self.up.count(exchange, outcome)
        if outcome == "refused":
            if not guard_counted:
                hooks.count(exchange, "refused")
                exchange.decisions[hooks.name] = "refused"
                exchange.notes[f"{hooks.name}.rule"] = reason
        else:
            hooks.count(exchange, "bridged")
            exchange.decisions[hooks.name] = "upgraded" if outcome == "upgraded" else f"upgrade_{outcome}"
        words = [outcome]
        if reason:
            words.append(f"reason={reason}")
        if self.saved is not None:
            words.append(f"comment={self.saved.uid}")
        words += [f"{status}={n}" for status, n in collections.Counter(f.status for f in self.files).items()]
        note = " ".join(words)
        exchange.notes[f"{hooks.name}.upgrade"] = note
        if outcome in ("partial", "aborted") and self.changed:
            log.warning("legacy_upload_guard: upload upgrade %s; tenant %s, card %s, request id %s", note,
                        exchange.tenant.name, self.card_id, exchange.request_id)



def _sentence(message: str) -> str:
    return message[:1].upper() + message[1:] + "."


def _form_head(boundary: str, field: str, head: PartHead) -> bytes:
    """The restricted upload's one part, up to its content: ``field``, the client's file name and media type."""
    name = head.filename or "file"
    plain = name if _PLAIN_FILENAME_RE.fullmatch(name) else None
    fallback = plain or _NOT_PLAIN_RE.sub("_", name)[:255] or "file"
    disposition = f'form-data; name="{field}"; filename="{fallback}"'
    if plain is None:
        disposition += f"; filename*=UTF-8''{quote(name, safe='')}"
    media = head.content_type or "application/octet-stream"
    return (f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {media}\r\n\r\n").encode("ascii")


def _legacy_file(record: Mapping[str, Any], card_id: int, comment_id: Any) -> dict[str, Any]:
    """The service's record of a restricted access file, with the fields of an earlier file's record a legacy client
    reads: ``id`` stays the file's UUID (also as ``uid``), ``url`` its temporary signed link, ``size`` a number,
    ``type`` 11; ``author_id`` (a number for earlier files) is not known here: null, ``author_uid`` names the user."""
    size = record.get("size")
    return {
        **record,
        "uid": record.get("id"),
        "type": RESTRICTED_FILE_TYPE,
        "size": int(size) if isinstance(size, str) and size.isdigit() else size,
        "card_id": card_id,
        "comment_id": comment_id,
        "author_id": None,
        "deleted": False,
    }
