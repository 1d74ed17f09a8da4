"""Earlier (numeric id) file routes on cards.

The sandbox models a company with the forbid setting off: the deprecated
PUT upload still works and creates unprotected files with a public link.
"""

from __future__ import annotations

import mimetypes
from typing import Any
from urllib.parse import unquote, urlsplit

from aiohttp import BodyPartReader, web

from sandbox.bodies import MALFORMED_MULTIPART, ReceivedFile, open_multipart, read_json_object, receive_file
from sandbox.cards import card_from_path
from sandbox.errors import ApiError
from sandbox.params import base_url
from sandbox.responses import json_response
from sandbox.state import STORE
from sandbox.store import Card, CardFile, LegacyFile, utc_now
from sandbox.views import legacy_file_json

__all__ = [
    "attach_by_url",
    "delete_legacy_file",
    "get_legacy_file",
    "legacy_file_routes",
    "update_legacy_file",
]


def _legacy_file(request: web.Request, card: Card, file_id: int) -> LegacyFile:
    record = request.app[STORE].legacy_files.get(file_id)
    if record is None or record.card_id != card.id:
        raise ApiError.not_found()
    return record


def _file_json(request: web.Request, record: LegacyFile) -> web.Response:
    return json_response(request, legacy_file_json(request.app[STORE], record, base_url(request)), conditional=False)


async def upload_legacy_file(request: web.Request) -> web.Response:
    """Deprecated PUT /cards/{card_id}/files: one part named ``file``."""
    store = request.app[STORE]
    card = card_from_path(request)
    received: ReceivedFile | None = None
    reader = open_multipart(request)
    try:
        async for part in reader:
            if isinstance(part, BodyPartReader) and part.name == "file" and received is None:
                received = await receive_file(request, part)
            elif part is not None:
                await part.release()
    except MALFORMED_MULTIPART as exc:
        raise ApiError.bad_request(f"Malformed multipart body: {exc}") from None
    if received is None:
        raise ApiError.bad_request("A form field named file is required")
    record = store.add_legacy_file(
        card,
        name=received.name,
        mime_type=received.mime_type,
        content=received.content,
        author_id=store.default_author_id,
        when=utc_now(),
    )
    return _file_json(request, record)


def _optional_str(payload: dict[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ApiError.bad_request(f"{key} must be a non-empty string")
    return value


async def attach_by_url(request: web.Request, card: Card) -> web.Response:
    """POST /cards/{card_id}/files with JSON ``{"url", "name"}``: an earlier-style
    record pointing at an external address; the sandbox holds no content."""
    store = request.app[STORE]
    payload = await read_json_object(request)
    url = _optional_str(payload, "url")
    if url is None:
        raise ApiError.bad_request("url is required")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ApiError.bad_request("url must be an absolute http(s) URL")
    name = _optional_str(payload, "name") or unquote(parts.path.rsplit("/", 1)[-1]) or "file"
    size = payload.get("size", 0)
    file_type = payload.get("type", 1)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ApiError.bad_request("size must be a non-negative integer")
    if not isinstance(file_type, int) or isinstance(file_type, bool) or file_type < 1:
        raise ApiError.bad_request("type must be a positive integer")
    mime_type = mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"
    record = store.add_legacy_file(
        card,
        name=name,
        mime_type=mime_type,
        content=None,
        external_url=url,
        size=size,
        author_id=store.default_author_id,
        when=utc_now(),
        file_type=file_type,
    )
    return _file_json(request, record)


async def get_legacy_file(request: web.Request, card: Card, file_id: int) -> web.Response:
    return _file_json(request, _legacy_file(request, card, file_id))


async def update_legacy_file(request: web.Request, card: Card, file_id: int) -> web.Response:
    """Rename (``name``) and/or mark as cover (``card_cover``): not an upload,
    so it keeps working even where uploads are forbidden."""
    record = _legacy_file(request, card, file_id)
    await update_file(request, card, record)
    return _file_json(request, record)


async def update_file(request: web.Request, card: Card, record: CardFile) -> None:
    """Apply a JSON ``{"name", "card_cover"}`` update (either or both) to a file of either kind."""
    payload = await read_json_object(request)
    name = _optional_str(payload, "name")
    cover = payload.get("card_cover")
    if cover is not None and not isinstance(cover, bool):
        raise ApiError.bad_request("card_cover must be a boolean")
    if name is None and cover is None:
        raise ApiError.bad_request("Nothing to update: send name and/or card_cover")
    store = request.app[STORE]
    when = utc_now()
    if name is not None:
        store.rename_file(card, record, name, when)
    if cover is not None:
        store.set_card_cover(card, record, cover, when)


async def delete_legacy_file(request: web.Request, card: Card, file_id: int) -> web.Response:
    store = request.app[STORE]
    store.delete_file(card, _legacy_file(request, card, file_id), utc_now())
    return web.Response(status=204)


def legacy_file_routes(prefix: str) -> list[web.RouteDef]:
    return [web.put(prefix + "/cards/{card_ref}/files", upload_legacy_file)]
