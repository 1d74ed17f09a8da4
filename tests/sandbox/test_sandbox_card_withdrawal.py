"""The board route on the service's schedule: every card, then at most 100
plus ``cards_deprecation_message``, then no ``cards`` key at all."""

from __future__ import annotations

import gzip
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sandbox.deprecation import CardsPhase, cards_phase
from sandbox.settings import SandboxSettings

from .sandbox_testlib import AUTH, SECRET, ClientFactory

CAP = datetime(2026, 10, 1, tzinfo=UTC)
REMOVAL = datetime(2026, 11, 1, tzinfo=UTC)
TICK = timedelta(microseconds=1)
MESSAGE = "cards_deprecation_message"
BOARD_PATHS = ["/api/latest/boards/1", "/api/v1/boards/1", "/api/latest/spaces/1/boards/1",
               "/api/v1/spaces/1/boards/1"]
REQUEST_IN_MESSAGE = re.compile(r"GET (/api/latest/cards\?\S+)")


def scheduled(now: datetime | None, **extra: object) -> SandboxSettings:
    return SandboxSettings(signing_secret=SECRET, cards_cap_from=CAP, cards_removal_from=REMOVAL, now=now,
                           **extra)  # type: ignore[arg-type]


async def get_board(
    client: TestClient[Any, Any], path: str = "/api/latest/boards/1", headers: dict[str, str] | None = None
) -> dict[str, Any]:
    resp = await client.get(path, headers=headers or AUTH)
    assert resp.status == 200, await resp.text()
    value: dict[str, Any] = await resp.json()
    return value


async def card_ids(client: TestClient[Any, Any], query: str) -> list[int]:
    resp = await client.get(f"/api/latest/cards?{query}", headers=AUTH)
    assert resp.status == 200, await resp.text()
    return [c["id"] for c in await resp.json()]


def without_cards(board: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in board.items() if k not in ("cards", MESSAGE)}


@pytest.mark.parametrize("path", BOARD_PATHS)
@pytest.mark.parametrize(
    ("now", "phase"),
    [
        (CAP - TICK, "full"),
        (CAP, "capped"),
        (CAP + timedelta(days=15), "capped"),
        (REMOVAL - TICK, "capped"),
        (REMOVAL, "removed"),
        (REMOVAL + timedelta(days=365), "removed"),
    ],
    ids=["before-cap", "at-cap", "after-cap", "before-removal", "at-removal", "after-removal"],
)
async def test_board_follows_the_schedule(make_client: ClientFactory, path: str, now: datetime, phase: str) -> None:
    # A fixed base URL: file URLs would otherwise differ by server port.
    base = "http://sandbox.test"
    reference = await get_board(await make_client(SandboxSettings(signing_secret=SECRET, public_base_url=base)), path)
    full_keys = list(reference)
    assert full_keys[-1] == "cards" and len(reference["cards"]) == 250
    board = await get_board(await make_client(scheduled(now, public_base_url=base)), path)
    assert without_cards(board) == without_cards(reference)
    if phase == "full":
        assert list(board) == full_keys
        assert [c["id"] for c in board["cards"]] == list(range(1, 251))
        return
    message = board[MESSAGE]
    assert isinstance(message, str)
    assert "GET /api/latest/cards?board_id=1&limit=100&offset=0" in message
    if phase == "capped":
        assert list(board) == [*full_keys, MESSAGE]
        assert [c["id"] for c in board["cards"]] == list(range(1, 101))
        assert board["cards"] == reference["cards"][:100]
        assert "100" in message
    else:
        assert "cards" not in board
        assert list(board) == [k for k in full_keys if k != "cards"] + [MESSAGE]


@pytest.mark.parametrize("now", [CAP, REMOVAL])
async def test_message_names_the_board_and_its_request_works(make_client: ClientFactory, now: datetime) -> None:
    client = await make_client(scheduled(now, extra_boards=(150,)))
    for board_id, expected in [(1, list(range(1, 101))), (2, []), (4, list(range(251, 351)))]:
        board = await get_board(client, f"/api/latest/boards/{board_id}")
        if now == CAP and board_id == 2:
            assert MESSAGE not in board  # nothing excluded from an empty board
            continue
        match = REQUEST_IN_MESSAGE.search(board[MESSAGE])
        assert match, board[MESSAGE]
        resp = await client.get(match.group(1), headers=AUTH)
        assert resp.status == 200
        assert [c["id"] for c in await resp.json()] == expected
        assert f"board_id={board_id}&" in match.group(1)


async def test_cap_keeps_the_first_cards_in_board_order_not_the_lowest_ids(make_client: ClientFactory) -> None:
    client = await make_client(scheduled(CAP))
    resp = await client.post("/_sandbox/boards/1/cards", json={"position": "start", "count": 5})
    assert resp.status == 201
    inserted = (await resp.json())["ids"]
    assert inserted == [251, 252, 253, 254, 255]
    board = await get_board(client)
    assert [c["id"] for c in board["cards"]] == inserted + list(range(1, 96))
    first_page = await (await client.get("/api/latest/cards?board_id=1&limit=100&offset=0", headers=AUTH)).json()
    assert board["cards"] == first_page


@pytest.mark.parametrize(("size", "kept"), [(0, 0), (1, 1), (99, 99), (100, 100), (101, 100), (250, 100)])
async def test_cap_on_boards_of_several_sizes(make_client: ClientFactory, size: int, kept: int) -> None:
    client = await make_client(scheduled(CAP, extra_boards=(size,)))
    board = await get_board(client, "/api/latest/boards/4")
    assert len(board["cards"]) == kept
    assert [c["id"] for c in board["cards"]] == list(range(251, 251 + kept))
    # Spec, "Limits" 3: the message comes when cards are excluded, so only on boards over the cap.
    if size > 100:
        assert list(board)[-2:] == ["cards", MESSAGE]
    else:
        assert MESSAGE not in board and list(board)[-1] == "cards"


async def test_removal_leaves_empty_and_private_boards_alone(make_client: ClientFactory) -> None:
    client = await make_client(scheduled(REMOVAL))
    empty = await get_board(client, "/api/latest/boards/2")
    assert "cards" not in empty and "board_id=2" in empty[MESSAGE]
    for path in ["/api/latest/boards/3", "/api/latest/spaces/1/boards/3", "/api/latest/boards/99"]:
        resp = await client.get(path, headers=AUTH)
        assert resp.status in (403, 404)
        assert await resp.read() == b""
    resp = await client.get("/api/latest/boards/1", headers={"Authorization": "Bearer nope"})
    assert resp.status == 401 and await resp.text() == "Invalid token"


@pytest.mark.parametrize("now", [CAP - TICK, CAP, REMOVAL])
async def test_head_matches_get_in_each_phase(make_client: ClientFactory, now: datetime) -> None:
    client = await make_client(scheduled(now))
    for path in ["/api/latest/boards/1", "/api/v1/spaces/1/boards/1"]:
        get = await client.get(path, headers=AUTH)
        body = await get.read()
        head = await client.head(path, headers=AUTH)
        assert head.status == 200
        assert head.headers["ETag"] == get.headers["ETag"]
        assert int(head.headers["Content-Length"]) == len(body)
        assert await head.read() == b""


async def test_each_phase_has_its_own_etag(make_client: ClientFactory) -> None:
    tags = []
    for now in (CAP - TICK, CAP, REMOVAL):
        client = await make_client(scheduled(now))
        tags.append((await client.head("/api/latest/boards/1", headers=AUTH)).headers["ETag"])
    assert len(set(tags)) == 3


@pytest.mark.parametrize(("now", "has_cards"), [(CAP, True), (REMOVAL, False)])
async def test_gzip_path_carries_the_same_withdrawal(
    make_client: ClientFactory, now: datetime, has_cards: bool
) -> None:
    client = await make_client(scheduled(now, gzip_boards=True))
    for path in ["/api/latest/boards/1", "/api/latest/spaces/1/boards/1"]:
        plain = await client.get(path, headers={**AUTH, "Accept-Encoding": "identity"})
        plain_body = await plain.read()
        zipped = await client.get(path, headers={**AUTH, "Accept-Encoding": "gzip"}, auto_decompress=False)
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(await zipped.read()) == plain_body
        assert b'"cards_deprecation_message":' in plain_body
        assert (b'"cards":[' in plain_body) is has_cards
        again = await client.get(path, headers={**AUTH, "Accept-Encoding": "gzip",
                                                "If-None-Match": zipped.headers["ETag"]})
        assert again.status == 304


async def test_card_list_is_unchanged_after_removal(make_client: ClientFactory) -> None:
    client = await make_client(scheduled(REMOVAL + timedelta(days=1)))
    pages: list[int] = []
    for offset in (0, 100, 200, 300):
        pages += await card_ids(client, f"board_id=1&limit=100&offset={offset}")
    assert pages == list(range(1, 251))
    assert (await client.get("/api/latest/cards?board_id=1&limit=101", headers=AUTH)).status == 400
    private = await client.get("/api/latest/cards?board_id=3", headers=AUTH)
    assert private.status == 403 and await private.read() == b""
    bad = await client.get("/api/latest/cards?board_id=1", headers={"Authorization": "Bearer nope"})
    assert bad.status == 401


@pytest.mark.parametrize(
    ("cap", "removal", "now", "expected"),
    [
        (None, None, datetime(2100, 1, 1, tzinfo=UTC), "full"),  # no schedule: every card forever
        (CAP, None, datetime(2100, 1, 1, tzinfo=UTC), "capped"),
        (None, REMOVAL, REMOVAL - TICK, "full"),
        (None, REMOVAL, REMOVAL, "removed"),
        (datetime(2026, 12, 1, tzinfo=UTC), REMOVAL, datetime(2026, 11, 15, tzinfo=UTC), "removed"),
    ],
    ids=["no-dates", "cap-only", "removal-only-before", "removal-only-at", "removal-before-cap"],
)
async def test_either_date_alone(make_client: ClientFactory, cap: datetime | None, removal: datetime | None,
                                now: datetime, expected: str) -> None:
    client = await make_client(SandboxSettings(cards_cap_from=cap, cards_removal_from=removal, now=now))
    board = await get_board(client)
    counts = {"full": 250, "capped": 100, "removed": None}
    assert (len(board["cards"]) if "cards" in board else None) == counts[expected]
    assert (MESSAGE in board) is (expected != "full")


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (SandboxSettings(cards_cap_from=datetime(2000, 1, 1, tzinfo=UTC)), 100),
        (SandboxSettings(cards_cap_from=datetime(2999, 1, 1, tzinfo=UTC)), 250),
        (SandboxSettings(cards_removal_from=datetime(2000, 1, 1, tzinfo=UTC)), None),
    ],
    ids=["cap-passed", "cap-ahead", "removal-passed"],
)
async def test_real_clock_by_default(
    make_client: ClientFactory, settings: SandboxSettings, expected: int | None
) -> None:
    board = await get_board(await make_client(settings))
    assert (len(board["cards"]) if "cards" in board else None) == expected


def test_dates_compare_as_instants_whatever_their_offset() -> None:
    plus_two = timezone(timedelta(hours=2))
    settings = SandboxSettings(cards_cap_from=datetime(2026, 10, 1, 2, 0, tzinfo=plus_two))  # == CAP
    assert cards_phase(settings, CAP - TICK) is CardsPhase.FULL
    assert cards_phase(settings, CAP) is CardsPhase.CAPPED
    assert cards_phase(settings, datetime(2026, 10, 1, 1, 59, tzinfo=plus_two)) is CardsPhase.FULL


@pytest.mark.parametrize("name", ["cards_cap_from", "cards_removal_from", "now"])
def test_naive_datetimes_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SandboxSettings(**{name: datetime(2026, 10, 1)})  # type: ignore[arg-type]
