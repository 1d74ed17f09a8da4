"""JSON shapes of the entities, as the service returns them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

from sandbox.settings import SandboxSettings
from sandbox.signing import Disposition, signed_path
from sandbox.store import Board, Card, CardFile, Comment, CustomProperty, LegacyFile, RestrictedFile, Store

__all__ = [
    "PUBLIC_FILES_PATH",
    "board_json",
    "card_json",
    "comment_json",
    "file_in_card_json",
    "iso",
    "legacy_file_json",
    "restricted_file_json",
    "signed_url",
]

PUBLIC_FILES_PATH = "/public-files"
RESTRICTED_FILE_TYPE = 11


def iso(moment: datetime) -> str:
    """ISO 8601, UTC, millisecond precision: 2026-11-21T10:00:00.000Z."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def signed_url(settings: SandboxSettings, base: str, record: RestrictedFile, disposition: Disposition) -> str:
    expires = int(time.time()) + settings.signed_link_ttl
    return base + signed_path(settings.signing_secret, record.id, expires=expires, disposition=disposition)


def legacy_file_json(store: Store, record: LegacyFile, base: str) -> dict[str, Any]:
    if record.external_url is not None:
        url = record.external_url
    else:
        url = f"{base}{PUBLIC_FILES_PATH}/{record.id}/{quote(record.name, safe='')}"
    return {
        "id": record.id,
        "uid": record.uid,
        "type": record.type,
        "name": record.name,
        "url": url,
        "size": record.size,
        "mime_type": record.mime_type,
        "card_id": record.card_id,
        "comment_id": record.comment_id,
        "author_id": record.author_id,
        "card_cover": record.card_cover,
        "deleted": False,
        "created": iso(record.created),
        "updated": iso(record.updated),
    }


def _restricted_common(store: Store, record: RestrictedFile) -> dict[str, Any]:
    card = store.cards[record.card_id]
    return {
        "id": record.id,
        "name": record.name,
        "size": str(record.content.size),
        "mime_type": record.mime_type,
        "entity_type": record.entity_type,
        "created": iso(record.created),
        "updated": iso(record.updated),
        "card_uid": card.uid,
        "author_uid": store.user(record.author_id).uid,
        "card_cover": record.card_cover,
    }


def restricted_file_json(store: Store, record: RestrictedFile, url: str) -> dict[str, Any]:
    """The get-file shape: exactly the spec's card-file fields."""
    return {**_restricted_common(store, record), "url": url}


def file_in_card_json(store: Store, record: CardFile, base: str) -> dict[str, Any]:
    """An entry of a card's files array. Restricted files carry no url here:
    a signed link is only issued by the get-file route."""
    if isinstance(record, LegacyFile):
        return legacy_file_json(store, record, base)
    comment = None if record.comment_id is None else store.comments[record.comment_id]
    prop = None if record.property_id is None else store.properties[record.property_id]
    return {
        **_restricted_common(store, record),
        "type": RESTRICTED_FILE_TYPE,
        "comment_uid": None if comment is None else comment.uid,
        "property_uid": None if prop is None else prop.uid,
    }


def comment_json(store: Store, comment: Comment, base: str) -> dict[str, Any]:
    card = store.cards[comment.card_id]
    author = store.user(comment.author_id)
    return {
        "id": comment.id,
        "uid": comment.uid,
        "text": comment.text,
        "type": 1,
        "card_id": card.id,
        "card_uid": card.uid,
        "author_id": author.id,
        "author_uid": author.uid,
        "created": iso(comment.created),
        "updated": iso(comment.updated),
        "files": [file_in_card_json(store, f, base) for f in store.comment_files(comment)],
    }


def _property_json(store: Store, card: Card, prop: CustomProperty, base: str) -> dict[str, Any]:
    return {
        "id": prop.id,
        "uid": prop.uid,
        "name": prop.name,
        "type": prop.type,
        "files": [file_in_card_json(store, f, base) for f in store.property_files(card, prop)],
    }


def card_json(store: Store, card: Card, base: str) -> dict[str, Any]:
    board = store.boards[card.board_id]
    column = next(c for c in board.columns if c.id == card.column_id)
    owner = store.user(card.owner_id)
    return {
        "id": card.id,
        "uid": card.uid,
        "title": card.title,
        "description": card.description,
        "board_id": card.board_id,
        "column_id": card.column_id,
        "lane_id": card.lane_id,
        "sort_order": card.sort_order,
        "state": column.type,
        "size": card.size,
        "owner_id": owner.id,
        "owner_uid": owner.uid,
        "created": iso(card.created),
        "updated": iso(card.updated),
        "files": [file_in_card_json(store, f, base) for f in store.card_files(card)],
        "comments": [comment_json(store, c, base) for c in store.card_comments(card)],
        "custom_properties": [
            _property_json(store, card, store.properties[pid], base) for pid in board.card_property_ids
        ],
    }


def board_json(
    store: Store,
    board: Board,
    base: str,
    *,
    cards: Sequence[Card] | None,
    deprecation_message: str | None = None,
) -> dict[str, Any]:
    """Every field of the spec's Board table. ``cards`` are the cards to
    include (``None``: no ``cards`` key, as after the withdrawal);
    ``cards_deprecation_message``, when given, comes last."""
    payload: dict[str, Any] = {
        "id": board.id,
        "uid": board.uid,
        "title": board.title,
        "created": iso(board.created),
        "updated": iso(board.updated),
        "description": board.description,
        "external_id": board.external_id,
        "email_key": board.email_key,
        "default_card_type_id": board.default_card_type_id,
        "default_tags": board.default_tags,
        "cell_wip_limits": board.cell_wip_limits,
        "move_parents_to_done": board.move_parents_to_done,
        "first_image_is_cover": board.first_image_is_cover,
        "reset_lane_spent_time": board.reset_lane_spent_time,
        "backward_moves_enabled": board.backward_moves_enabled,
        "hide_done_policies": board.hide_done_policies,
        "hide_done_policies_in_done_column": board.hide_done_policies_in_done_column,
        "automove_cards": board.automove_cards,
        "auto_assign_enabled": board.auto_assign_enabled,
        "card_properties": [
            {
                "id": prop.id,
                "uid": prop.uid,
                "name": prop.name,
                "type": prop.type,
                "required": False,
            }
            for prop in (store.properties[pid] for pid in board.card_property_ids)
        ] or None,
        "columns": [
            {
                "id": c.id,
                "uid": c.uid,
                "board_id": c.board_id,
                "title": c.title,
                "sort_order": c.sort_order,
                "type": c.type,
                "wip_limit": c.wip_limit,
            }
            for c in board.columns
        ],
        "lanes": [
            {"id": lane.id, "uid": lane.uid, "board_id": lane.board_id, "title": lane.title,
             "sort_order": lane.sort_order}
            for lane in board.lanes
        ],
    }
    if cards is not None:
        payload["cards"] = [card_json(store, card, base) for card in cards]
    if deprecation_message is not None:
        payload["cards_deprecation_message"] = deprecation_message
    return payload
