"""Get-board routes, flat and nested under a space, with the cards
withdrawal schedule applied (see sandbox/deprecation.py)."""

from __future__ import annotations

from aiohttp import web

from sandbox.deprecation import CARDS_CAP, CardsPhase, cards_phase, deprecation_message
from sandbox.errors import ApiError
from sandbox.params import base_url
from sandbox.responses import json_response
from sandbox.state import SETTINGS, STORE
from sandbox.store import Board, Card, Store
from sandbox.views import board_json

__all__ = ["board_routes", "readable_board"]


def readable_board(store: Store, board_id: int) -> Board:
    board = store.boards.get(board_id)
    if board is None:
        raise ApiError.not_found()
    if board.private:
        raise ApiError.forbidden()
    return board


def _board_response(request: web.Request, board: Board) -> web.Response:
    store = request.app[STORE]
    settings = request.app[SETTINGS]
    phase = cards_phase(settings)
    cards: list[Card] | None = None  # removed: no cards key at all
    message = deprecation_message(phase, board.id)
    if phase is CardsPhase.FULL:
        cards = store.board_cards(board.id)
    elif phase is CardsPhase.CAPPED:
        every = store.board_cards(board.id)
        cards = every[:CARDS_CAP]  # the first ones, in board order
        if len(every) <= CARDS_CAP:
            message = None  # spec, "Limits" 3: the message comes when cards are excluded
    payload = board_json(store, board, base_url(request), cards=cards, deprecation_message=message)
    return json_response(request, payload, gzip_allowed=settings.gzip_boards)


async def get_board(request: web.Request) -> web.Response:
    board = readable_board(request.app[STORE], int(request.match_info["board_id"]))
    return _board_response(request, board)


async def get_space_board(request: web.Request) -> web.Response:
    store = request.app[STORE]
    space = store.spaces.get(int(request.match_info["space_id"]))
    board_id = int(request.match_info["board_id"])
    if space is None or board_id not in space.board_ids:
        raise ApiError.not_found()
    return _board_response(request, readable_board(store, board_id))


def board_routes(prefix: str) -> list[web.RouteDef]:
    # add_get also answers HEAD with the same headers and no body.
    return [
        web.get(prefix + r"/boards/{board_id:\d{1,18}}", get_board),
        web.get(prefix + r"/spaces/{space_id:\d{1,18}}/boards/{board_id:\d{1,18}}", get_space_board),
    ]
