"""One request the upload upgrade took on (``Run``): what it has done so far, and the steps both flows share: the
card's uid (the id cache), the requests of the bridge's own to the service, one file part's upload, finding out what
became of a file whose answer was lost, and deleting what was made for a client who is told it was not."""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import hashlib
import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ....core.exchange import BodyNotRead, Exchange, Reply, UpstreamError, UpstreamFailed
from ....core.spool import SpoolFile
from ....core.tenants import canonical_host
from ..multipart_splitter import PartHead
from .body import Parts, Pipe, form_head, sent_name
from .options import UpgradeOptions, sentence
from .outcomes import RESTRICTED_FILE_TYPE, CommentRecord, FileEntry, Partial, Refusal, Stop, legacy_file, log

if TYPE_CHECKING:
    from . import Upgrade

__all__ = ("CardKey", "Run")

# A uid or file id the service returns: it goes into a path, percent-encoded all the same.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~\-]{0,127}")
CARD_ID_RE = re.compile(r"[0-9]{1,18}")
# (tenant, Host, the SHA-256 of the client's Authorization, card id): an id cache entry.
CardKey = tuple[str, str, bytes, str]
# After the answer to a whole upload was lost: how long to wait before the parent's file list is read a second
# time (the service may store the file just after the connection broke).
_RECHECK_AFTER = 0.5
# Clock skew allowed between the service's Date and the created time of a file it just stored.
SKEW = 2.0


@dataclass(slots=True)
class Run:
    """One request the bridge took on: what it has done so far, so that every ending can say so."""

    up: Upgrade
    exchange: Exchange
    auth: dict[str, str] = field(default_factory=dict)
    card_id: str = ""
    card: dict[str, Any] | None = None  # the card lookup's answer, when one was made for this request
    upload_path: str | None = None
    files: list[FileEntry] = field(default_factory=list)
    unlisted: int = 0  # file parts past the most an answer lists
    saved: CommentRecord | None = None  # the comment the files go to
    changed: bool = False  # the bridge saved a comment or uploaded a file for this request
    comment_unknown: bool = False  # a comment's answer was lost: it may have been saved
    # Ids of the files the upload's parent (the card, or the comment) had before this request uploaded to it (None:
    # not known: the card's uid came from the id cache).
    known: set[str] | None = None
    spools: list[SpoolFile] = field(default_factory=list)
    spooled: int = 0
    parts: Parts | None = None
    body_usable: bool = True  # no upload broken off half way may still be reading the client's body
    outcome: str | None = None  # how a run that returns an answer ended (None: upgraded)
    reason: str = ""

    def __post_init__(self) -> None:
        auth = self.exchange.headers.get("Authorization")
        if auth is not None:
            self.auth["Authorization"] = auth

    @property
    def options(self) -> UpgradeOptions:
        return self.up.options

    # --- the card -----------------------------------------------------------------------------------------------

    def need_card_id(self) -> None:
        card_id = self.exchange.params.get("card_id", "")
        if not CARD_ID_RE.fullmatch(card_id):
            raise Refusal("card_id", "the card id in the path is not a number: the card cannot be looked up")
        self.card_id = str(int(card_id))

    def card_key(self) -> CardKey:
        """The id cache's key: a mapping serves only the company, the Host and the credentials whose lookup made it
        (another token's use of a card is nothing this client can learn from the gateway)."""
        exchange = self.exchange
        auth = exchange.headers.get("Authorization", "")
        token = hashlib.sha256(auth.encode("utf-8", "surrogateescape")).digest()
        return (exchange.tenant.name, canonical_host(exchange.headers.get("Host", "")), token, self.card_id)

    async def resolve_card(self) -> str:
        """The card's uid: from the id cache, else from the card lookup (with the client's token)."""
        ids = self.up.ids
        key = self.card_key()
        cached = ids.get(key) if ids is not None else None
        if cached is not None:
            return cached
        card = await self.lookup()
        uid = card.get("uid")
        if not isinstance(uid, str) or not ID_RE.fullmatch(uid):
            raise self.bad_answer("lookup", "the card lookup's answer has no usable uid")
        if ids is not None:
            ids[key] = uid
        return uid

    async def lookup(self) -> dict[str, Any]:
        path = self.up.card_lookup.render({"card_id": self.card_id}, encode=True)
        reply, data = await self.call("GET", path, stage="lookup", timeout=self.options.lookup_timeout)
        if data is None:
            raise self.passed_on(reply, "lookup", reply.status)
        self.card = data
        return data

    def add_file(self, head: PartHead) -> FileEntry:
        entry = FileEntry(len(self.files), head.name, head.filename)
        self.files.append(entry)
        limit = self.options.max_files
        if len(self.files) > limit:
            raise Refusal("too_many_files", f"the body has more than {limit} file parts")
        return entry

    # --- one file part to a restricted upload route -------------------------------------------------------------

    async def upload(self, source: AsyncIterator[bytes], head: PartHead, path: str, entry: FileEntry,
                     after: Callable[[], Awaitable[None]] | None = None) -> Reply | None:
        """One file part to a restricted upload route, streamed. None when the file was created (``entry`` says
        so); else the answer to pass on (the service's, the proxy core's when the service gave none, or the bridge's
        when its answer could not be read). When the whole file went and no usable answer came back, the parent's
        file list says whether the service stored it; a file found is deleted (``find_stored``)."""
        options = self.options
        boundary = secrets.token_hex(16)
        pipe = Pipe(source, form_head(boundary, options.upload_field, head), f"\r\n--{boundary}--\r\n".encode(), after)
        headers = {**self.auth, "Accept": "application/json",
                   "Content-Type": f"multipart/form-data; boundary={boundary}"}
        entry.path = path
        loop = asyncio.get_running_loop()
        started = loop.time()
        # A task of its own, so that a client that leaves once its whole file was sent does not cancel the upload
        # half way through its answer: the file it made is then deleted (``abandon``).
        task = asyncio.ensure_future(self.exchange.fetch("POST", path, headers=headers, body=pipe.body(),
                                                         purpose="upload"))
        try:
            reply = await asyncio.shield(task)
        except asyncio.CancelledError:
            await self.abandon(task, pipe, entry, head, started)
            raise
        except UpstreamFailed as failed:
            if pipe.failure is not None:
                raise pipe.failure from None  # the client's body broke off, or broke a rule: the upload with it
            entry.status = "failed"
            self.body_usable = await pipe.stop(options.request_timeout)
            if not pipe.tail_sent:
                return failed.reply
            # The whole file went, then the connection broke or timed out: the service may have stored it.
            await self.find_stored(entry, head, pipe.size, started, certain=False)
            return self.lost(entry, "the connection to the service broke after the whole file was sent, before its "
                             "answer", f"upload_{failed.kind}")
        if not pipe.tail_sent:
            # The service answered before it had the whole file (an early refusal): it made nothing.
            entry.status, entry.upstream_status = "failed", reply.status
            try:
                await reply.read(options.max_answer_bytes)
            except BodyNotRead:
                reply.discard()
                reply = self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service answered the upload before it "
                                   "had the whole file, and its answer could not be read")
            self.body_usable = await pipe.stop(options.request_timeout)
            if 200 <= reply.status < 300:
                return self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service answered the upload before it "
                                  "had the whole file")
            return reply
        if not 200 <= reply.status < 300:
            entry.status, entry.upstream_status = "failed", reply.status
            return reply
        record = await self.answer_record(reply)
        file_id = record.get("id") if record is not None else None
        if record is None or not isinstance(file_id, str) or not ID_RE.fullmatch(file_id):
            # The service said it stored the file, and its answer does not say which: find it.
            entry.status, entry.upstream_status = "failed", reply.status
            await self.find_stored(entry, head, pipe.size, started, certain=True)
            return self.lost(entry, "the service's answer to the upload is not a file record (cut off, unreadable "
                             "or of another shape)", "upload_answer")
        entry.status, entry.id = "uploaded", file_id
        self.remember(file_id)
        comment = self.saved
        entry.record = legacy_file(record, int(self.card_id), comment.id if comment is not None else None)
        return None

    def remember(self, file_id: str) -> None:
        made = self.up.made
        key = self.card_key()
        made[key] = (*made.get(key, ())[-15:], file_id)

    async def answer_record(self, reply: Reply) -> dict[str, Any] | None:
        try:
            raw = await reply.read(self.options.max_answer_bytes)
            data = json.loads(raw)
        except (BodyNotRead, ValueError):
            reply.discard()
            return None
        return data if isinstance(data, dict) else None

    def lost(self, entry: FileEntry, what: str, reason: str) -> Reply:
        """The answer to an upload whose answer was lost once the whole file had gone: what the parent's file list
        showed (``entry.status``), the outcome it makes, and the file's id when known."""
        fate = {
            "rolled_back": (f"the file the service stored anyway was found (id {entry.id}) and deleted: send the "
                            "upload again", "rolled_back"),
            "rollback_failed": (f"the service stored the file (id {entry.id}) and it could not be deleted: it is "
                                "on the service, do not send it again", "left_stored"),
            "not_found": ("the file is not among the card's files: send the upload again", "failed"),
        }
        text, outcome = fate.get(entry.status, (
            "whether the service stored the file could not be told" + (
                f" (it may be one of {', '.join(entry.candidates)})" if entry.candidates else "")
            + ": look at the card's files before sending it again", "left_stored"))
        self.outcome, self.reason = outcome, reason
        reply = self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", f"{what}; {text}")
        return reply

    async def find_stored(self, entry: FileEntry, head: PartHead, size: int, started: float, *,
                          certain: bool) -> None:
        """The whole file went and no usable answer came: whether the service stored it, from the file list of the
        upload's parent (the card lookup). Found (one file of this name and size that was not there before): it is
        deleted, and ``entry`` says so (``rolled_back``, or ``rollback_failed`` with its id); not found: ``not_found``
        (``certain``: the service said it stored a file, so it is ``unknown``); several that could be it, or no list:
        ``unknown``, with the candidates."""
        options = self.options
        loop = asyncio.get_running_loop()
        name = sent_name(head)
        try:
            async with asyncio.timeout(options.request_timeout):
                found: list[str] = []
                for attempt in range(2):
                    if attempt:
                        await asyncio.sleep(_RECHECK_AFTER)
                    found = await self.stored_candidates(name, size, loop.time() - started)
                    if found:
                        break
        except (TimeoutError, UpstreamFailed, Stop, Partial):
            entry.status = "unknown"
            return
        if not found:
            entry.status = "unknown" if certain else "not_found"
            return
        if len(found) > 1:
            entry.status, entry.candidates = "unknown", found[:10]
            return
        entry.id = found[0]
        entry.status = "rollback_failed"
        await self.delete(entry)

    async def stored_candidates(self, name: str, size: int, window: float) -> list[str]:
        """Ids of the files of the upload's parent that may be the one just sent: its name and size, not known
        before this request (when the parent's files were known), created since the upload began by the service's
        own clock (when they were not)."""
        path = self.up.card_lookup.render({"card_id": self.card_id}, encode=True)
        reply, data = await self.call("GET", path, stage="lookup", timeout=self.options.lookup_timeout,
                                      purpose="file_search")
        if data is None:
            reply.discard()
            raise UpstreamFailed(UpstreamError.OTHER, reply)
        files: Any = data.get("files")
        comment = self.saved
        if comment is not None:
            comments = data.get("comments")
            found = next((c for c in comments if isinstance(c, dict) and c.get("uid") == comment.uid), None) \
                if isinstance(comments, list) else None
            files = found.get("files") if found is not None else None
        if not isinstance(files, list):
            return []
        mine = {f.id for f in self.files if f.id is not None} | set(self.up.made.get(self.card_key(), ()))
        known = self.known
        now = service_time(reply.headers.get("Date"))
        out = []
        for f in files:
            if not isinstance(f, dict):
                continue
            file_id = f.get("id")
            if not isinstance(file_id, str) or not ID_RE.fullmatch(file_id) or file_id in mine:
                continue
            if f.get("type", RESTRICTED_FILE_TYPE) != RESTRICTED_FILE_TYPE or f.get("name") != name:
                continue
            if str(f.get("size")) != str(size):
                continue
            if file_id in known if known is not None else not made_since(f, now, window):
                continue
            out.append(file_id)
        return out

    async def abandon(self, task: asyncio.Future[Reply], pipe: Pipe, entry: FileEntry, head: PartHead,
                      started: float) -> None:
        """The client left during an upload: an upload still missing its end is broken off (the service makes no
        file of it); one whose whole file went is waited for, so that the file it made can be deleted."""
        options = self.options
        if pipe.tail_sent:
            try:
                async with asyncio.timeout(options.request_timeout):
                    reply = await task
                    if 200 <= reply.status < 300:
                        record = await self.answer_record(reply)
                        if record is not None and isinstance(record.get("id"), str):
                            entry.status, entry.id = "uploaded", record["id"]
                            return
                    else:
                        reply.discard()
                        entry.status = "failed"
                        return
            except (TimeoutError, UpstreamFailed):
                pass
            # No usable answer: the parent's file list says whether the service stored it (found: deleted).
            entry.status = "failed"
            await self.find_stored(entry, head, pipe.size, started, certain=False)
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def delete(self, entry: FileEntry) -> None:
        """One file the bridge made, deleted (with the client's token); ``entry.status`` says whether it went."""
        assert entry.path is not None and entry.id is not None
        entry.status = "rollback_failed"
        reply = await self.exchange.fetch("DELETE", f"{entry.path}/{quote(entry.id, safe='')}", headers=self.auth,
                                          purpose="delete")
        reply.discard()
        if 200 <= reply.status < 300 or reply.status == 404:
            entry.status = "rolled_back"

    async def rollback(self) -> None:
        """Delete the files this request uploaded (its client went away before it could be told)."""
        made = [f for f in self.files if f.status == "uploaded"]
        if not made:
            return
        try:
            async with asyncio.timeout(self.options.request_timeout):
                for entry in made:
                    await self.delete(entry)
        except (TimeoutError, UpstreamFailed):
            pass
        left = [f.id for f in made if f.status != "rolled_back"]
        if left:
            log.warning("legacy_upload_guard: upload upgrade could not delete %d file(s) of a client that went away "
                        "(%s); tenant %s, card %s, request id %s", len(left), ", ".join(str(i) for i in left),
                        self.exchange.tenant.name, self.card_id, self.exchange.request_id)

    # --- requests of the bridge's own ---------------------------------------------------------------------------

    async def call(self, method: str, path: str, *, stage: str, timeout: float, query: str = "",
                   body: bytes | None = None, headers: Mapping[str, str] | None = None, purpose: str | None = None
                   ) -> tuple[Reply, dict[str, Any] | None]:
        """A small request with the client's token; its answer, and its JSON object when the status is 2xx (None
        otherwise: the answer's body is then left to stream on)."""
        sent = {**self.auth, "Accept": "application/json", **(headers or {})}
        try:
            async with asyncio.timeout(timeout):
                reply = await self.exchange.fetch(method, path, query=query, headers=sent, body=body,
                                                  purpose=purpose or _PURPOSES.get(stage, stage))
                if not 200 <= reply.status < 300:
                    return reply, None
                data = await self.read_json(reply, stage)
        except UpstreamFailed as failed:
            raise Stop("failed", failed.reply, f"{stage}_{failed.kind}") from None
        except TimeoutError:
            raise Stop("failed", self.error(504, "LEGACY_UPLOAD_UPGRADE_TIMEOUT", f"the service did not answer the "
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
        return Reply.error(status, code, sentence(message), self.exchange.ensure_request_id())

    def bad_answer(self, stage: str, message: str) -> Stop | Partial:
        if self.changed:
            return Partial(502, f"{stage}_answer", message)
        return Stop("failed", self.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", message), f"{stage}_answer")

    def passed_on(self, reply: Reply, stage: str, status: int | None) -> Stop:
        """The answer to pass on when nothing was created: the service's (its ``status``), or the proxy core's when
        the service gave none (``status`` None)."""
        if status is None:
            return Stop("failed", reply, f"{stage}_error")
        return Stop("denied" if status in (401, 403, 404) else "failed", reply, f"{stage}_status_{status}")


# The purpose each stage's requests are counted under (gateway_subrequests_total).
_PURPOSES = {"lookup": "card_lookup", "comment": "comment"}


def made_since(entity: Mapping[str, Any], now: float | None, window: float) -> bool:
    """Whether the service created ``entity`` within the last ``window`` seconds, by its own clock (``now``: the
    ``Date`` of the answer that listed it), allowing ``SKEW``."""
    created = iso_time(entity.get("created"))
    return now is not None and created is not None and created >= now - window - SKEW


def service_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def iso_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()
