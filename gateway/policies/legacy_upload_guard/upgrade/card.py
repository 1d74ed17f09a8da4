"""The card flow: ``PUT /cards/{card_id}/files`` (or ``POST /cards/{card_id}/files`` with the card's number) performed
as ``POST /cards/{card_uid}/files``; and the upload of one file part to a target (``one_file``), which the comment
file flow shares.

The card's uid comes from the card lookup (or the id cache, for these very credentials), before any body byte is read
(and before ``100 Continue``): a client without access gets the service's answer. The body must hold one file part,
named as the legacy route names it (``legacy_field``), and nothing else; it streams to the restricted upload, whose
close delimiter is only sent once the whole body has ended cleanly.
"""

from __future__ import annotations

import functools

from ....core.exchange import Reply
from ....core.multipart import Boundary
from ..multipart_splitter import PartHead
from .body import Parts
from .options import Outcome
from .outcomes import Ending, Refusal
from .run import Run, Target, file_ids
from .upload import upload

__all__ = ("card_file", "multipart", "one_file")


async def card_file(run: Run, boundary: Boundary | None) -> Ending:
    run.need_card_id()
    boundary = multipart(run, boundary)
    card_uid = await run.resolve_card()
    run.target = Target(run.up.card_upload.render({"card_uid": card_uid}, encode=True),
                        None if run.card is None else file_ids(run.card.get("files")))
    return await one_file(run, boundary)


async def one_file(run: Run, boundary: Boundary) -> Ending:
    """The body's one file part, uploaded to ``run.target`` (the client's body from its first byte: what the guard
    peeked at, then the rest); answered as an earlier file's record looks."""
    parts = run.parts = Parts(run.exchange.body.take_over(), run.up.hooks.splitter(boundary))
    head = _the_file_part(run, await parts.next_part())
    entry = run.add_file(head)
    ending = await upload(run, parts.content(), head, entry, after=functools.partial(_only_part, parts))
    if ending is not None:
        return ending
    assert entry.record is not None
    reply = Reply.json(200, entry.record)
    reply.headers["Cache-Control"] = "no-store"  # it holds a signed link
    return Ending(Outcome.UPGRADED, reply)


def multipart(run: Run, boundary: Boundary | None) -> Boundary:
    if boundary is None:
        raise Refusal("no_file_part", "the body is not multipart/form-data: it has no file part to upload")
    if not run.exchange.has_body:
        raise Refusal("no_file_part", "the multipart body is empty")
    return boundary


def _the_file_part(run: Run, head: PartHead | None) -> PartHead:
    if head is None:
        raise Refusal("no_file_part", "the multipart body has no file part")
    if not head.is_file:
        raise Refusal("not_a_file_part", f"part {head.index} ({head.name!r}) is not a file part: this route takes "
                      "one file part and nothing else")
    legacy_field = run.options.legacy_field
    if head.name != legacy_field:
        # As the service reads this route: its file is the part named so, and no other.
        raise Refusal("field_name", f"the file part is named {head.name!r}: this route takes its file in a part "
                      f"named {legacy_field!r}")
    return head


async def _only_part(parts: Parts) -> None:
    """(Before the upload's close delimiter.) The rest of the body holds no other part."""
    later = await parts.next_part()
    if later is not None:
        raise Refusal("several_parts", f"part {later.index} ({later.name!r}) follows the file part: this route "
                      "takes one file part and nothing else")
