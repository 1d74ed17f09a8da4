"""One file part's upload to the run's restricted route (``upload``): the file streamed as a new form of one part, the
service's answer read; and when the whole file went and no usable answer came back (or the client left by then), the
upload's parent read for the file the service may have stored anyway, which is deleted when found, and the answer
that says what became of it (docs/policies/legacy_upload_guard.md, "Files behind a lost answer")."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn

from ....core.exchange import BodyNotRead, Reply, UpstreamFailed
from ....core.ratelimit import RateLimited
from ..multipart_splitter import PartHead
from .body import Pipe, form_head, sent_name
from .options import Outcome
from .outcomes import RESTRICTED_FILE_TYPE, Ending, FileEntry, FileStatus, legacy_file
from .run import ID_RE, New, Run, service_time

__all__ = ("upload",)

# After the answer to a whole upload was lost: how long to wait before the parent's file list is read a second
# time (the service may store the file just after the connection broke).
_RECHECK_AFTER = 0.5
# What the answer says of a file whose answer was lost, by what the parent's file list showed, and the outcome.
_FATES = {
    FileStatus.ROLLED_BACK: ("the file the service stored anyway was found (id {id}) and deleted: send the upload "
                             "again", Outcome.ROLLED_BACK),
    FileStatus.ROLLBACK_FAILED: ("the service stored the file (id {id}) and it could not be deleted: it is on the "
                                 "service, do not send it again", Outcome.LEFT_STORED),
    FileStatus.NOT_FOUND: ("the file is not among the card's files: send the upload again", Outcome.FAILED),
}
_UNTOLD = ("whether the service stored the file could not be told{maybe}: look at the card's files before sending it "
           "again", Outcome.LEFT_STORED)


async def upload(run: Run, source: AsyncIterator[bytes], head: PartHead, entry: FileEntry,
                 after: Callable[[], Awaitable[None]] | None = None) -> Ending | None:
    """One file part to the run's target, streamed. None when the file was created (``entry`` says so); else how
    the run ends for it: the answer passed on when nothing was created (the service's, the proxy core's when the
    service gave none, or the bridge's when its answer could not be read), or, when the whole file went and no
    usable answer came back, what the parent's file list showed (a file found is deleted)."""
    return await _Upload(run, source, head, entry, after).send()


class _Upload:
    """One upload: its entry, the pipe its body goes through, and when it began."""

    __slots__ = ("run", "entry", "name", "boundary", "pipe", "started")

    def __init__(self, run: Run, source: AsyncIterator[bytes], head: PartHead, entry: FileEntry,
                 after: Callable[[], Awaitable[None]] | None) -> None:
        self.run = run
        self.entry = entry
        self.name = sent_name(head)  # what the service will list the file under
        self.boundary = boundary = secrets.token_hex(16)
        self.pipe = Pipe(source, form_head(boundary, run.options.upload_field, head),
                         f"\r\n--{boundary}--\r\n".encode(), after)
        self.started = 0.0

    async def send(self) -> Ending | None:
        run = self.run
        assert run.target is not None
        headers = {**run.auth, "Accept": "application/json",
                   "Content-Type": f"multipart/form-data; boundary={self.boundary}"}
        self.entry.path = run.target.path
        self.started = asyncio.get_running_loop().time()
        # A task of its own, so that a client that leaves once its whole file was sent does not cancel the upload
        # half way through its answer: the file it made is then deleted (``abandon``).
        task = asyncio.ensure_future(run.pacer.fetch("POST", run.target.path, headers=headers, body=self.pipe.body(),
                                                     purpose="upload",
                                                     deadline=run.deadline(run.options.request_timeout)))
        try:
            reply = await asyncio.shield(task)
        except asyncio.CancelledError:
            await self.abandon(task)
            raise
        except UpstreamFailed as failed:
            return await self.unanswered(failed)
        except RateLimited as limited:
            return await self.limited(limited)
        if not self.pipe.tail_sent:
            return await self.answered_early(reply)
        return await self.answered(reply)

    # --- what the service answered ------------------------------------------------------------------------------

    async def unanswered(self, failed: UpstreamFailed) -> Ending:
        """No answer came: the upload's answer is the proxy core's, or, once the whole file went, the file list's."""
        pipe = self.pipe
        if pipe.failure is not None:
            raise pipe.failure from None  # the client's body broke off, or broke a rule: the upload with it
        run = self.run
        self.entry.status = FileStatus.FAILED
        run.body_usable = await pipe.stop(run.options.request_timeout)
        if not pipe.tail_sent:
            return run.passed_on(failed.reply, "upload", None)
        # The whole file went, then the connection broke or timed out: the service may have stored it.
        await self.find_stored(certain=False)
        return self.lost("the connection to the service broke after the whole file was sent, before its answer",
                         f"upload_{failed.kind}")

    async def limited(self, limited: RateLimited) -> NoReturn:
        """The service's limits kept the upload from going in time, or it answered the upload 429 (or 503 with
        Retry-After: it made nothing): the client is told when to send it again."""
        run = self.run
        self.entry.status, self.entry.upstream_status = FileStatus.FAILED, limited.status
        run.body_usable = await self.pipe.stop(run.options.request_timeout)
        raise run.rate_limited("upload", limited)

    async def answered_early(self, reply: Reply) -> Ending:
        """The service answered before it had the whole file (an early refusal): it made nothing."""
        run = self.run
        entry = self.entry
        entry.status, entry.upstream_status = FileStatus.FAILED, reply.status
        try:
            await reply.read(run.options.max_answer_bytes)
        except BodyNotRead:
            reply.discard()
            reply = run.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service answered the upload before it had "
                              "the whole file, and its answer could not be read")
        run.body_usable = await self.pipe.stop(run.options.request_timeout)
        if 200 <= reply.status < 300:
            reply = run.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", "the service answered the upload before it had "
                              "the whole file")
        return run.passed_on(reply, "upload", entry.upstream_status)

    async def answered(self, reply: Reply) -> Ending | None:
        run = self.run
        entry = self.entry
        if not 200 <= reply.status < 300:
            entry.status, entry.upstream_status = FileStatus.FAILED, reply.status
            return run.passed_on(reply, "upload", reply.status)
        record = await _answer_record(run, reply)
        file_id = _record_id(record)
        if record is None or file_id is None:
            # The service said it stored the file, and its answer does not say which: find it.
            entry.status, entry.upstream_status = FileStatus.FAILED, reply.status
            await self.find_stored(certain=True)
            return self.lost("the service's answer to the upload is not a file record (cut off, unreadable or of "
                             "another shape)", "upload_answer")
        entry.status, entry.id = FileStatus.UPLOADED, file_id
        run.remember(file_id)
        comment = run.saved
        entry.record = legacy_file(record, int(run.card_id), comment.id if comment is not None else None)
        return None

    def lost(self, what: str, reason: str) -> Ending:
        """The ending of an upload whose answer was lost once the whole file had gone: what the parent's file list
        showed (``entry.status``), the outcome it makes, and the file's id when known."""
        entry = self.entry
        text, outcome = _FATES.get(entry.status, _UNTOLD)
        maybe = f" (it may be one of {', '.join(entry.candidates)})" if entry.candidates else ""
        text = text.format(id=entry.id, maybe=maybe)
        return Ending(outcome, self.run.error(502, "LEGACY_UPLOAD_UPGRADE_FAILED", f"{what}; {text}"), reason)

    # --- a client that left -------------------------------------------------------------------------------------

    async def abandon(self, task: asyncio.Future[Reply]) -> None:
        """The client left during the upload: an upload still missing its end is broken off (the service makes no
        file of it); one whose whole file went is waited for, so that the file it made can be deleted."""
        if not self.pipe.tail_sent:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        if await self.answer_after_leaving(task):
            return
        # No usable answer: the parent's file list says whether the service stored it (found: deleted).
        self.entry.status = FileStatus.FAILED
        await self.find_stored(certain=False)

    async def answer_after_leaving(self, task: asyncio.Future[Reply]) -> bool:
        """The upload's answer, waited for (``request_timeout``): whether it said what became of the file."""
        entry = self.entry
        try:
            async with asyncio.timeout(self.run.options.request_timeout):
                reply = await task
                if not 200 <= reply.status < 300:
                    reply.discard()
                    entry.status = FileStatus.FAILED
                    return True
                record = await _answer_record(self.run, reply)
        except (TimeoutError, UpstreamFailed, RateLimited):
            return False
        file_id = record.get("id") if record is not None else None
        if not isinstance(file_id, str):
            return False
        entry.status, entry.id = FileStatus.UPLOADED, file_id
        return True

    # --- a file behind a lost answer ----------------------------------------------------------------------------

    async def find_stored(self, *, certain: bool) -> None:
        """The whole file went and no usable answer came: whether the service stored it, from the file list of the
        upload's parent (the card lookup). Found (one file of this name and size that was not there before): it is
        deleted, and the entry says so (``rolled_back``, or ``rollback_failed`` with its id); not found:
        ``not_found`` (``certain``: the service said it stored a file, so it is ``unknown``); several that could be
        it, or no list: ``unknown``, with the candidates."""
        entry = self.entry
        found = await self.search()
        if found is None:
            entry.status = FileStatus.UNKNOWN
        elif not found:
            entry.status = FileStatus.UNKNOWN if certain else FileStatus.NOT_FOUND
        elif len(found) > 1:
            entry.status, entry.candidates = FileStatus.UNKNOWN, found[:10]
        else:
            entry.id = found[0]
            await self.run.delete(entry)

    async def search(self) -> list[str] | None:
        """The files that may be this one, looked for twice (the service may store it just after the connection
        broke); None when no list could be read in ``request_timeout``."""
        found: list[str] | None = []
        try:
            async with asyncio.timeout(self.run.options.request_timeout):
                for attempt in range(2):
                    if attempt:
                        await asyncio.sleep(_RECHECK_AFTER)
                    found = await self.candidates()
                    if found is None or found:
                        break
        except TimeoutError:
            return None
        return found

    async def candidates(self) -> list[str] | None:
        """Ids of the files of the upload's parent that may be the one just sent: its name and size, not known
        before this request (when the parent's files were known), created since the upload began by the service's
        own clock (when they were not). None when the parent's list could not be read."""
        run = self.run
        window = asyncio.get_running_loop().time() - self.started
        looked = await run.search_card("file_search")
        if looked is None:
            return None
        reply, card = looked
        files = self._files(card)
        if not isinstance(files, list):
            return []
        mine = run.files.ids() | set(run.up.made.get(run.card_key(), ()))
        assert run.target is not None
        is_new = New(run.target.known, service_time(reply.headers.get("Date")), window)
        size = str(self.pipe.size)
        return [file_id for f in files
                if (file_id := _same_file(f, self.name, size, mine)) is not None and is_new(file_id, f)]

    def _files(self, card: Mapping[str, Any]) -> Any:
        """The files of the upload's parent as the service listed them: the card's, or its comment's."""
        saved = self.run.saved
        return card.get("files") if saved is None else _comment_files(card, saved.uid)


def _comment_files(card: Mapping[str, Any], uid: str | None) -> Any:
    """The ``files`` of the comment ``uid`` as the card lists it (None when it does not)."""
    comments = card.get("comments")
    found = next((c for c in comments if isinstance(c, dict) and c.get("uid") == uid), None) \
        if isinstance(comments, list) else None
    return found.get("files") if found is not None else None


def _same_file(entity: Any, name: str, size: str, mine: set[str]) -> str | None:
    """The id of a listed file that is a restricted file of this name and size, and not one the bridge made."""
    if not isinstance(entity, dict):
        return None
    file_id = entity.get("id")
    if not isinstance(file_id, str) or not ID_RE.fullmatch(file_id) or file_id in mine:
        return None
    return file_id if _restricted_file_of(entity, name, size) else None


def _restricted_file_of(entity: dict[str, Any], name: str, size: str) -> bool:
    """Whether a listed file is a restricted file of this name and size."""
    return (entity.get("type", RESTRICTED_FILE_TYPE) == RESTRICTED_FILE_TYPE and entity.get("name") == name
            and str(entity.get("size")) == size)


def _record_id(record: dict[str, Any] | None) -> str | None:
    """The file id an upload's answer names, if it is one."""
    file_id = record.get("id") if record is not None else None
    return file_id if isinstance(file_id, str) and ID_RE.fullmatch(file_id) else None


async def _answer_record(run: Run, reply: Reply) -> dict[str, Any] | None:
    """An upload's answer as a JSON object (None: over ``max_answer_bytes``, broken off, not JSON, not an object)."""
    try:
        raw = await reply.read(run.options.max_answer_bytes)
        data = json.loads(raw)
    except (BodyNotRead, ValueError):
        reply.discard()
        return None
    return data if isinstance(data, dict) else None
