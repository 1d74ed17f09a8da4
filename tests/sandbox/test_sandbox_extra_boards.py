"""Boards of chosen sizes (``extra_boards``) and the card list paging them."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sandbox.seed import build_store
from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, READONLY, SECRET, ClientFactory

SIZES = (0, 1, 100, 101, 10000)
SEED = SandboxSettings().seed


async def page(
    client: TestClient[Any, Any], board_id: int, limit: int, offset: int, headers: dict[str, str] = AUTH
) -> list[dict[str, Any]]:
    resp = await client.get(f"/api/latest/cards?board_id={board_id}&limit={limit}&offset={offset}", headers=headers)
    assert resp.status == 200, await resp.text()
    value: list[dict[str, Any]] = await resp.json()
    return value


async def read_all(client: TestClient[Any, Any], board_id: int, limit: int) -> tuple[list[dict[str, Any]], list[int]]:
    """Every card by pages until an empty one; also each page's length."""
    cards: list[dict[str, Any]] = []
    lengths: list[int] = []
    while True:
        chunk = await page(client, board_id, limit, len(cards))
        lengths.append(len(chunk))
        if not chunk:
            return cards, lengths
        cards += chunk


async def test_card_list_pages_each_board_exactly(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(signing_secret=SECRET, extra_boards=SIZES))
    next_id = 251
    for board_id, size in zip(range(4, 4 + len(SIZES)), SIZES, strict=True):
        cards, lengths = await read_all(client, board_id, 100)
        full_pages, rest = divmod(size, 100)
        assert lengths == [100] * full_pages + ([rest] if rest else []) + [0]
        assert len(lengths) == math.ceil(size / 100) + 1
        ids = [c["id"] for c in cards]
        assert ids == list(range(next_id, next_id + size))  # in order, no gaps, no repeats
        assert {c["board_id"] for c in cards} <= {board_id}
        board = await (await client.get(f"/api/latest/boards/{board_id}", headers=AUTH)).json()
        assert board["id"] == board_id
        assert board["cards"] == cards
        next_id += size


async def test_odd_page_sizes(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(extra_boards=(101,)))
    cards, lengths = await read_all(client, 4, 37)
    assert lengths == [37, 37, 27, 0]
    assert [c["id"] for c in cards] == list(range(251, 352))


async def test_extra_boards_are_public_and_in_space_1(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(extra_boards=(3, 2)))
    for board_id in (4, 5):
        flat = await client.get(f"/api/latest/boards/{board_id}", headers=READONLY)
        nested = await client.get(f"/api/v1/spaces/1/boards/{board_id}", headers=AUTH)
        assert flat.status == nested.status == 200
        assert await flat.read() == await nested.read()
    assert [c["id"] for c in await page(client, 5, 100, 0, READONLY)] == [254, 255]
    assert (await client.get("/api/latest/boards/6", headers=AUTH)).status == 404
    assert (await client.get("/api/latest/cards?board_id=6", headers=AUTH)).status == 404
    assert (await client.get("/api/latest/cards?board_id=3", headers=AUTH)).status == 403
    assert (await client.get("/api/latest/cards?board_id=4", headers={"Authorization": "Bearer x"})).status == 401
    everything = await (await client.get("/api/latest/cards?limit=100&offset=248", headers=AUTH)).json()
    assert [c["id"] for c in everything] == [249, 250, 251, 252, 253, 254, 255]


async def test_listed_card_matches_get_card(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(extra_boards=(30,)))
    listed = await page(client, 4, 100, 0)
    assert any(not c["title"].isascii() for c in listed)
    for card in (listed[0], listed[2], listed[-1]):
        single = await client.get(f"/api/v1/cards/{card['uid']}", headers=AUTH)
        assert single.status == 200
        assert await single.json() == card


def test_existing_data_and_later_uids_are_unchanged() -> None:
    plain = build_store(SEED)
    extended = build_store(SEED, (3, 10000))
    for board_id in (1, 2, 3):
        assert extended.boards[board_id] == plain.boards[board_id]
        assert extended.board_cards(board_id) == plain.board_cards(board_id)
    assert extended.comments == plain.comments
    assert extended.legacy_files == plain.legacy_files
    assert extended.restricted_files == plain.restricted_files
    assert extended.spaces[1].board_ids == [1, 2, 3, 4, 5]
    # Extra boards draw from their own generator: uids handed out later match.
    assert [extended.new_uid() for _ in range(3)] == [plain.new_uid() for _ in range(3)]


async def test_existing_boards_answer_the_same_bytes(make_client: ClientFactory) -> None:
    base = "http://sandbox.test"
    plain = await make_client(SandboxSettings(public_base_url=base))
    extended = await make_client(SandboxSettings(public_base_url=base, extra_boards=(500,)))
    for path in ("/api/latest/boards/1", "/api/latest/boards/2", "/api/latest/cards?board_id=1&offset=150"):
        a = await plain.get(path, headers=AUTH)
        b = await extended.get(path, headers=AUTH)
        assert await a.read() == await b.read()


def test_extra_boards_are_deterministic_per_seed() -> None:
    def snapshot(seed: int) -> str:
        store = build_store(seed, (50, 7))
        return json.dumps([(c.id, c.uid, c.title, c.column_id, c.lane_id, c.size)
                           for b in (4, 5) for c in store.board_cards(b)], ensure_ascii=False)

    assert snapshot(SEED) == snapshot(SEED)
    assert snapshot(SEED) != snapshot(SEED + 1)
    store = build_store(SEED, (50, 7))
    uids = [c.uid for c in store.cards.values()]
    assert len(uids) == len(set(uids)) == 250 + 57


def test_ten_thousand_cards_build_fast() -> None:
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        store = build_store(SEED, (10000,))
        best = min(best, time.perf_counter() - started)
    assert len(store.board_cards(4)) == 10000
    assert best < 0.5, f"building a 10,000-card board took {best:.3f} s"


def test_negative_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="extra_boards"):
        SandboxSettings(extra_boards=(3, -1))
