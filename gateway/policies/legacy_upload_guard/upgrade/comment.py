"""The comment flow: ``POST /cards/{card_id}/comments`` and ``PATCH /cards/{card_id}/comments/{comment_id}`` with file
parts, performed as the comment (its text parts, to the same route) and then one restricted upload per file part to
``POST /cards/{card_uid}/comments/{comment_uid}/files``, in the body's order; and the comment file flow
(``comment_file``): that upload route's path with a number where a uid belongs, one file part to the comment.

A file part that comes before the comment's text is spooled to disk (the process's spool area: ``spool_bytes`` per
request, ``spool.max_bytes`` for the process) until the comment exists. The comment's own request is never broken
off half way: a client that leaves while it is on its way does not cancel it, and what the service answered is
recorded; an answer that is lost is looked for among the card's comments.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ....core.exchange import BodyBroken, Reply
from ....core.multipart import Ambiguous, Boundary
from ....core.spool import SpoolError, SpoolFile, SpoolFull
from ..multipart_splitter import PartHead
from .body import Parts
from .card import multipart, one_file
from .options import Outcome
from .outcomes import CommentRecord, Ending, FileEntry, FileStatus, Partial, Refusal, Stop, log
from .run import CARD_ID_RE, ID_RE, New, Run, Target, comments_of, file_ids, service_time
from .upload import upload

__all__ = ("comment", "comment_file")

# Refusals after which the rest of a comment's body is still read to list its file parts.
_LISTABLE = ("too_many_files", "text_after_files")
# How a comment's request ended when it went and its answer did not (the reason's second word).
_ANSWER_LOST = ("reset", "timeout", "other")


async def comment(run: Run, boundary: Boundary, source: AsyncIterator[bytes]) -> Ending:
    """``source``: the client's body (what the guard already read, then the rest)."""
    run.need_card_id()
    _check_comment_id(run.exchange.params.get("comment_id"))
    card_uid = await run.resolve_card()
    parts = run.parts = Parts(source, run.up.hooks.splitter(boundary))
    spooler = _Spooler(run)
    try:
        await _Form(run, boundary, card_uid, spooler).read(parts)
    except (Partial, Refusal) as stopped:
        if run.changed and (isinstance(stopped, Partial) or stopped.rule in _LISTABLE):
            await _list_rest(run, parts)
        raise
    finally:
        spooler.close()
    return Ending(Outcome.UPGRADED, _answer(run))


def _check_comment_id(comment_id: str | None) -> None:
    """A comment id in the path (an update of a comment) is a number."""
    if comment_id is not None and not CARD_ID_RE.fullmatch(comment_id):
        raise Refusal("comment_id", "the comment id in the path is not a number")


async def comment_file(run: Run, boundary: Boundary) -> Ending:
    """``POST /cards/{card_id}/comments/{comment_id}/files`` with a number where a uid belongs (the card's, the
    comment's or both): the one file part uploaded to the comment's restricted route, the uids found as for an
    update of files alone (the card lookup, or the id cache for the card's uid when the comment's is in the path)."""
    boundary = multipart(run, boundary)
    params = run.exchange.params
    comment_uid = params.get("comment_uid")
    if "card_id" not in params:
        raise Refusal("card_id", "the card is named by its uid and the comment by a number: the comment's uid is "
                      "looked up through the card, which the card lookup names by its number")
    run.need_card_id()
    if comment_uid is not None:
        card_uid = await run.resolve_card()
        run.saved = CommentRecord(None, comment_uid, {})
        run.target = Target(run.up.comment_upload.render({"card_uid": card_uid, "comment_uid": comment_uid},
                                                         encode=True), None)
    else:
        comment_id = params.get("comment_id", "")
        if not CARD_ID_RE.fullmatch(comment_id):
            raise Refusal("comment_id", "the comment id in the path is neither a number nor a uid")
        card_uid = await run.resolve_card()
        run.saved = await _existing(run, comment_id, card_uid)
    return await one_file(run, boundary)


def _answer(run: Run) -> Reply:
    """The service's comment record with the uploaded files appended to its ``files``."""
    assert run.saved is not None
    answer = dict(run.saved.answer)
    kept = answer.get("files")
    answer["files"] = [*(kept if isinstance(kept, list) else ()),
                       *(f.record for f in run.files.entries if f.record is not None)]
    reply = Reply.json(run.saved.status, answer)
    reply.headers["Cache-Control"] = "no-store"  # it holds signed links
    return reply


class _Form:
    """The comment's body read part by part: its text parts kept as they were written (each with its delimiter line,
    within ``max_field_bytes`` together), the comment saved once its text and a file part have come (or at the end),
    the file parts uploaded to it, those before it held on disk meanwhile."""

    __slots__ = ("run", "boundary", "card_uid", "spooler", "fields", "text", "waiting")

    def __init__(self, run: Run, boundary: Boundary, card_uid: str, spooler: _Spooler) -> None:
        self.run = run
        self.boundary = boundary
        self.card_uid = card_uid
        self.spooler = spooler
        self.fields = bytearray()
        self.text: bytes | None = None  # the text field's content, once read
        self.waiting: list[tuple[PartHead, FileEntry, SpoolFile]] = []

    async def read(self, parts: Parts) -> None:
        run = self.run
        while (head := await parts.next_part()) is not None:
            if not head.is_file:
                await self.text_part(parts, head)
                continue
            entry = run.add_file(head)
            if run.saved is None and self.text is not None:
                await self.save()
            if run.saved is None:
                self.waiting.append((head, entry, await self.spooler.take(parts)))
            else:
                await _to_comment(run, parts.content(), head, entry)
        if run.saved is None:
            await self.save()

    async def text_part(self, parts: Parts, head: PartHead) -> None:
        if self.run.saved is not None:
            raise Refusal("text_after_files", f"part {head.index} ({head.name!r}) is a text part after a file part "
                          "that went to the comment already saved")
        fields = self.fields
        fields += self.boundary.delimiter + b"\r\n" + head.raw + b"\r\n\r\n"
        start = len(fields)
        async for piece in parts.content():
            fields += piece
            self.check()
        if head.name == self.run.options.text_field:
            self.text = bytes(fields[start:])
        fields += b"\r\n"
        self.check()

    def check(self) -> None:
        limit = self.run.options.max_field_bytes
        if len(self.fields) > limit:
            raise Refusal("fields_too_large", f"the comment's text parts are over {limit} bytes", 413)

    async def save(self) -> None:
        """The comment created or updated with the text parts, then the file parts that waited for it uploaded."""
        run = self.run
        comment_id = run.exchange.params.get("comment_id")
        if not self.fields and comment_id is not None:
            # A files-only update changes nothing of the comment and only needs its uid.
            run.saved = await _existing(run, comment_id, self.card_uid)
        else:
            body = self.body()  # (a comment of files alone gets an empty text)
            await _save(run, body, self.text, self.card_uid)
        for head, entry, spool in self.waiting:
            await _to_comment(run, spool.chunks(), head, entry)
            spool.close()
        self.waiting.clear()

    def body(self) -> bytes:
        """The comment's multipart body: its text parts, or, for a comment of files alone, an empty text (the service
        needs one)."""
        fields = self.fields
        if not fields:
            fields += (self.boundary.delimiter + b"\r\nContent-Disposition: form-data; name=\""
                       + self.run.options.text_field.encode() + b"\"\r\n\r\n\r\n")
            self.text = b""
        return bytes(fields + self.boundary.delimiter + b"--\r\n")


async def _list_rest(run: Run, parts: Parts) -> None:
    """After a failure: read on (dropping file contents, within ``rest_bytes``) to list the file parts not sent: at
    most ``max_files + 1`` are listed (the answer stays small), the others counted."""
    if not run.body_usable:
        return
    options = run.options
    limit = parts.bytes_read + options.rest_bytes
    try:
        async with asyncio.timeout(options.request_timeout):
            while (head := await parts.next_part(limit)) is not None:
                if head.is_file:
                    run.files.unsent(head, options.max_files + 1)
    except (Ambiguous, BodyBroken, TimeoutError, Refusal):
        pass


async def _save(run: Run, body: bytes, text: bytes | None, card_uid: str) -> None:
    """The comment sent (created, or updated with its text parts) and recorded."""
    reply, data = await _sent(run, body, text, card_uid)
    if data is None:
        raise Stop(run.passed_on(reply, "comment", reply.status))
    if not _saved(run, reply, data, card_uid):
        raise Partial(502, "comment_answer", "the service saved the comment but its answer names no usable uid, so "
                      "no file could be uploaded to it")


async def _sent(run: Run, body: bytes, text: bytes | None, card_uid: str) -> tuple[Reply, dict[str, Any] | None]:
    """The comment's request and its answer. Never broken off half way: a client that leaves while the comment is on
    its way does not cancel it (the service may save it all the same); its answer is waited for and recorded (settle
    warns, naming the comment)."""
    exchange = run.exchange
    loop = asyncio.get_running_loop()
    started = loop.time()
    saving = asyncio.ensure_future(run.call(exchange.method, exchange.path, query=exchange.query, body=body,
                                            stage="comment", timeout=run.options.request_timeout,
                                            headers={"Content-Type": exchange.headers.get("Content-Type", "")}))
    try:
        return await asyncio.shield(saving)
    except asyncio.CancelledError:
        await _answer_after_leaving(run, saving, card_uid)
        raise
    except Stop as stop:
        reason = stop.ending.reason
        # The comment went, its answer did not: the card's comments say whether it was saved.
        if reason.startswith("comment_") and reason.split("_", 1)[1] in _ANSWER_LOST \
                and await _look_for_comment(run, text, loop.time() - started):
            raise Partial(502, reason, "the service's answer to the comment was lost, and the card's comments show "
                          "it was saved; no file was uploaded to it") from None
        raise


async def _answer_after_leaving(run: Run, saving: asyncio.Future[tuple[Reply, dict[str, Any] | None]],
                                card_uid: str) -> None:
    """The client left while the comment was on its way: its answer, waited for (``request_timeout``), recorded."""
    try:
        async with asyncio.timeout(run.options.request_timeout):
            reply, data = await saving
    except (Stop, Partial, TimeoutError):
        run.comment_unknown = True
        return
    if data is not None:
        _saved(run, reply, data, card_uid)  # (without a usable uid: named by its id)


def _saved(run: Run, reply: Reply, data: dict[str, Any], card_uid: str) -> bool:
    """The comment the service saved, recorded; False when its answer names no usable uid (it is named by its id)."""
    run.changed = True
    uid = data.get("uid")
    if not isinstance(uid, str) or not ID_RE.fullmatch(uid):
        run.saved = CommentRecord(data.get("id"), None, data, reply.status)
        return False
    run.saved = CommentRecord(data.get("id"), uid, data, reply.status)
    run.target = Target(run.up.comment_upload.render({"card_uid": card_uid, "comment_uid": uid}, encode=True),
                        file_ids(data.get("files")))
    return True


async def _look_for_comment(run: Run, text: bytes | None, window: float) -> bool:
    """The comment's answer was lost: a comment of this text on the card, that the card lookup made for this request
    did not list (or, without one, that the service created since the comment was sent, by its own clock), is taken
    for it: named in the answer and the log (True). Otherwise the answer and the log say that it may exist."""
    looked = await run.search_card("comment_search")
    found = None if looked is None else _lost_comment(run, *looked, text, window)
    if found is None:
        run.comment_unknown = True
        return False
    run.changed = True
    uid = found.get("uid")
    run.saved = CommentRecord(found.get("id"), uid if isinstance(uid, str) else None, found)
    return True


def _lost_comment(run: Run, reply: Reply, card: dict[str, Any], text: bytes | None, window: float
                  ) -> dict[str, Any] | None:
    """The one comment of ``card`` that can be the one whose answer was lost (None: none, or several)."""
    comments = comments_of(card)
    if comments is None:
        return None
    is_new = _new_since_lookup(run, reply, window)
    wanted = None if text is None else text.decode("utf-8", "replace")
    found = [c for c in comments if c.get("text") == wanted and is_new(str(c.get("id")), c)]
    return found[0] if len(found) == 1 else None


def _new_since_lookup(run: Run, reply: Reply, window: float) -> New:
    """Which comments are new: not among those the card lookup listed, or dated within ``window`` of the answer."""
    before = comments_of(run.card) if run.card is not None else None
    return New(None if before is None else {str(c.get("id")) for c in before},
               service_time(reply.headers.get("Date")), window)


async def _existing(run: Run, comment_id: str, card_uid: str) -> CommentRecord:
    """A comment updated with files alone: its uid and record from the card lookup (made for this request, so
    that the answer is the comment as it is now)."""
    card = run.card if run.card is not None else await run.lookup()
    found = _comment_in(card, str(int(comment_id)))
    if found is None:
        raise Stop(Ending(Outcome.DENIED, run.error(404, "LEGACY_UPLOAD_UPGRADE_NOT_FOUND", "the comment is not "
                                                    "among the card's comments as the service lists them"),
                          "comment_not_found"))
    uid = found.get("uid")
    if not isinstance(uid, str) or not ID_RE.fullmatch(uid):
        raise run.bad_answer("lookup", "the card lookup's answer has no usable uid for the comment")
    run.target = Target(run.up.comment_upload.render({"card_uid": card_uid, "comment_uid": uid}, encode=True),
                        file_ids(found.get("files")))
    return CommentRecord(found.get("id"), uid, found)


def _comment_in(card: dict[str, Any], comment_id: str) -> dict[str, Any] | None:
    """The comment of ``card`` with this id, as the card lists it."""
    return next((c for c in comments_of(card) or () if str(c.get("id")) == comment_id), None)


class _Spooler:
    """The file parts that come before the comment's text, each in a spool file until the comment exists: within
    ``spool_bytes`` for the request and the process's budget; every file removed by ``close``."""

    __slots__ = ("run", "files", "spooled")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.files: list[SpoolFile] = []
        self.spooled = 0

    async def take(self, parts: Parts) -> SpoolFile:
        """The current file part, to a spool file."""
        limit = self.run.options.spool_bytes
        if self.spooled >= limit:
            raise _over_spool_bytes(limit)
        try:
            spool = await self.run.up.spool.open()
        except SpoolError as err:
            raise self.unavailable(err, "spool_unavailable") from None
        self.files.append(spool)
        async for data in parts.content():
            self.spooled += len(data)
            if self.spooled > limit:
                raise _over_spool_bytes(limit)
            await self.write(spool, data)
        return spool

    async def write(self, spool: SpoolFile, data: bytes) -> None:
        try:
            await spool.write(data)
        except SpoolFull:
            reply = self.run.error(503, "LEGACY_UPLOAD_UPGRADE_SPOOL_FULL", "the gateway holds as many file parts "
                                   "that come before a comment's text as it may right now (spool.max_bytes); retry "
                                   "shortly")
            reply.headers["Retry-After"] = "5"
            raise Stop(Ending(Outcome.FAILED, reply, "spool_full")) from None
        except SpoolError as err:
            raise self.unavailable(err, "spool_error") from None

    def unavailable(self, err: SpoolError, reason: str) -> Stop:
        exchange = self.run.exchange
        # One line, no traceback: the reason is in the message (a full disk, a file size limit, a missing directory).
        log.error("legacy_upload_guard: %s; tenant %s, request id %s", err, exchange.tenant.name, exchange.request_id)
        reply = self.run.error(503, "LEGACY_UPLOAD_UPGRADE_SPOOL_UNAVAILABLE", "the gateway cannot hold a file part "
                               "that comes before the comment's text right now")
        reply.headers["Retry-After"] = "30"
        return Stop(Ending(Outcome.FAILED, reply, reason))

    def close(self) -> None:
        for spool in self.files:
            spool.close()


def _over_spool_bytes(limit: int) -> Refusal:
    return Refusal("spool_limit", f"a file part comes before the comment's text and the file parts before the text "
                   f"are over spool_bytes ({limit} bytes)", 413)


async def _to_comment(run: Run, source: AsyncIterator[bytes], head: PartHead, entry: FileEntry) -> None:
    ending = await upload(run, source, head, entry)
    if ending is None:
        run.changed = True
        return
    if not run.changed and entry.status in (FileStatus.FAILED, FileStatus.NOT_FOUND):
        # A files-only update whose first upload failed: nothing was done, the service's answer is passed on.
        raise Stop(run.passed_on(ending.reply, "upload", entry.upstream_status))
    ending.reply.discard()
    raise Partial(502, *_not_uploaded(entry))


def _not_uploaded(entry: FileEntry) -> tuple[str, str]:
    """The reason and the message of a partial answer after a file of the comment was not uploaded."""
    answered = entry.upstream_status is not None and entry.status is FileStatus.FAILED
    why = (f"the service answered {entry.upstream_status}" if answered
           else "the service could not be reached or did not answer")
    if entry.status is FileStatus.ROLLED_BACK:
        why += f"; the file it stored anyway (id {entry.id}) was deleted"
    elif entry.status in (FileStatus.ROLLBACK_FAILED, FileStatus.UNKNOWN):
        why += "; the service may have stored it (see its status)"
    return ("upload_status" if answered else "upload_error",
            f"file {entry.index + 1} of the comment was not uploaded ({why})")
