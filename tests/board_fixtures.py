"""Board bodies for the board_cards tests and benchmark: realistic cards, unicode, big integers, floats as written."""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ("BIG_INT", "board_bytes", "board_dict", "card")

# Larger than any IEEE double holds exactly: a parse-and-reserialise round trip would change it.
BIG_INT = 12345678901234567890123456789
_TITLES = (
    "[UI] Fix the login page", "Deploy {billing} service", 'Review "search" index', "Тест ✓ 日本",
    "Café crème — naïve façade", "Запуск 🚀 launch", "עברית ו-English", "Back\\slash and \\\" quote",
)


_WORDS = ("deploy", "review", "the", "billing", "service", "before", "Friday", "✓", "release", "notes", "and", "Тест")


def _filler(i: int, size: int) -> str:
    words: list[str] = []
    length = 0
    k = i
    while length < size:
        word = _WORDS[k % len(_WORDS)]
        words.append(word)
        length += len(word) + 1
        k = k * 7 + 3
    return " ".join(words)


def card(i: int, rng: random.Random, *, padding: int = 0) -> dict[str, Any]:
    return {
        "id": i,
        "uid": f"{i:08x}-7d3c-4f1e-9a2b-{i:012x}",
        "title": f"{_TITLES[i % len(_TITLES)]} #{i}",
        "description": (
            None if i % 3 and not padding
            else "Line one\nline two with [brackets], {braces} and \"quotes\". " * 3 + _filler(i, padding)
        ),
        "asap": False,
        "archived": False,
        "blocked": i % 17 == 0,
        "board_id": 1,
        "column_id": 11 + i % 3,
        "lane_id": 101,
        "created": f"2026-01-15T09:{i % 60:02d}:00.000Z",
        "updated": "2026-01-16T10:00:00.123Z",
        "due_date": None,
        "size": BIG_INT if i % 50 == 7 else rng.choice((1, 2, 3, 5, 8, 13)),
        "sort_order": i + 0.5,
        "state": 2,
        "tags": [{"id": k, "name": f"tag-{k}", "color": k % 16} for k in range(i % 4)],
        "members": [{"id": 7, "uid": "u-7", "full_name": "Sandbox Robot", "email": "robot@example.test", "type": 1}],
        "owner": {"id": 7, "uid": "u-7", "full_name": "Sandbox Robot", "email": "robot@example.test"},
        "type": {"id": 1, "name": "Card", "color": 4, "letter": "C"},
        "properties": {"id_1": "value ✓", "id_2": [1, 2, 3], "id_3": {"nested": [{"deep": ["x"]}]}},
        "children_count": 0,
        "parents_ids": [],
        "checklists": [{"id": i, "name": "Checklist", "items": [{"id": 1, "text": "do it", "checked": False}]}],
    }


def board_dict(n: int, *, seed: int = 1, board_id: int = 1, padding: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    return {
        "id": board_id,
        "title": "Board ✓ 日本",
        "created": "2026-01-01T00:00:00.000Z",
        "description": None,
        "columns": [{"id": 11 + k, "title": f"Column {k}"} for k in range(3)],
        "lanes": [{"id": 101, "title": "Default lane"}],
        "cards": [card(i, rng, padding=padding) for i in range(1, n + 1)],
        "card_properties": None,
        "automove_cards": False,
    }


def board_bytes(n: int, *, floats: bool = True, **kwargs: Any) -> bytes:
    """Compact UTF-8 JSON; with ``floats``, a trailing member holds floats written in ways a parser would change."""
    body = json.dumps(board_dict(n, **kwargs), ensure_ascii=False, separators=(",", ":")).encode()
    if floats:
        body = body[:-1] + b',"weights":[1.0,1.50,2e3,-0.0,1E+2,123456789012345678901234567890.5]}'
    return body
