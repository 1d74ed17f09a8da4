"""Restricted access file routes for cards, comments and custom properties.

The card base path is shared with earlier file routes; requests are told
apart by what they carry: a multipart POST is a restricted upload (with the
card's numeric id in the path instead of its uid, an earlier file, as the
service answers the clients that send it so), a JSON POST attaches by URL;
a numeric file id is an earlier file, a UUID a restricted one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, web

from sandbox.bodies import MALFORMED_MULTIPART, is_multipart, open_multipart, receive_file
from sandbox.cards import card_from_path
from sandbox.comments import comment_from_path
from sandbox.errors import ApiError
from sandbox.legacy_files import (
    attach_by_url,
    delete_legacy_file,
    get_legacy_file,
    update_file,
    update_legacy_file,
    upload_legacy_file,
)
from sandbox.params import base_url, query_bool
from sandbox.responses import json_response
from sandbox.signing import default_disposition
from sandbox.state import SETTINGS, STORE
from sandbox.store import Card, Comment, CustomProperty, EntityType, RestrictedFile, utc_now
from sandbox.views import restricted_file_json, signed_url

__all__ = ["file_routes"]

_NO_STORE = {"Cache-Control": "no-store"}


@dataclass(frozen=True, slots=True)
class _Parent:
    kind: EntityType
    card: Card
    comment: Comment | None = None
    prop: CustomProperty | None = None

    def owns(self, record: RestrictedFile) -> bool:
        if record.card_id != self.card.id or record.entity_type != self.kind:
            return False
        if self.comment is not None and record.comment_id != self.comment.id:
            return False
        return self.prop is None or record.property_id == self.prop.id


def _parent(request: web.Request, kind: EntityType) -> _Parent:
    card = card_from_path(request)
    if kind == "comment":
        return _Parent(kind, card, comment=comment_from_path(request, card))
    if kind == "custom_property":
        prop = request.app[STORE].property_by_ref(request.match_info["property_ref"])
        if prop is None:
            raise ApiError.not_found()
        return _Parent(kind, card, prop=prop)
    return _Parent(kind, card)


def _restricted_file(request: web.Request, parent: _Parent) -> RestrictedFile:
    record = request.app[STORE].restricted_files.get(request.match_info["file_ref"].lower())
    if record is None or not parent.owns(record):
        raise ApiError.not_found()
    return record


def _metadata(request: web.Request, record: RestrictedFile, *, download: bool = False) -> dict[str, Any]:
    url = signed_url(
        request.app[SETTINGS],
        base_url(request),
        record,
        default_disposition(record.mime_type, download=download),
    )
    return restricted_file_json(request.app[STORE], record, url)


async def _upload(request: web.Request, parent: _Parent) -> web.Response:
    """Exactly one part, named ``file``; anything else is a 400."""
    store = request.app[STORE]
    reader = open_multipart(request)
    try:
        part = await reader.next()
        if not isinstance(part, BodyPartReader) or part.name != "file":
            raise ApiError.bad_request("Exactly one form field named file is required")
        received = await receive_file(request, part)
        if await reader.next() is not None:
            raise ApiError.bad_request("Exactly one form field named file is required")
    except MALFORMED_MULTIPART as exc:
        raise ApiError.bad_request(f"Malformed multipart body: {exc}") from None
    record = store.add_restricted_file(
        parent.card,
        entity_type=parent.kind,
        name=received.name,
        mime_type=received.mime_type,
        content=received.content,
        comment=parent.comment,
        prop=parent.prop,
        author_id=store.default_author_id,
        when=utc_now(),
    )
    return json_response(request, _metadata(request, record), conditional=False, headers=_NO_STORE)


async def _get(request: web.Request, parent: _Parent) -> web.Response:
    record = _restricted_file(request, parent)
    redirect = query_bool(request, "redirect")
    download = query_bool(request, "download")
    metadata = _metadata(request, record, download=download)
    if redirect:
        return web.Response(status=302, headers={"Location": metadata["url"], **_NO_STORE})
    return json_response(request, metadata, conditional=False, headers=_NO_STORE)


async def _update(request: web.Request, parent: _Parent) -> web.Response:
    record = _restricted_file(request, parent)
    await update_file(request, parent.card, record)
    return json_response(request, _metadata(request, record), conditional=False, headers=_NO_STORE)


async def _delete(request: web.Request, parent: _Parent) -> web.Response:
    record = _restricted_file(request, parent)
    request.app[STORE].delete_file(parent.card, record, utc_now())
    return web.Response(status=204)


# -- card base path: shared with the earlier routes ---------------------------


async def card_files_post(request: web.Request) -> web.Response:
    if is_multipart(request):
        if _is_number(request.match_info["card_ref"]):
            return await upload_legacy_file(request)  # the card's number: the upload is an earlier file
        return await _upload(request, _parent(request, "card"))
    return await attach_by_url(request, card_from_path(request))


def _is_number(ref: str) -> bool:
    return ref.isascii() and ref.isdigit() and len(ref) <= 18


def _legacy_id(request: web.Request) -> int | None:
    ref = request.match_info["file_ref"]
    return int(ref) if _is_number(ref) else None


async def card_file_get(request: web.Request) -> web.Response:
    if (file_id := _legacy_id(request)) is not None:
        return await get_legacy_file(request, card_from_path(request), file_id)
    return await _get(request, _parent(request, "card"))


async def card_file_patch(request: web.Request) -> web.Response:
    if (file_id := _legacy_id(request)) is not None:
        return await update_legacy_file(request, card_from_path(request), file_id)
    return await _update(request, _parent(request, "card"))


async def card_file_delete(request: web.Request) -> web.Response:
    if (file_id := _legacy_id(request)) is not None:
        return await delete_legacy_file(request, card_from_path(request), file_id)
    return await _delete(request, _parent(request, "card"))


# -- comment and custom property base paths: restricted files only ----------


_Operation = Callable[[web.Request, _Parent], Awaitable[web.Response]]


def _scoped(kind: EntityType, operation: _Operation) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return await operation(request, _parent(request, kind))

    handler.__name__ = f"{operation.__name__.strip('_')}_{kind}_file"
    return handler


def file_routes(prefix: str) -> list[web.RouteDef]:
    card_base = prefix + "/cards/{card_ref}/files"
    routes = [
        web.post(card_base, card_files_post),
        web.get(card_base + "/{file_ref}", card_file_get),
        web.patch(card_base + "/{file_ref}", card_file_patch),
        web.delete(card_base + "/{file_ref}", card_file_delete),
    ]
    scoped_bases: list[tuple[EntityType, str]] = [
        ("comment", prefix + "/cards/{card_ref}/comments/{comment_ref}/files"),
        ("custom_property", prefix + "/cards/{card_ref}/custom-properties/{property_ref}/files"),
    ]
    for kind, base in scoped_bases:
        routes += [
            web.post(base, _scoped(kind, _upload)),
            web.get(base + "/{file_ref}", _scoped(kind, _get)),
            web.patch(base + "/{file_ref}", _scoped(kind, _update)),
            web.delete(base + "/{file_ref}", _scoped(kind, _delete)),
        ]
    return routes
