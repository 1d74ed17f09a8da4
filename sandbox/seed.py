"""Deterministic seed data: the same seed always yields the same boards,
cards, uids and files."""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sandbox.store import (
    Board,
    Card,
    Column,
    CustomProperty,
    Lane,
    Space,
    Store,
    StoredContent,
    User,
)

__all__ = [
    "BIG_SIZE",
    "BIG_SIZE_CARD_IDS",
    "EMPTY_BOARD_ID",
    "FIRST_EXTRA_BOARD_ID",
    "PRIVATE_BOARD_ID",
    "SEEDED_BOARD_ID",
    "SEEDED_CARD_COUNT",
    "SPACE_ID",
    "build_store",
    "content_of",
]

SPACE_ID = 1
SEEDED_BOARD_ID = 1
EMPTY_BOARD_ID = 2
PRIVATE_BOARD_ID = 3
FIRST_EXTRA_BOARD_ID = 4
SEEDED_CARD_COUNT = 250
# Larger than any IEEE double can hold exactly: a JSON round trip through a
# float-based parser would change it.
BIG_SIZE = 12345678901234567890123
BIG_SIZE_CARD_IDS = frozenset({7, 77, 177})

_BASE_TIME = datetime(2026, 1, 15, 9, 0, tzinfo=UTC)
_WORDS = (
    "Refactor", "Deploy", "Review", "Migrate", "Document", "Benchmark",
    "Audit", "Design", "Fix", "Upgrade", "Prototype", "Measure",
)
_OBJECTS = (
    "billing service", "login page", "search index", "file storage",
    "mobile client", "report export", "webhooks", "board settings",
)
_UNICODE_TITLES = (
    "Тест ✓ 日本",
    "Café crème — naïve façade",
    "Запуск 🚀 launch",
    "Ελληνικά αβγ «quotes»",
    "中文测试 \u00e9\u0301 combining",
    "עברית ו-English mixed",
)
# Smallest valid 1x1 PNG, so image previews really render.
_PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
_PDF_MINIMAL = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"
)


def content_of(data: bytes) -> StoredContent:
    return StoredContent(size=len(data), sha256=hashlib.sha256(data).hexdigest(), data=data)


def _board(store: Store, board_id: int, title: str, *, private: bool = False, rng: random.Random | None = None,
           **overrides: object) -> Board:
    rng = rng if rng is not None else store.rng()
    created = _BASE_TIME - timedelta(days=30 - board_id)
    values: dict[str, object] = {
        "id": board_id,
        "uid": store.new_uid(rng),
        "space_id": SPACE_ID,
        "title": title,
        "created": created,
        "updated": created + timedelta(days=3),
        "description": None,
        "external_id": None,
        "email_key": f"board{board_id}-{rng.getrandbits(40):010x}",
        "default_card_type_id": 1,
        "default_tags": None,
        "cell_wip_limits": None,
        "move_parents_to_done": False,
        "first_image_is_cover": True,
        "reset_lane_spent_time": False,
        "backward_moves_enabled": False,
        "hide_done_policies": False,
        "hide_done_policies_in_done_column": True,
        "automove_cards": False,
        "auto_assign_enabled": True,
        "card_property_ids": [1],
        "private": private,
    }
    values.update(overrides)
    return Board(**values)  # type: ignore[arg-type]


def _columns(store: Store, board: Board, titles: list[str], rng: random.Random | None = None) -> None:
    for n, title in enumerate(titles, start=1):
        column_type = 1 if n == 1 else (3 if n == len(titles) and n > 1 else 2)
        board.columns.append(
            Column(
                id=board.id * 10 + n,
                uid=store.new_uid(rng),
                board_id=board.id,
                title=title,
                sort_order=float(n),
                type=column_type,
                wip_limit=5 if column_type == 2 else None,
            )
        )


def _lanes(store: Store, board: Board, titles: list[str], rng: random.Random | None = None) -> None:
    for n, title in enumerate(titles, start=1):
        board.lanes.append(
            Lane(id=board.id * 100 + n, uid=store.new_uid(rng), board_id=board.id, title=title, sort_order=float(n))
        )


def _card_title(rng: random.Random, card_id: int) -> str:
    if card_id % 10 == 3:
        return f"{_UNICODE_TITLES[(card_id // 10) % len(_UNICODE_TITLES)]} #{card_id}"
    return f"{rng.choice(_WORDS)} {rng.choice(_OBJECTS)} #{card_id}"


def _seed_cards(store: Store, board: Board) -> None:
    rng = store.rng()
    for card_id in range(1, SEEDED_CARD_COUNT + 1):
        created = _BASE_TIME + timedelta(minutes=card_id)
        column = board.columns[rng.randrange(len(board.columns))]
        lane = board.lanes[rng.randrange(len(board.lanes))]
        store.add_card(
            Card(
                id=card_id,
                uid=store.new_uid(),
                board_id=board.id,
                column_id=column.id,
                lane_id=lane.id,
                title=_card_title(store.rng(), card_id),
                description=None if card_id % 4 else f"Seeded description for card {card_id}.",
                sort_order=float(card_id),
                size=BIG_SIZE if card_id in BIG_SIZE_CARD_IDS else rng.choice((1, 2, 3, 5, 8, 13)),
                owner_id=store.default_author_id,
                created=created,
                updated=created + timedelta(hours=rng.randrange(1, 48)),
            )
        )


def _seed_files(store: Store) -> None:
    card = store.cards[1]
    author = store.default_author_id
    when = card.updated
    comment = store.add_comment(card, "Seeded comment — see the attached notes ✓", author, when)
    prop = store.properties[1]
    store.add_legacy_file(
        card, name="readme.txt", mime_type="text/plain",
        content=content_of(b"Seeded earlier file: anyone with the link can open it.\n"),
        author_id=author, when=when,
    )
    store.add_legacy_file(
        card, name="diagram.png", mime_type="image/png", content=content_of(_PNG_1X1),
        author_id=author, when=when,
    )
    store.add_legacy_file(
        card, name="comment-attachment.txt", mime_type="text/plain",
        content=content_of(b"Earlier file attached to the seeded comment.\n"),
        comment=comment, author_id=author, when=when,
    )
    store.add_restricted_file(
        card, entity_type="card", name="plan.pdf", mime_type="application/pdf",
        content=content_of(_PDF_MINIMAL), author_id=author, when=when,
    )
    store.add_restricted_file(
        card, entity_type="card", name="Отчёт ✓ 日本.txt", mime_type="text/plain",
        content=content_of("Restricted card file with a non-ASCII name: Тест ✓ 日本\n".encode()),
        author_id=author, when=when,
    )
    store.add_restricted_file(
        card, entity_type="comment", name="notes.txt", mime_type="text/plain",
        content=content_of(b"Restricted file attached to the seeded comment.\n"),
        comment=comment, author_id=author, when=when,
    )
    store.add_restricted_file(
        card, entity_type="custom_property", name="scan.png", mime_type="image/png",
        content=content_of(_PNG_1X1), prop=prop, author_id=author, when=when,
    )
    # Seeding touched the card; keep its timestamp deterministic.
    card.updated = when


def _extra_board(store: Store, seed: int, board_id: int, count: int) -> None:
    """A public board in space 1 holding exactly ``count`` cards, ids
    continuing after the highest so far, in id order.

    Its own generator, seeded from the seed and the board id, keeps the uids
    the sandbox hands out later (uploads, inserted cards) the same with or
    without extra boards.
    """
    rng = random.Random(f"sandbox-extra-board:{seed}:{board_id}")
    board = _board(store, board_id, f"Extra board {board_id}", rng=rng,
                   description=f"Board with {count} generated cards.", external_id=f"extra-{board_id}")
    _columns(store, board, ["Queue", "In progress", "Done"], rng)
    _lanes(store, board, ["Default lane", "Expedite"], rng)
    store.add_board(board)
    store.spaces[SPACE_ID].board_ids.append(board_id)
    first_id = store.new_card_id()
    columns, lanes = board.columns, board.lanes
    sizes = (1, 2, 3, 5, 8, 13)
    for n in range(count):
        card_id = first_id + n
        created = _BASE_TIME + timedelta(minutes=n + 1)
        store.add_card(
            Card(
                id=card_id,
                uid=store.new_uid(rng),
                board_id=board_id,
                column_id=columns[rng.randrange(len(columns))].id,
                lane_id=lanes[rng.randrange(len(lanes))].id,
                title=_card_title(rng, card_id),
                description=None if card_id % 4 else f"Generated description for card {card_id}.",
                sort_order=float(n + 1),
                size=rng.choice(sizes),
                owner_id=store.default_author_id,
                created=created,
                updated=created + timedelta(hours=rng.randrange(1, 48)),
            )
        )


def build_store(seed: int, extra_boards: Sequence[int] = ()) -> Store:
    store = Store(seed)
    store.add_user(User(id=1, uid=store.new_uid(), full_name="Sandbox Robot"))
    store.add_property(CustomProperty(id=1, uid=store.new_uid(), name="Attachments", type="file"))
    seeded = _board(
        store, SEEDED_BOARD_ID, "Seeded board",
        description="Board with 250 seeded cards for exercising pagination.",
        external_id="seeded-1",
        default_tags="sandbox,seeded",
        cell_wip_limits=[{"column_id": 12, "lane_id": 101, "wip_limit": 5}],
        move_parents_to_done=True,
    )
    _columns(store, seeded, ["Queue", "In progress", "Done"])
    _lanes(store, seeded, ["Default lane", "Expedite"])
    empty = _board(store, EMPTY_BOARD_ID, "Empty board", card_property_ids=[])
    _columns(store, empty, ["Queue", "Done"])
    _lanes(store, empty, ["Default lane"])
    private = _board(store, PRIVATE_BOARD_ID, "Private board", private=True, card_property_ids=[])
    _columns(store, private, ["Queue"])
    _lanes(store, private, ["Default lane"])
    for board in (seeded, empty, private):
        store.add_board(board)
    store.add_space(
        Space(id=SPACE_ID, uid=store.new_uid(), title="Sandbox space",
              board_ids=[SEEDED_BOARD_ID, EMPTY_BOARD_ID, PRIVATE_BOARD_ID])
    )
    _seed_cards(store, seeded)
    _seed_files(store)
    for n, count in enumerate(extra_boards):
        _extra_board(store, seed, FIRST_EXTRA_BOARD_ID + n, count)
    return store
