"""``POST /_sandbox/boards/{id}/cards``: new cards at the start or the end of
a board, so pages shift between two page requests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, ClientFactory


async def insert(client: TestClient[Any, Any], board_id: int, position: str, count: int = 1) -> list[int]:
    resp = await client.post(f"/_sandbox/boards/{board_id}/cards", json={"position": position, "count": count})
    assert resp.status == 201, await resp.text()
    value: list[int] = (await resp.json())["ids"]
    return value


async def page_ids(client: TestClient[Any, Any], board_id: int, limit: int, offset: int) -> list[int]:
    resp = await client.get(f"/api/latest/cards?board_id={board_id}&limit={limit}&offset={offset}", headers=AUTH)
    assert resp.status == 200
    return [c["id"] for c in await resp.json()]


async def board_ids(client: TestClient[Any, Any], board_id: int) -> list[int]:
    board = await (await client.get(f"/api/latest/boards/{board_id}", headers=AUTH)).json()
    return [c["id"] for c in board["cards"]]


async def test_insert_at_end(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/_sandbox/boards/1/cards", json={"position": "end", "count": 2})
    assert resp.status == 201
    assert resp.content_type == "application/json"
    assert await resp.json() == {"board_id": 1, "position": "end", "ids": [251, 252], "card_count": 252}
    assert await page_ids(client, 1, 100, 250) == [251, 252]
    assert (await board_ids(client, 1))[-3:] == [250, 251, 252]


async def test_insert_at_start_and_again_before_that(client: TestClient[Any, Any]) -> None:
    first = await insert(client, 1, "start", 3)
    assert first == [251, 252, 253]
    assert await page_ids(client, 1, 5, 0) == [251, 252, 253, 1, 2]
    second = await insert(client, 1, "start", 2)
    assert await page_ids(client, 1, 6, 0) == [*second, *first, 1]
    assert await board_ids(client, 1) == [*second, *first, *range(1, 251)]


async def test_count_defaults_to_one(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/_sandbox/boards/1/cards", json={"position": "end"})
    assert (await resp.json())["ids"] == [251]


async def test_pages_shift_between_requests(client: TestClient[Any, Any]) -> None:
    first = await page_ids(client, 1, 100, 0)
    assert first == list(range(1, 101))
    await insert(client, 1, "start", 1)
    second = await page_ids(client, 1, 100, 100)
    assert second[0] == first[-1]  # the last card of page one shows up again
    assert second == list(range(100, 200))
    await insert(client, 1, "start", 100)
    assert await page_ids(client, 1, 100, 200) == second  # a whole page later, same cards again


async def test_insert_at_end_does_not_move_earlier_pages(client: TestClient[Any, Any]) -> None:
    before = await page_ids(client, 1, 100, 100)
    await insert(client, 1, "end", 50)
    assert await page_ids(client, 1, 100, 100) == before
    assert await page_ids(client, 1, 100, 200) == [*range(201, 251), *range(251, 301)]


async def test_empty_board_gets_cards_in_order(client: TestClient[Any, Any]) -> None:
    ends = await insert(client, 2, "end", 2)
    start = await insert(client, 2, "start", 1)
    assert await board_ids(client, 2) == [*start, *ends]
    assert await page_ids(client, 2, 100, 0) == [*start, *ends]


async def test_inserted_cards_are_real_cards(make_client: ClientFactory) -> None:
    now = datetime(2026, 10, 15, 12, 0, tzinfo=UTC)
    client = await make_client(SandboxSettings(now=now, extra_boards=(5,)))
    etag = (await client.head("/api/latest/boards/4", headers=AUTH)).headers["ETag"]
    ids = await insert(client, 4, "end", 2)
    assert ids == [256, 257]
    for card_id in ids:
        card = await (await client.get(f"/api/v1/cards/{card_id}", headers=AUTH)).json()
        assert card["board_id"] == 4
        assert card["created"] == card["updated"] == "2026-10-15T12:00:00.000Z"
        by_uid = await client.get(f"/api/v1/cards/{card['uid']}", headers=AUTH)
        assert by_uid.status == 200 and (await by_uid.json())["id"] == card_id
    assert (await client.head("/api/latest/boards/4", headers=AUTH)).headers["ETag"] != etag


async def test_inserted_uids_do_not_depend_on_extra_boards(make_client: ClientFactory) -> None:
    plain = await make_client(SandboxSettings())
    extended = await make_client(SandboxSettings(extra_boards=(40,)))
    uids = []
    for client in (plain, extended):
        (card_id,) = await insert(client, 1, "end")
        uids.append((await (await client.get(f"/api/v1/cards/{card_id}", headers=AUTH)).json())["uid"])
    assert uids[0] == uids[1]


async def test_no_token_needed_and_not_journaled(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/_sandbox/boards/1/cards", json={"position": "end"},
                             headers={"Authorization": "Bearer wrong"})
    assert resp.status == 201
    assert await (await client.get("/_sandbox/journal")).json() == []


async def test_private_board_takes_cards_but_stays_private(client: TestClient[Any, Any]) -> None:
    assert await insert(client, 3, "end", 2) == [251, 252]
    assert (await client.get("/api/latest/cards?board_id=3", headers=AUTH)).status == 403
    assert (await client.get("/api/v1/cards/251", headers=AUTH)).status == 403


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"position": "middle"}',
        b'{"position": 1}',
        b'{"position": "start", "count": 0}',
        b'{"position": "start", "count": -2}',
        b'{"position": "start", "count": "2"}',
        b'{"position": "start", "count": true}',
        b'{"position": "start", "count": 1.5}',
        b'{"position": "start", "count": 100001}',
        b'{"position": "start", "cout": 2}',
    ],
)
async def test_bad_input_is_400_and_changes_nothing(client: TestClient[Any, Any], body: bytes) -> None:
    resp = await client.post("/_sandbox/boards/1/cards", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert resp.content_type == "application/json"
    payload = await resp.json()
    assert set(payload) == {"message"} and payload["message"]
    assert len(await board_ids(client, 1)) == 250


@pytest.mark.parametrize(("path", "has_message"), [("/_sandbox/boards/99/cards", True),
                                                   ("/_sandbox/boards/x/cards", False)])
async def test_unknown_board_is_404(client: TestClient[Any, Any], path: str, has_message: bool) -> None:
    resp = await client.post(path, json={"position": "end"})
    assert resp.status == 404
    assert bool(await resp.read()) is has_message
