"""Test controls beside the journal, under ``/_sandbox/`` (no token, never
journaled): insert cards into a board, register and clear faults."""

from __future__ import annotations

import math
import re
from typing import Any

from aiohttp import web

from sandbox.bodies import read_json_object
from sandbox.errors import ApiError
from sandbox.journal import CONTROL_PREFIX
from sandbox.responses import json_response
from sandbox.state import FAULTS, SETTINGS, STORE

__all__ = ["FAULTS_PATH", "MAX_FAULT_DELAY", "MAX_INSERTED_CARDS", "control_routes"]

FAULTS_PATH = CONTROL_PREFIX + "faults"
MAX_INSERTED_CARDS = 100_000
MAX_FAULT_DELAY = 300.0
MAX_FAULT_TIMES = 1_000_000
_METHOD = re.compile(r"[A-Za-z]{1,20}")
_POSITIONS = {"start": True, "end": False}


def _check_fields(payload: dict[str, Any], required: set[str], optional: set[str]) -> None:
    missing = sorted(required - payload.keys())
    if missing:
        raise ApiError.bad_request(f"Missing field: {', '.join(missing)}")
    unknown = sorted(payload.keys() - required - optional)
    if unknown:
        raise ApiError.bad_request(f"Unknown field: {', '.join(unknown)}")


def _integer(payload: dict[str, Any], name: str, default: int, minimum: int, maximum: int) -> int:
    value = payload.get(name, default)
    # bool is an int in Python, not in JSON.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError.bad_request(f"{name} must be an integer")
    if not minimum <= value <= maximum:
        raise ApiError.bad_request(f"{name} must be between {minimum} and {maximum}")
    return value


async def _insert_cards(request: web.Request) -> web.Response:
    store = request.app[STORE]
    board_id = int(request.match_info["board_id"])
    board = store.boards.get(board_id)
    if board is None:
        raise ApiError(404, f"Unknown board {board_id}", "json")
    payload = await read_json_object(request)
    _check_fields(payload, {"position"}, {"count"})
    position = payload["position"]
    if not isinstance(position, str) or position not in _POSITIONS:
        raise ApiError.bad_request('position must be "start" or "end"')
    count = _integer(payload, "count", 1, 1, MAX_INSERTED_CARDS)
    inserted = store.insert_cards(
        board, at_start=_POSITIONS[position], count=count, when=request.app[SETTINGS].current_time()
    )
    body = {
        "board_id": board.id,
        "position": position,
        "ids": [card.id for card in inserted],
        "card_count": len(store.board_cards(board.id)),
    }
    return json_response(request, body, status=201, conditional=False)


def _query(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ApiError.bad_request("query must be an object of parameter names to values")
    query: dict[str, str] = {}
    for name, item in value.items():
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str):
            raise ApiError.bad_request(f"query value of {name} must be a string")
        query[name] = item
    return query


def _delay(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ApiError.bad_request("delay must be a number of seconds")
    if not 0 <= value <= MAX_FAULT_DELAY:
        raise ApiError.bad_request(f"delay must be between 0 and {MAX_FAULT_DELAY:g} seconds")
    return float(value)


async def _add_fault(request: web.Request) -> web.Response:
    payload = await read_json_object(request)
    _check_fields(payload, {"method", "path"}, {"query", "status", "times", "delay"})
    method, path = payload["method"], payload["path"]
    if not isinstance(method, str) or not _METHOD.fullmatch(method):
        raise ApiError.bad_request("method must be an HTTP method such as GET")
    if not isinstance(path, str) or not path.startswith("/") or "?" in path:
        raise ApiError.bad_request('path must start with "/" and hold no query (use the query field)')
    status: int | None = None
    if payload.get("status") is not None:
        status = _integer(payload, "status", 0, 400, 599)
    delay = _delay(payload.get("delay", 0.0))
    if status is None and delay == 0:
        raise ApiError.bad_request("A fault needs a status, a delay, or both")
    fault = request.app[FAULTS].add(
        method=method.upper(),
        path=path,
        query=_query(payload.get("query", {})),
        status=status,
        delay=delay,
        times=_integer(payload, "times", 1, 1, MAX_FAULT_TIMES),
    )
    return json_response(request, fault.as_json(), status=201, conditional=False)


async def _list_faults(request: web.Request) -> web.Response:
    return json_response(request, [f.as_json() for f in request.app[FAULTS].entries()], conditional=False)


async def _clear_faults(request: web.Request) -> web.Response:
    request.app[FAULTS].clear()
    return web.Response(status=204)


def control_routes() -> list[web.RouteDef]:
    return [
        web.post(CONTROL_PREFIX + r"boards/{board_id:\d{1,18}}/cards", _insert_cards),
        web.get(FAULTS_PATH, _list_faults),
        web.post(FAULTS_PATH, _add_fault),
        web.delete(FAULTS_PATH, _clear_faults),
    ]
