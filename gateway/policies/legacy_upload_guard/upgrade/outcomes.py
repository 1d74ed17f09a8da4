"""How a request the upload upgrade took on ends: an ``Ending`` (outcome, answer, reason) that a flow returns, or the
ways a flow stops part way (``Refusal``, ``Partial``, ``Stop``); what became of each file part (``FileEntry``, its
``FileStatus``); the answers; and ``settle``, which turns every ending into one answer, one outcome in
``gateway_legacy_upload_upgrades_total``, one decision and note in the access log, and a warning when something was
left done. The answers are listed in docs/policies/legacy_upload_guard.md ("Upload upgrade bridge")."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import functools
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ....core.exchange import BodyBroken, BodyError, Cut, Reply
from ....core.multipart import Ambiguous
from ....core.spool import SpoolError
from ..multipart_splitter import PartHead
from .options import PARTIAL_CODE, UPGRADE_HEADER, Outcome, sentence, short

if TYPE_CHECKING:
    from .run import Run

__all__ = ("RESTRICTED_FILE_TYPE", "CommentRecord", "Ending", "FileEntry", "FileStatus", "Files", "Partial", "Refusal",
           "Stop", "legacy_file", "settle")

log = logging.getLogger("gateway.legacy_upload_guard")

_CODE_OF_STATUS = {400: "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", 413: "LEGACY_UPLOAD_UPGRADE_TOO_LARGE"}
# The spec's "type" of a restricted access file in a card's files array ("File kinds inside a card's files array").
RESTRICTED_FILE_TYPE = 11
# Outcomes whose answer leaves the service changed in a way the client is told of (a warning says so too).
_LEFT_DONE = (Outcome.PARTIAL, Outcome.ABORTED, Outcome.LEFT_STORED)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a run ends: the outcome counted, the answer, and why (bounded: for the header, the log and the note)."""

    outcome: Outcome
    reply: Reply
    reason: str = ""
    # The guard's own refusal: answered and counted as without the bridge (no header of the bridge's).
    guard_answered: bool = False


class Refusal(Exception):
    """A body the bridge cannot translate (not ambiguous: unsupported, or over a bound)."""

    def __init__(self, rule: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.status = status


class Partial(Exception):
    """The run ends after it changed something (a comment saved, a file uploaded): the answer names what was done,
    built when the run ends (``status``: the answer's; ``reason``: bounded, for the header, the log and the note)."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after  # seconds, for the answer's Retry-After (the service's limits)


class Stop(Exception):
    """The run ends here, from deep in a step, with ``ending``."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.reason)
        self.ending = ending


class FileStatus(enum.StrEnum):
    """What became of one file part (its ``status`` in the partial answer and the note)."""

    UPLOADED = "uploaded"
    FAILED = "failed"
    NOT_SENT = "not_sent"
    ROLLED_BACK = "rolled_back"
    ROLLBACK_FAILED = "rollback_failed"
    # After an answer lost once the whole file went: the parent's file list does not show it, or it could not be
    # told (``candidates``).
    NOT_FOUND = "not_found"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class FileEntry:
    """One file part of the client's body and what became of it."""

    index: int  # among the file parts, 0-based
    field: str
    filename: str | None
    status: FileStatus = FileStatus.NOT_SENT
    id: str | None = None
    path: str | None = None  # the upload route it went to
    upstream_status: int | None = None
    record: dict[str, Any] | None = None  # the service's answer, in the legacy shape
    candidates: list[str] = dataclasses.field(default_factory=list)  # files that may be this one (unknown)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "field": short(self.field), "filename": short(self.filename),
                               "status": self.status.value}
        if self.id is not None:
            out["id"] = self.id
        if self.upstream_status is not None:
            out["upstream_status"] = self.upstream_status
        if self.candidates:
            out["candidates"] = self.candidates
        return out

    @property
    def may_remain(self) -> str | None:
        """What names a file the service may still hold for it (its id, its candidates, "?"), else None."""
        if self.status is FileStatus.UNKNOWN:
            return self.id or "/".join(self.candidates) or "?"
        if self.status is FileStatus.ROLLBACK_FAILED and (self.id or self.candidates):
            return self.id or "/".join(self.candidates)
        return None


class Files:
    """The file parts of a request's body, in order, with what became of each; past ``listed`` only counted."""

    __slots__ = ("entries", "unlisted")

    def __init__(self) -> None:
        self.entries: list[FileEntry] = []
        self.unlisted = 0  # file parts past the most an answer lists

    def add(self, head: PartHead, limit: int) -> FileEntry:
        """The next file part, to be sent: at most ``limit`` of them (``Refusal`` past it)."""
        entry = FileEntry(len(self.entries), head.name, head.filename)
        self.entries.append(entry)
        if len(self.entries) > limit:
            raise Refusal("too_many_files", f"the body has more than {limit} file parts")
        return entry

    def unsent(self, head: PartHead, listed: int) -> None:
        """A file part that will not be sent, listed (counted past ``listed``)."""
        if len(self.entries) < listed:
            self.entries.append(FileEntry(len(self.entries), head.name, head.filename))
        else:
            self.unlisted += 1

    def with_status(self, status: FileStatus) -> list[FileEntry]:
        return [f for f in self.entries if f.status is status]

    def ids(self) -> set[str]:
        return {f.id for f in self.entries if f.id is not None}


@dataclass(slots=True)
class CommentRecord:
    id: Any
    uid: str | None
    answer: dict[str, Any]  # what the service answered for it (the base of the client's answer)
    status: int = 200


def legacy_file(record: Mapping[str, Any], card_id: int, comment_id: Any) -> dict[str, Any]:
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


# --- answers ------------------------------------------------------------------------------------------------------


def refusal_answer(run: Run, err: Refusal) -> Reply:
    return Reply.json(err.status, {
        "code": _CODE_OF_STATUS[err.status],
        "message": f"This legacy upload cannot be upgraded to the restricted access routes: {err.message}.",
        "rule": err.rule, "request_id": run.exchange.ensure_request_id(),
    })


def partial_answer(run: Run, status: int, reason: str, message: str) -> Reply:
    """The answer that names what was created and what was not (bounded: at most ``max_files + 1`` file parts are
    listed, the rest counted in ``files_not_listed``)."""
    comment = run.saved
    files = run.files
    payload: dict[str, Any] = {
        "reason": reason,
        "comment": None if comment is None else {"id": comment.id, "uid": comment.uid},
        "files": [f.report() for f in files.entries],
        # Whether every file part of the body is listed (the body was read to its end).
        "files_complete": run.parts is not None and run.parts.ended and not files.unlisted,
    }
    if files.unlisted:
        payload["files_not_listed"] = files.unlisted
    if run.target is not None:
        payload["replacement"] = f"POST {run.target.path}"
    done = "the comment was saved" if comment is not None else "the request was partly carried out"
    text = sentence(f"{done}, but not every file was uploaded: {message}; the files are listed with what became of "
                    f"each ({', '.join(FileStatus)})")
    return Reply.json(status, {"code": PARTIAL_CODE, "message": text,
                               "request_id": run.exchange.ensure_request_id(), **payload})


def _partial_ending(run: Run, status: int, reason: str, message: str) -> Ending:
    return Ending(Outcome.PARTIAL, partial_answer(run, status, reason, message), reason)


# --- the ways a run stops part way, as endings --------------------------------------------------------------------


@functools.singledispatch
def _ending(err: Exception, run: Run) -> Ending:
    raise err


@_ending.register(Stop)
def _stopped(err: Stop, run: Run) -> Ending:
    return err.ending


@_ending.register(Partial)
def _partly_done(err: Partial, run: Run) -> Ending:
    ending = _partial_ending(run, err.status, err.reason, err.message)
    if err.retry_after is not None:
        ending.reply.headers["Retry-After"] = str(err.retry_after)
    return ending


@_ending.register(Ambiguous)
def _ambiguous(err: Ambiguous, run: Run) -> Ending:
    if run.changed:
        return _partial_ending(run, 400, err.rule, f"the rest of the body cannot be read unambiguously ({err.message})")
    # Refused exactly as without the bridge: counted, decided and answered by the guard.
    return Ending(Outcome.REFUSED, run.up.hooks.refuse(run.exchange, err), err.rule, guard_answered=True)


@_ending.register(Refusal)
def _refused(err: Refusal, run: Run) -> Ending:
    if run.changed:
        return _partial_ending(run, err.status, err.rule, err.message)
    return Ending(Outcome.REFUSED, refusal_answer(run, err), err.rule)


@_ending.register(SpoolError)
def _spool_broken(err: SpoolError, run: Run) -> Ending:
    # A spool file that could not be read back while it was being uploaded to the comment.
    exchange = run.exchange
    log.error("legacy_upload_guard: %s; tenant %s, request id %s", err, exchange.tenant.name, exchange.request_id)
    reply = partial_answer(run, 503, "spool_error", "a file part held on disk could not be read back")
    reply.headers["Retry-After"] = "30"
    return Ending(Outcome.PARTIAL if run.changed else Outcome.FAILED, reply, "spool_error")


def _body_broken(run: Run, broken: BodyBroken) -> Ending:
    """The client's body stopped or broke off (the files uploaded for it are deleted by then)."""
    reason = {BodyError.TIMEOUT: "body_timeout", BodyError.MALFORMED: "malformed_body"}.get(
        run.exchange.body_error or BodyError.ABORTED, "client_gone")
    reply = broken.reply
    if run.changed:
        reply = partial_answer(run, reply.status, reason, "the request body did not arrive whole, so the files "
                               "uploaded for it were deleted")
        reply.close_connection = True
    return Ending(Outcome.ABORTED, reply, reason)


# --- the end of a run ---------------------------------------------------------------------------------------------


async def settle(run: Run, work: Awaitable[Ending]) -> Reply:
    """Runs the route's steps; whatever way they end is answered, counted and logged here, and what they hold
    (a pending read of the client's body) let go."""
    try:
        return finish(run, await _ended(run, work))
    finally:
        if run.parts is not None:
            await run.parts.close()


async def _ended(run: Run, work: Awaitable[Ending]) -> Ending:
    try:
        return await work
    except (Stop, Partial, Ambiguous, Refusal, SpoolError) as err:
        return _ending(err, run)
    except BodyBroken as broken:
        await run.rollback()
        return _body_broken(run, broken)
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels its handler), or the shutdown deadline cut the request: undo what can
        # be undone, and say so in the log.
        await run.rollback()
        record(run, Outcome.ABORTED, "shutdown" if run.exchange.record.cut is Cut.SHUTDOWN else "client_gone")
        raise


def finish(run: Run, ending: Ending) -> Reply:
    outcome, reply, reason = ending.outcome, ending.reply, ending.reason
    record(run, outcome, reason, guard_counted=ending.guard_answered)
    hooks = run.up.hooks
    if not ending.guard_answered:
        # (The guard's own refusals are answered exactly as without the bridge.)
        if outcome is Outcome.UPGRADED:
            uploaded = len(run.files.with_status(FileStatus.UPLOADED))
            reply.headers[UPGRADE_HEADER] = f"upgraded; files={uploaded}"
        else:
            reply.headers[UPGRADE_HEADER] = f"{outcome}; reason={reason}"
        # The upload route this request used (the card's uid filled in), else the guard's own Links. Only once
        # the service took something from this client: a uid from the id cache is no proof that it may see the
        # card, and a refused client is not told the card's uid.
        known = run.target.path if run.target is not None and outcome in _SHOWN_TARGET else None
        hooks.mark(reply, run.exchange, known)
    # An answer may leave part of the client's body unread: answered at once, then a bounded linger.
    reply.linger = hooks.linger
    return reply


_SHOWN_TARGET = (Outcome.UPGRADED, Outcome.PARTIAL)


def record(run: Run, outcome: Outcome, reason: str, *, guard_counted: bool = False) -> None:
    """The counters, the access log's decision and note, and a warning when something was left done."""
    _decide(run, outcome, reason, guard_counted)
    note = _note(run, outcome, reason)
    run.exchange.notes[f"{run.up.hooks.name}.upgrade"] = note
    _warn(run, outcome, note)


def _decide(run: Run, outcome: Outcome, reason: str, guard_counted: bool) -> None:
    exchange = run.exchange
    hooks = run.up.hooks
    run.up.count(exchange, outcome)
    if outcome is not Outcome.REFUSED:
        hooks.count(exchange, "bridged")
        exchange.decisions[hooks.name] = "upgraded" if outcome is Outcome.UPGRADED else f"upgrade_{outcome}"
    elif not guard_counted:
        hooks.count(exchange, "refused")
        exchange.decisions[hooks.name] = "refused"
        exchange.notes[f"{hooks.name}.rule"] = reason


def _note(run: Run, outcome: Outcome, reason: str) -> str:
    words = [outcome.value]
    if reason:
        words.append(f"reason={reason}")
    if run.saved is not None:
        words.append(f"comment={run.saved.uid}")
    words += [f"{status}={n}" for status, n in collections.Counter(f.status for f in run.files.entries).items()]
    if run.files.unlisted:
        words.append(f"not_listed={run.files.unlisted}")
    return " ".join(words)


def _warn(run: Run, outcome: Outcome, note: str) -> None:
    left = [name for f in run.files.entries if (name := f.may_remain) is not None]
    if not ((outcome in _LEFT_DONE and run.changed) or left or run.comment_unknown):
        return
    details = f"; files that may remain: {', '.join(left)}" if left else ""
    if run.comment_unknown:
        details += "; the comment may have been saved (its answer was lost)"
    exchange = run.exchange
    log.warning("legacy_upload_guard: upload upgrade %s%s; tenant %s, card %s, request id %s", note, details,
                exchange.tenant.name, run.card_id, exchange.request_id)
