"""How a request the upload upgrade took on ends: the ways a flow stops (``Refusal``, ``Partial``, ``Stop``), what
became of each file part (``FileEntry``), the answers, and ``settle``, which turns every ending into one answer, one
outcome in ``gateway_legacy_upload_upgrades_total``, one decision and note in the access log, and a warning when
something was left done. The answers are listed in docs/policies/legacy_upload_guard.md ("Upload upgrade bridge")."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Mapping
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ....core.exchange import BodyBroken, BodyError, Cut, Reply
from ....core.multipart import Ambiguous
from ....core.spool import SpoolError
from .options import PARTIAL_CODE, UPGRADE_HEADER, sentence, short

if TYPE_CHECKING:
    from .run import Run

__all__ = ("RESTRICTED_FILE_TYPE", "CommentRecord", "FileEntry", "Partial", "Refusal", "Stop", "legacy_file", "settle")

log = logging.getLogger("gateway.legacy_upload_guard")

_CODE_OF_STATUS = {400: "LEGACY_UPLOAD_UPGRADE_UNSUPPORTED", 413: "LEGACY_UPLOAD_UPGRADE_TOO_LARGE"}
# The spec's "type" of a restricted access file in a card's files array ("File kinds inside a card's files array").
RESTRICTED_FILE_TYPE = 11
# Outcomes whose answer leaves the service changed in a way the client is told of (a warning says so too).
_LEFT_DONE = ("partial", "aborted", "left_stored")


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

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class Stop(Exception):
    """The run ends with this answer."""

    def __init__(self, outcome: str, reply: Reply, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reply = reply
        self.reason = reason


@dataclass(slots=True)
class FileEntry:
    """One file part of the client's body and what became of it."""

    index: int  # among the file parts, 0-based
    field: str
    filename: str | None
    # not_sent | uploaded | failed | rolled_back | rollback_failed, and after an answer lost once the whole file went:
    # not_found (the parent's file list does not show it) or unknown (it could not be told; ``candidates``)
    status: str = "not_sent"
    id: str | None = None
    path: str | None = None  # the upload route it went to
    upstream_status: int | None = None
    record: dict[str, Any] | None = None  # the service's answer, in the legacy shape
    candidates: list[str] = dataclasses.field(default_factory=list)  # files that may be this one (unknown)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "field": short(self.field), "filename": short(self.filename),
                               "status": self.status}
        if self.id is not None:
            out["id"] = self.id
        if self.upstream_status is not None:
            out["upstream_status"] = self.upstream_status
        if self.candidates:
            out["candidates"] = self.candidates
        return out


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
    payload: dict[str, Any] = {
        "reason": reason,
        "comment": None if comment is None else {"id": comment.id, "uid": comment.uid},
        "files": [f.report() for f in run.files],
        # Whether every file part of the body is listed (the body was read to its end).
        "files_complete": run.parts is not None and run.parts.ended and not run.unlisted,
    }
    if run.unlisted:
        payload["files_not_listed"] = run.unlisted
    if run.upload_path is not None:
        payload["replacement"] = f"POST {run.upload_path}"
    done = "the comment was saved" if comment is not None else "the request was partly carried out"
    text = sentence(f"{done}, but not every file was uploaded: {message}; the files are listed with what became of "
                    "each (uploaded, failed, not_sent, rolled_back, rollback_failed, not_found, unknown)")
    return Reply.json(status, {"code": PARTIAL_CODE, "message": text,
                               "request_id": run.exchange.ensure_request_id(), **payload})


# --- the end of a run ---------------------------------------------------------------------------------------------


async def settle(run: Run, work: Awaitable[Reply]) -> Reply:
    """Runs the route's steps; whatever way they end is answered, counted and logged here, and what they hold
    (spool files, a pending read of the client's body) let go."""
    exchange = run.exchange
    try:
        reply = await work
    except Stop as stop:
        return finish(run, stop.outcome, stop.reply, stop.reason)
    except Partial as partial:
        return finish(run, "partial", partial_answer(run, partial.status, partial.reason, partial.message),
                      partial.reason)
    except Ambiguous as err:
        if run.changed:
            return finish(run, "partial", partial_answer(run, 400, err.rule, f"the rest of the body cannot be read "
                                                                            f"unambiguously ({err.message})"), err.rule)
        # Refused exactly as without the bridge: counted, decided and answered by the guard.
        return finish(run, "refused", run.up.hooks.refuse(exchange, err), err.rule, guard_counted=True)
    except Refusal as err:
        if run.changed:
            return finish(run, "partial", partial_answer(run, err.status, err.rule, err.message), err.rule)
        return finish(run, "refused", refusal_answer(run, err), err.rule)
    except SpoolError as err:
        # A spool file that could not be read back while it was being uploaded to the comment.
        log.error("legacy_upload_guard: %s; tenant %s, request id %s", err, exchange.tenant.name,
                  exchange.request_id)
        reply = partial_answer(run, 503, "spool_error", "a file part held on disk could not be read back")
        reply.headers["Retry-After"] = "30"
        return finish(run, "partial" if run.changed else "failed", reply, "spool_error")
    except BodyBroken as broken:
        reason = {BodyError.TIMEOUT: "body_timeout", BodyError.MALFORMED: "malformed_body"}.get(
            exchange.body_error or BodyError.ABORTED, "client_gone")
        await run.rollback()
        reply = broken.reply
        if run.changed:
            reply = partial_answer(run, reply.status, reason, "the request body did not arrive whole, so the files "
                                   "uploaded for it were deleted")
            reply.close_connection = True
        return finish(run, "aborted", reply, reason)
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels its handler), or the shutdown deadline cut the request: undo what can
        # be undone, and say so in the log.
        await run.rollback()
        record(run, "aborted", "shutdown" if exchange.record.cut is Cut.SHUTDOWN else "client_gone")
        raise
    else:
        return finish(run, run.outcome or "upgraded", reply, run.reason)
    finally:
        for spool in run.spools:
            spool.close()
        if run.parts is not None:
            await run.parts.close()


def finish(run: Run, outcome: str, reply: Reply, reason: str, *, guard_counted: bool = False) -> Reply:
    record(run, outcome, reason, guard_counted=guard_counted)
    hooks = run.up.hooks
    if not guard_counted:
        # (The guard's own refusals are answered exactly as without the bridge.)
        if outcome == "upgraded":
            reply.headers[UPGRADE_HEADER] = f"upgraded; files={sum(f.status == 'uploaded' for f in run.files)}"
        else:
            reply.headers[UPGRADE_HEADER] = f"{outcome}; reason={reason}"
        # The upload route this request used (the card's uid filled in), else the guard's own Links. Only once
        # the service took something from this client: a uid from the id cache is no proof that it may see the
        # card, and a refused client is not told the card's uid.
        known = run.upload_path if outcome in ("upgraded", "partial") else None
        hooks.mark(reply, run.exchange, known)
    # An answer may leave part of the client's body unread: answered at once, then a bounded linger.
    reply.linger = hooks.linger
    return reply


def record(run: Run, outcome: str, reason: str, *, guard_counted: bool = False) -> None:
    """The counters, the access log's decision and note, and a warning when something was left done."""
    exchange = run.exchange
    hooks = run.up.hooks
    run.up.count(exchange, outcome)
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
    if run.saved is not None:
        words.append(f"comment={run.saved.uid}")
    words += [f"{status}={n}" for status, n in collections.Counter(f.status for f in run.files).items()]
    if run.unlisted:
        words.append(f"not_listed={run.unlisted}")
    note = " ".join(words)
    exchange.notes[f"{hooks.name}.upgrade"] = note
    left = [f.id or "/".join(f.candidates) or "?" for f in run.files
            if f.status in ("rollback_failed", "unknown") and (f.id or f.candidates or f.status == "unknown")]
    if (outcome in _LEFT_DONE and run.changed) or left or run.comment_unknown:
        details = f"; files that may remain: {', '.join(left)}" if left else ""
        if run.comment_unknown:
            details += "; the comment may have been saved (its answer was lost)"
        log.warning("legacy_upload_guard: upload upgrade %s%s; tenant %s, card %s, request id %s", note, details,
                    exchange.tenant.name, run.card_id, exchange.request_id)
