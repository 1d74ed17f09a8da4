"""Card reads: the paginated card list and get-card."""

from __future__ import annotations

from aiohttp import web

from sandbox.boards import readable_board
from sandbox.errors import ApiError
from sandbox.params import MAX_LIMIT, base_url, query_int
from sandbox.responses import json_response
from sandbox.state import STORE
from sandbox.store import Card
from sandbox.views import card_json

__all__ = ["MAX_LIMIT", "card_from_path", "card_routes"]


def card_from_path(request: web.Request) -> Card:
    """The card named by ``{card_ref}``: numeric id or uid, 404 otherwise.
    Cards on a private board answer 403."""
    store = request.app[STORE]
    card = store.card_by_ref(request.match_info["card_ref"])
    if card is None:
        raise ApiError.not_found()
    if store.boards[card.board_id].private:
        raise ApiError.forbidden()
    return card


async def list_cards(request: web.Request) -> web.Response:
    store = request.app[STORE]
    limit = query_int(request, "limit", MAX_LIMIT, minimum=1, maximum=MAX_LIMIT)
    offset = query_int(request, "offset", 0, minimum=0)
    board_id = query_int(request, "board_id", None, minimum=0)
    assert limit is not None and offset is not None
    if board_id is None:
        cards = [c for c in store.all_cards() if not store.boards[c.board_id].private]
    else:
        cards = store.board_cards(readable_board(store, board_id).id)
    base = base_url(request)
    return json_response(request, [card_json(store, c, base) for c in cards[offset : offset + limit]])


async def get_card(request: web.Request) -> web.Response:
    card = card_from_path(request)
    return json_response(request, card_json(request.app[STORE], card, base_url(request)))


def card_routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.get(prefix + "/cards", list_cards),
        web.get(prefix + "/cards/{card_ref}", get_card),
    ]
