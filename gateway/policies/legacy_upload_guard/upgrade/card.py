"""The card flow: ``PUT /cards/{card_id}/files`` performed as ``POST /cards/{card_uid}/files``.

The card's uid comes from the card lookup (or the id cache, for these very credentials), before any body byte is read
(and before ``100 Continue``): a client without access gets the service's answer. The body must hold one file part,
named as the legacy route names it (``legacy_field``), and nothing else; it streams to the restricted upload, whose
close delimiter is only sent once the whole body has ended cleanly.
"""

from __future__ import annotations

from ....core.exchange import Reply
from ....core.multipart import Boundary
from .body import Parts
from .outcomes import Refusal
from .run import Run

__all__ = ("card_file",)


async def card_file(run: Run, boundary: Boundary | None) -> Reply:
    exchange = run.exchange
    options = run.options
    run.need_card_id()
    if boundary is None:
        raise Refusal("no_file_part", "the body is not multipart/form-data: it has no file part to upload")
    if not exchange.has_body:
        raise Refusal("no_file_part", "the multipart body is empty")
    card_uid = await run.resolve_card()
    if run.card is not None:
        files = run.card.get("files")
        run.known = {f["id"] for f in files if isinstance(f, dict) and isinstance(f.get("id"), str)} \
            if isinstance(files, list) else None
    path = run.upload_path = run.up.card_upload.render({"card_uid": card_uid}, encode=True)
    parts = run.parts = Parts(exchange.body.take_over(), run.up.hooks.splitter(boundary))
    head = await parts.next_part()
    if head is None:
        raise Refusal("no_file_part", "the multipart body has no file part")
    if not head.is_file:
        raise Refusal("not_a_file_part", f"part {head.index} ({head.name!r}) is not a file part: this route takes "
                      "one file part and nothing else")
    if head.name != options.legacy_field:
        # As the service reads this route: its file is the part named so, and no other.
        raise Refusal("field_name", f"the file part is named {head.name!r}: this route takes its file in a part "
                      f"named {options.legacy_field!r}")
    entry = run.add_file(head)

    async def only_part() -> None:
        later = await parts.next_part()
        if later is not None:
            raise Refusal("several_parts", f"part {later.index} ({later.name!r}) follows the file part: this route "
                          "takes one file part and nothing else")

    failed = await run.upload(parts.content(), head, path, entry, after=only_part)
    if failed is not None:
        if run.outcome is not None:
            return failed  # the answer to an upload whose answer was lost: the run's outcome says what became of it
        raise run.passed_on(failed, "upload", entry.upstream_status)
    assert entry.record is not None
    reply = Reply.json(200, entry.record)
    reply.headers["Cache-Control"] = "no-store"  # it holds a signed link
    return reply
