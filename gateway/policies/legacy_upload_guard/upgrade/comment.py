"""The comment flow: ``POST /cards/{card_id}/comments`` and ``PATCH /cards/{card_id}/comments/{comment_id}`` with file
parts, performed as the comment (its text parts, to the same route) and then one restricted upload per file part to
``POST /cards/{card_uid}/comments/{comment_uid}/files``, in the body's order.

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
from .outcomes import CommentRecord, FileEntry, Partial, Refusal, Stop, log
from .run import CARD_ID_RE, ID_RE, Run, made_since, service_time

__all__ = ("comment",)

# Refusals after which the rest of a comment's body is still read to list its file parts.
_LISTABLE = ("too_many_files", "text_after_files")


async def comment(run: Run, boundary: Boundary, source: AsyncIterator[bytes]) -> Reply:
    """``source``: the client's body (what the guard already read, then the rest)."""
    exchange = run.exchange
    run.need_card_id()
    comment_id = exchange.params.get("comment_id")
    if comment_id is not None and not CARD_ID_RE.fullmatch(comment_id):
        raise Refusal("comment_id", "the comment id in the path is not a number")
    card_uid = await run.resolve_card()
    parts = run.parts = Parts(source, run.up.hooks.splitter(boundary))
    try:
        await _parts(run, parts, boundary, card_uid)
    except (Partial, Refusal) as stopped:
        if run.changed and (isinstance(stopped, Partial) or stopped.rule in _LISTABLE):
            await _list_rest(run, parts)
        raise
    assert run.saved is not None
    answer = dict(run.saved.answer)
    kept = answer.get("files")
    answer["files"] = [*(kept if isinstance(kept, list) else ()),
                       *(f.record for f in run.files if f.record is not None)]
    reply = Reply.json(run.saved.status, answer)
    reply.headers["Cache-Control"] = "no-store"  # it holds signed links
    return reply


async def _parts(run: Run, parts: Parts, boundary: Boundary, card_uid: str) -> None:
    options = run.options
    # The text parts as they were written (each with its delimiter line), within max_field_bytes together.
    fields = bytearray()
    text: bytes | None = None
    waiting: list[tuple[PartHead, FileEntry, SpoolFile]] = []
    while (head := await parts.next_part()) is not None:
        if not head.is_file:
            if run.saved is not None:
                raise Refusal("text_after_files", f"part {head.index} ({head.name!r}) is a text part after a file "
                              "part that went to the comment already saved")
            fields += boundary.delimiter + b"\r\n" + head.raw + b"\r\n\r\n"
            start = len(fields)
            async for piece in parts.content():
                fields += piece
                _check_fields(run, fields)
            if head.name == options.text_field:
                text = bytes(fields[start:])
            fields += b"\r\n"
            _check_fields(run, fields)
            continue
        entry = run.add_file(head)
        if run.saved is None and text is not None:
            await _save(run, boundary, fields, text, card_uid)
            await _upload_waiting(run, waiting)
        if run.saved is None:
            waiting.append((head, entry, await _spool(run, parts)))
        else:
            await _to_comment(run, parts.content(), head, entry)
    if run.saved is None:
        await _save(run, boundary, fields, text, card_uid)
        await _upload_waiting(run, waiting)


def _check_fields(run: Run, fields: bytearray) -> None:
    limit = run.options.max_field_bytes
    if len(fields) > limit:
        raise Refusal("fields_too_large", f"the comment's text parts are over {limit} bytes", 413)


async def _list_rest(run: Run, parts: Parts) -> None:
    """After a failure: read on (dropping file contents, within ``rest_bytes``) to list the file parts not sent: at
    most ``max_files + 1`` are listed (the answer stays small), the others counted."""
    if not run.body_usable:
        return
    options = run.options
    limit = parts.bytes_read + options.rest_bytes
    listed = options.max_files + 1
    try:
        async with asyncio.timeout(options.request_timeout):
            while (head := await parts.next_part(limit)) is not None:
                if not head.is_file:
                    continue
                if len(run.files) < listed:
                    run.files.append(FileEntry(len(run.files), head.name, head.filename))
                else:
                    run.unlisted += 1
    except (Ambiguous, BodyBroken, TimeoutError, Refusal):
        pass


async def _save(run: Run, boundary: Boundary, fields: bytearray, text: bytes | None, card_uid: str) -> None:
    """The comment created or updated with the text parts; a files-only update changes nothing and only needs
    the comment's uid."""
    exchange = run.exchange
    options = run.options
    comment_id = exchange.params.get("comment_id")
    if not fields and comment_id is not None:
        run.saved = await _existing(run, comment_id, card_uid)
        return
    if not fields:
        # A comment of files alone: the service needs its text, which is empty.
        fields += (boundary.delimiter + b"\r\nContent-Disposition: form-data; name=\""
                   + options.text_field.encode() + b"\"\r\n\r\n\r\n")
        text = b""
    fields += boundary.delimiter + b"--\r\n"
    body = bytes(fields)
    # Never broken off half way: a client that leaves while the comment is on its way does not cancel it (the
    # service may save it all the same); its answer is waited for and recorded (settle warns, naming the comment).
    started = asyncio.get_running_loop().time()
    saving = asyncio.ensure_future(run.call(exchange.method, exchange.path, query=exchange.query, body=body,
                                            stage="comment", timeout=options.request_timeout,
                                            headers={"Content-Type": exchange.headers.get("Content-Type", "")}))
    try:
        reply, data = await asyncio.shield(saving)
    except asyncio.CancelledError:
        try:
            async with asyncio.timeout(options.request_timeout):
                reply, data = await saving
        except (Stop, Partial, TimeoutError):
            run.comment_unknown = True
        else:
            if data is not None:
                try:
                    _saved(run, reply, data, card_uid)
                except Partial:
                    pass  # saved, without a usable uid: named by its id
        raise
    except Stop as stop:
        if stop.reason.startswith("comment_") and stop.reason.split("_", 1)[1] in ("reset", "timeout", "other"):
            # The comment went, its answer did not: the card's comments say whether it was saved.
            await _look_for_comment(run, text, stop, asyncio.get_running_loop().time() - started)
        raise
    if data is None:
        raise run.passed_on(reply, "comment", reply.status)
    _saved(run, reply, data, card_uid)


def _saved(run: Run, reply: Reply, data: dict[str, Any], card_uid: str) -> None:
    run.changed = True
    uid = data.get("uid")
    if not isinstance(uid, str) or not ID_RE.fullmatch(uid):
        run.saved = CommentRecord(data.get("id"), None, data, reply.status)
        raise Partial(502, "comment_answer", "the service saved the comment but its answer names no usable uid, so "
                      "no file could be uploaded to it")
    run.saved = CommentRecord(data.get("id"), uid, data, reply.status)
    files = data.get("files")
    run.known = {f["id"] for f in files if isinstance(f, dict) and isinstance(f.get("id"), str)} \
        if isinstance(files, list) else None
    run.upload_path = run.up.comment_upload.render({"card_uid": card_uid, "comment_uid": uid}, encode=True)


async def _look_for_comment(run: Run, text: bytes | None, stop: Stop, window: float) -> None:
    """The comment's answer was lost: a comment of this text on the card, that the card lookup made for this request
    did not list (or, without one, that the service created since the comment was sent, by its own clock), is taken
    for it: named in the answer and the log. Otherwise the answer and the log say that it may exist."""
    before = run.card
    wanted = None if text is None else text.decode("utf-8", "replace")
    path = run.up.card_lookup.render({"card_id": run.card_id}, encode=True)
    try:
        reply, card = await run.call("GET", path, stage="lookup", timeout=run.options.lookup_timeout,
                                     purpose="comment_search")
    except (Stop, Partial):
        card = None
    comments = card.get("comments") if card is not None else None
    if not isinstance(comments, list):
        run.comment_unknown = True
        return
    known = {str(c.get("id")) for c in before.get("comments", ()) if isinstance(c, dict)} \
        if before is not None and isinstance(before.get("comments"), list) else None
    now = service_time(reply.headers.get("Date"))
    found = []
    for c in comments:
        if not isinstance(c, dict) or c.get("text") != wanted:
            continue
        if str(c.get("id")) in known if known is not None else not made_since(c, now, window):
            continue
        found.append(c)
    if len(found) != 1:
        run.comment_unknown = True
        return
    run.changed = True
    uid = found[0].get("uid")
    run.saved = CommentRecord(found[0].get("id"), uid if isinstance(uid, str) else None, found[0])
    raise Partial(502, stop.reason, "the service's answer to the comment was lost, and the card's comments show it "
                  "was saved; no file was uploaded to it") from None


async def _existing(run: Run, comment_id: str, card_uid: str) -> CommentRecord:
    """A comment updated with files alone: its uid and record from the card lookup (made for this request, so
    that the answer is the comment as it is now)."""
    card = run.card if run.card is not None else await run.lookup()
    comments = card.get("comments")
    found = next((c for c in comments if isinstance(c, dict) and str(c.get("id")) == str(int(comment_id))),
                 None) if isinstance(comments, list) else None
    if found is None:
        raise Stop("denied", run.error(404, "LEGACY_UPLOAD_UPGRADE_NOT_FOUND", "the comment is not among the card's "
                                       "comments as the service lists them"), "comment_not_found")
    uid = found.get("uid")
    if not isinstance(uid, str) or not ID_RE.fullmatch(uid):
        raise run.bad_answer("lookup", "the card lookup's answer has no usable uid for the comment")
    files = found.get("files")
    run.known = {f["id"] for f in files if isinstance(f, dict) and isinstance(f.get("id"), str)} \
        if isinstance(files, list) else None
    run.upload_path = run.up.comment_upload.render({"card_uid": card_uid, "comment_uid": uid}, encode=True)
    return CommentRecord(found.get("id"), uid, found)


async def _spool(run: Run, parts: Parts) -> SpoolFile:
    """The current file part to a spool file, within ``spool_bytes`` for the request and the process's budget."""
    limit = run.options.spool_bytes
    over = Refusal("spool_limit", f"a file part comes before the comment's text and the file parts before the text "
                   f"are over spool_bytes ({limit} bytes)", 413)
    if run.spooled >= limit:
        raise over
    try:
        spool = await run.up.spool.open()
    except SpoolError as err:
        raise _unavailable(run, err, "spool_unavailable") from None
    run.spools.append(spool)
    async for data in parts.content():
        run.spooled += len(data)
        if run.spooled > limit:
            raise over
        try:
            await spool.write(data)
        except SpoolFull:
            reply = run.error(503, "LEGACY_UPLOAD_UPGRADE_SPOOL_FULL", "the gateway holds as many file parts that "
                              "come before a comment's text as it may right now (spool.max_bytes); retry shortly")
            reply.headers["Retry-After"] = "5"
            raise Stop("failed", reply, "spool_full") from None
        except SpoolError as err:
            raise _unavailable(run, err, "spool_error") from None
    return spool


def _unavailable(run: Run, err: SpoolError, reason: str) -> Stop:
    exchange = run.exchange
    # One line, no traceback: the reason is in the message (a full disk, a file size limit, a missing directory).
    log.error("legacy_upload_guard: %s; tenant %s, request id %s", err, exchange.tenant.name, exchange.request_id)
    reply = run.error(503, "LEGACY_UPLOAD_UPGRADE_SPOOL_UNAVAILABLE", "the gateway cannot hold a file part that comes "
                      "before the comment's text right now")
    reply.headers["Retry-After"] = "30"
    return Stop("failed", reply, reason)


async def _upload_waiting(run: Run, waiting: list[tuple[PartHead, FileEntry, SpoolFile]]) -> None:
    for head, entry, spool in waiting:
        await _to_comment(run, spool.chunks(), head, entry)
        spool.close()
    waiting.clear()


async def _to_comment(run: Run, source: AsyncIterator[bytes], head: PartHead, entry: FileEntry) -> None:
    assert run.upload_path is not None
    failed = await run.upload(source, head, run.upload_path, entry)
    if failed is None:
        run.changed = True
        return
    if not run.changed and entry.status in ("failed", "not_found"):
        # A files-only update whose first upload failed: nothing was done, the service's answer is passed on.
        run.outcome = None
        raise run.passed_on(failed, "upload", entry.upstream_status)
    failed.discard()
    run.outcome = None
    reason = "upload_status" if entry.upstream_status is not None and entry.status == "failed" else "upload_error"
    why = (f"the service answered {entry.upstream_status}" if reason == "upload_status"
           else "the service could not be reached or did not answer")
    if entry.status == "rolled_back":
        why += f"; the file it stored anyway (id {entry.id}) was deleted"
    elif entry.status in ("rollback_failed", "unknown"):
        why += "; the service may have stored it (see its status)"
    raise Partial(502, reason, f"file {entry.index + 1} of the comment was not uploaded ({why})")
