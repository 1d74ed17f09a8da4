"""The get-board route: full board with all cards, ETags, HEAD, gzip."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, ClientFactory

BOARD_FIELDS = {
    "id", "uid", "title", "created", "updated", "description", "external_id", "email_key",
    "default_card_type_id", "default_tags", "cell_wip_limits", "move_parents_to_done",
    "first_image_is_cover", "reset_lane_spent_time", "backward_moves_enabled", "hide_done_policies",
    "hide_done_policies_in_done_column", "automove_cards", "auto_assign_enabled", "card_properties",
    "columns", "lanes", "cards",
}
CARD_FIELDS = {"id", "uid", "title", "board_id", "column_id", "lane_id", "sort_order", "created", "updated",
               "size", "files"}
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
BIG = 12345678901234567890123


@pytest.mark.parametrize("path", ["/api/latest/boards/1", "/api/v1/boards/1"])
async def test_seeded_board_has_all_fields_and_250_cards_in_order(client: TestClient[Any, Any], path: str) -> None:
    resp = await client.get(path, headers=AUTH)
    assert resp.status == 200
    board = await resp.json()
    assert set(board) == BOARD_FIELDS
    assert board["id"] == 1 and board["title"] == "Seeded board"
    assert UUID_RE.fullmatch(board["uid"])
    assert len(board["columns"]) == 3 and len(board["lanes"]) == 2
    assert [c["id"] for c in board["cards"]] == list(range(1, 251))
    for card in board["cards"]:
        assert CARD_FIELDS <= set(card)
        assert UUID_RE.fullmatch(card["uid"])
        assert card["column_id"] in {c["id"] for c in board["columns"]}
        assert card["lane_id"] in {lane["id"] for lane in board["lanes"]}
    assert [c["sort_order"] for c in board["cards"]] == sorted(c["sort_order"] for c in board["cards"])
    assert len({c["uid"] for c in board["cards"]}) == 250


async def test_board_body_keeps_big_ints_and_raw_utf8(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/boards/1", headers=AUTH)
    raw = await resp.read()
    assert b'"size":12345678901234567890123' in raw
    assert "Тест ✓ 日本".encode() in raw  # not \u-escaped
    cards = json.loads(raw)["cards"]
    assert sum(1 for c in cards if c["size"] == BIG) >= 2
    assert any(not c["title"].isascii() for c in cards)


async def test_board_headers_and_strong_etag(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/boards/1", headers=AUTH)
    body = await resp.read()
    assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
    assert int(resp.headers["Content-Length"]) == len(body)
    assert resp.headers["ETag"] == '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    assert "Content-Encoding" not in resp.headers


@pytest.mark.parametrize("form", ["{etag}", "W/{etag}", '"other", {etag}', "*"])
async def test_if_none_match_gives_304(client: TestClient[Any, Any], form: str) -> None:
    first = await client.get("/api/latest/boards/1", headers=AUTH)
    etag = first.headers["ETag"]
    resp = await client.get("/api/latest/boards/1", headers={**AUTH, "If-None-Match": form.format(etag=etag)})
    assert resp.status == 304
    assert resp.headers["ETag"] == etag
    assert await resp.read() == b""


async def test_stale_etag_gives_full_body(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/boards/1", headers={**AUTH, "If-None-Match": '"0000"'})
    assert resp.status == 200
    assert len((await resp.json())["cards"]) == 250


async def test_etag_changes_when_the_board_changes(client: TestClient[Any, Any]) -> None:
    before = (await client.get("/api/latest/boards/1", headers=AUTH)).headers["ETag"]
    await client.post("/api/v1/cards/5/comments", json={"text": "new"}, headers=AUTH)
    resp = await client.get("/api/latest/boards/1", headers={**AUTH, "If-None-Match": before})
    assert resp.status == 200
    assert resp.headers["ETag"] != before


async def test_head_matches_get_without_body(client: TestClient[Any, Any]) -> None:
    get = await client.get("/api/latest/boards/1", headers=AUTH)
    get_body = await get.read()
    head = await client.head("/api/latest/boards/1", headers=AUTH)
    assert head.status == 200
    assert head.headers["ETag"] == get.headers["ETag"]
    assert int(head.headers["Content-Length"]) == len(get_body)
    assert head.headers["Content-Type"] == get.headers["Content-Type"]
    assert await head.read() == b""


async def test_empty_board(client: TestClient[Any, Any]) -> None:
    board = await (await client.get("/api/latest/boards/2", headers=AUTH)).json()
    assert board["title"] == "Empty board"
    assert board["cards"] == []
    assert set(board) == BOARD_FIELDS


@pytest.mark.parametrize("prefix", ["/api/v1", "/api/latest"])
@pytest.mark.parametrize("board_id", [1, 2])
async def test_nested_space_route_returns_the_same_board(
    client: TestClient[Any, Any], prefix: str, board_id: int
) -> None:
    flat = await client.get(f"{prefix}/boards/{board_id}", headers=AUTH)
    nested = await client.get(f"{prefix}/spaces/1/boards/{board_id}", headers=AUTH)
    assert nested.status == 200
    assert await nested.read() == await flat.read()


@pytest.mark.parametrize("path", ["/api/latest/spaces/2/boards/1", "/api/latest/spaces/1/boards/4"])
async def test_nested_route_unknown_space_or_board_is_404(client: TestClient[Any, Any], path: str) -> None:
    resp = await client.get(path, headers=AUTH)
    assert resp.status == 404
    assert await resp.read() == b""


async def test_gzip_is_off_by_default(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/api/latest/boards/1", headers={**AUTH, "Accept-Encoding": "gzip"},
                            auto_decompress=False)
    assert "Content-Encoding" not in resp.headers
    assert (await resp.read()).startswith(b"{")


async def test_gzip_boards_when_enabled(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(gzip_boards=True))
    plain = await client.get("/api/latest/boards/1", headers={**AUTH, "Accept-Encoding": "identity"})
    plain_body = await plain.read()
    assert "Content-Encoding" not in plain.headers
    zipped = await client.get("/api/latest/boards/1", headers={**AUTH, "Accept-Encoding": "gzip, br"},
                              auto_decompress=False)
    raw = await zipped.read()
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert zipped.headers["Vary"] == "Accept-Encoding"
    assert int(zipped.headers["Content-Length"]) == len(raw) < len(plain_body)
    assert gzip.decompress(raw) == plain_body
    assert zipped.headers["ETag"] != plain.headers["ETag"]
    again = await client.get("/api/latest/boards/1",
                             headers={**AUTH, "Accept-Encoding": "gzip", "If-None-Match": zipped.headers["ETag"]})
    assert again.status == 304
    refused = await client.get("/api/latest/boards/1", headers={**AUTH, "Accept-Encoding": "gzip;q=0"},
                               auto_decompress=False)
    assert "Content-Encoding" not in refused.headers
    # A named gzip;q=0 wins over "*" (RFC 9110 12.5.3), as the gateway reads it too.
    refused = await client.get("/api/latest/boards/1", headers={**AUTH, "Accept-Encoding": "gzip;q=0, *"},
                               auto_decompress=False)
    assert "Content-Encoding" not in refused.headers
    starred = await client.get("/api/latest/boards/1", headers={**AUTH, "Accept-Encoding": "br, *;q=0.5"},
                               auto_decompress=False)
    assert starred.headers["Content-Encoding"] == "gzip"


async def test_file_urls_follow_forwarded_headers(client: TestClient[Any, Any]) -> None:
    headers = {**AUTH, "X-Forwarded-Proto": "https", "X-Forwarded-Host": "gateway.example:8443"}
    board = await (await client.get("/api/latest/boards/1", headers=headers)).json()
    url = board["cards"][0]["files"][0]["url"]
    assert url == "https://gateway.example:8443/public-files/1/readme.txt"


async def test_public_base_url_setting_wins(make_client: ClientFactory) -> None:
    client = await make_client(SandboxSettings(public_base_url="https://files.example/"))
    card = await (await client.get("/api/v1/cards/1", headers={**AUTH, "X-Forwarded-Host": "x"})).json()
    assert card["files"][0]["url"] == "https://files.example/public-files/1/readme.txt"


async def test_same_seed_gives_same_board(make_client: ClientFactory) -> None:
    a = await make_client(SandboxSettings(seed=7))
    b = await make_client(SandboxSettings(seed=7))
    c = await make_client(SandboxSettings(seed=8))
    body_a = await (await a.get("/api/latest/boards/1", headers=AUTH)).json()
    body_b = await (await b.get("/api/latest/boards/1", headers=AUTH)).json()
    body_c = await (await c.get("/api/latest/boards/1", headers=AUTH)).json()
    # File URLs embed each server's port; everything else must match.
    assert json.dumps(body_a).replace(f":{a.port}/", ":P/") == json.dumps(body_b).replace(f":{b.port}/", ":P/")
    assert body_a["uid"] != body_c["uid"]
