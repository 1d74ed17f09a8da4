"""Card list pagination and get-card with both kinds of files."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from .sandbox_testlib import AUTH

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


async def ids(client: TestClient[Any, Any], query: str, prefix: str = "/api/latest") -> list[int]:
    resp = await client.get(f"{prefix}/cards?{query}", headers=AUTH)
    assert resp.status == 200, await resp.text()
    return [card["id"] for card in await resp.json()]


@pytest.mark.parametrize("prefix", ["/api/latest", "/api/v1"])
async def test_default_page_is_first_100_cards(client: TestClient[Any, Any], prefix: str) -> None:
    assert await ids(client, "board_id=1", prefix) == list(range(1, 101))


async def test_pages_cover_the_board_in_board_order(client: TestClient[Any, Any]) -> None:
    board = await (await client.get("/api/latest/boards/1", headers=AUTH)).json()
    pages = []
    for offset in range(0, 300, 100):
        pages += await ids(client, f"board_id=1&limit=100&offset={offset}")
    assert pages == [c["id"] for c in board["cards"]]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("board_id=1&limit=10&offset=5", list(range(6, 16))),
        ("board_id=1&limit=100&offset=200", list(range(201, 251))),
        ("board_id=1&offset=250", []),
        ("board_id=1&limit=1&offset=249", [250]),
        ("board_id=2", []),
        ("limit=3&offset=248", [249, 250]),
    ],
)
async def test_limit_and_offset(client: TestClient[Any, Any], query: str, expected: list[int]) -> None:
    assert await ids(client, query) == expected


async def test_missing_board_id_lists_all_visible_cards(client: TestClient[Any, Any]) -> None:
    assert await ids(client, "") == list(range(1, 101))


@pytest.mark.parametrize(
    "query",
    ["limit=101", "limit=0", "limit=-1", "limit=abc", "offset=-1", "offset=1.5", "board_id=x", "limit="],
)
async def test_bad_parameters_are_400_json(client: TestClient[Any, Any], query: str) -> None:
    resp = await client.get(f"/api/latest/cards?{query}", headers=AUTH)
    assert resp.status == 400
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert set(body) == {"message"} and body["message"]


async def test_unknown_board_in_card_list_is_404(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/cards?board_id=99", headers=AUTH)
    assert resp.status == 404
    assert await resp.read() == b""


async def test_card_list_cards_match_get_card(client: TestClient[Any, Any]) -> None:
    listed = (await (await client.get("/api/latest/cards?board_id=1&limit=5", headers=AUTH)).json())[2]
    single = await (await client.get("/api/v1/cards/3", headers=AUTH)).json()
    assert listed == single


async def test_get_card_holds_both_kinds_of_files(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/v1/cards/1", headers=AUTH)
    assert resp.status == 200
    card = await resp.json()
    earlier = [f for f in card["files"] if f["type"] == 1]
    restricted = [f for f in card["files"] if f["type"] == 11]
    assert len(earlier) >= 2 and len(restricted) >= 2
    base = str(client.make_url("/public-files/"))
    for f in earlier:
        assert isinstance(f["id"], int) and not isinstance(f["id"], bool)
        assert "entity_type" not in f
        assert f["url"].startswith(base)
    for f in restricted:
        assert UUID_RE.fullmatch(f["id"])
        assert f["entity_type"] in {"card", "comment", "custom_property"}
        assert f["card_uid"] == card["uid"]
        assert "url" not in f  # no permanent link for restricted files
    assert {f["entity_type"] for f in restricted} == {"card", "comment", "custom_property"}


async def test_get_card_exposes_comment_and_property_uids(client: TestClient[Any, Any]) -> None:
    card = await (await client.get("/api/v1/cards/1", headers=AUTH)).json()
    comment = card["comments"][0]
    prop = card["custom_properties"][0]
    assert isinstance(comment["id"], int) and UUID_RE.fullmatch(comment["uid"])
    assert isinstance(prop["id"], int) and UUID_RE.fullmatch(prop["uid"])
    assert [f["name"] for f in comment["files"]] == ["comment-attachment.txt", "notes.txt"]
    assert [f["name"] for f in prop["files"]] == ["scan.png"]
    comment_file = next(f for f in card["files"] if f.get("entity_type") == "comment")
    assert comment_file["comment_uid"] == comment["uid"]


async def test_get_card_by_uid(client: TestClient[Any, Any]) -> None:
    by_id = await (await client.get("/api/v1/cards/42", headers=AUTH)).json()
    by_uid = await client.get(f"/api/v1/cards/{by_id['uid']}", headers=AUTH)
    assert by_uid.status == 200
    assert await by_uid.json() == by_id


async def test_get_card_has_etag(client: TestClient[Any, Any]) -> None:
    first = await client.get("/api/v1/cards/2", headers=AUTH)
    again = await client.get("/api/v1/cards/2", headers={**AUTH, "If-None-Match": first.headers["ETag"]})
    assert again.status == 304
