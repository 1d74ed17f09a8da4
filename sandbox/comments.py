"""Comment routes, including the deprecated uploads through files[] parts.

With the forbid setting off (the sandbox's state), files sent with a comment
become earlier, unprotected files with a public link.
"""

from __future__ import annotations

from aiohttp import BodyPartReader, web

from sandbox.bodies import (
    MALFORMED_MULTIPART,
    ReceivedFile,
    is_multipart,
    open_multipart,
    read_json_object,
    read_text_part,
    receive_file,
)
from sandbox.cards import card_from_path
from sandbox.errors import ApiError
from sandbox.params import base_url
from sandbox.responses import json_response
from sandbox.state import STORE
from sandbox.store import Card, Comment, utc_now
from sandbox.views import comment_json

__all__ = ["FILE_FIELDS", "comment_from_path", "comment_routes"]

FILE_FIELDS = frozenset({"files[]", "files", "file"})


def comment_from_path(request: web.Request, card: Card) -> Comment:
    comment = request.app[STORE].comment_by_ref(card, request.match_info["comment_ref"])
    if comment is None:
        raise ApiError.not_found()
    return comment


async def _comment_input(request: web.Request) -> tuple[str | None, list[ReceivedFile]]:
    """Text and file parts from a multipart body, or text from a JSON body."""
    text: str | None = None
    if not is_multipart(request):
        value = (await read_json_object(request)).get("text")
        if value is not None and not isinstance(value, str):
            raise ApiError.bad_request("text must be a string")
        return value, []
    files: list[ReceivedFile] = []
    reader = open_multipart(request)
    try:
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                raise ApiError.bad_request("Nested multipart parts are not supported")
            if part.name == "text":
                text = await read_text_part(request, part)
            elif part.name in FILE_FIELDS:
                files.append(await receive_file(request, part))
            else:
                await part.release()
    except MALFORMED_MULTIPART as exc:
        raise ApiError.bad_request(f"Malformed multipart body: {exc}") from None
    return text, files


def _attach(request: web.Request, card: Card, comment: Comment, files: list[ReceivedFile]) -> None:
    store = request.app[STORE]
    for received in files:
        store.add_legacy_file(
            card,
            name=received.name,
            mime_type=received.mime_type,
            content=received.content,
            comment=comment,
            author_id=store.default_author_id,
            when=comment.updated,
        )


async def list_comments(request: web.Request) -> web.Response:
    store = request.app[STORE]
    card = card_from_path(request)
    base = base_url(request)
    return json_response(request, [comment_json(store, c, base) for c in store.card_comments(card)])


async def create_comment(request: web.Request) -> web.Response:
    store = request.app[STORE]
    card = card_from_path(request)
    text, files = await _comment_input(request)
    if text is None and not files:
        raise ApiError.bad_request("text is required")
    comment = store.add_comment(card, text or "", store.default_author_id, utc_now())
    _attach(request, card, comment, files)
    return json_response(request, comment_json(store, comment, base_url(request)), conditional=False)


async def update_comment(request: web.Request) -> web.Response:
    store = request.app[STORE]
    card = card_from_path(request)
    comment = comment_from_path(request, card)
    text, files = await _comment_input(request)
    if text is None and not files:
        raise ApiError.bad_request("Nothing to update: send text and/or files[]")
    comment.updated = utc_now()
    if text is not None:
        comment.text = text
    store.touch(card, comment.updated)
    _attach(request, card, comment, files)
    return json_response(request, comment_json(store, comment, base_url(request)), conditional=False)


def comment_routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.get(prefix + "/cards/{card_ref}/comments", list_comments),
        web.post(prefix + "/cards/{card_ref}/comments", create_comment),
        web.patch(prefix + "/cards/{card_ref}/comments/{comment_ref}", update_comment),
    ]
