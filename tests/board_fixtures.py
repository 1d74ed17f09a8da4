"""Board bodies for the board_cards tests and benchmark: realistic cards, unicode, big integers, floats as written."""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ("BIG_INT", "board_bytes", "board_dict", "card", "realistic_board_bytes", "realistic_card")

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


# --- a board of realistic cards (bench/board_cards.py's second board; fidelity tests) -----------------------------

_FIRST = ("Anna", "Jürgen", "Zoë", "Олег", "美咲", "Łukasz", "José", "Siobhán", "Ahmed", "Ngozi", "Åsa", "Chloé")
_LAST = ("Smith", "Müller", "O'Brien", "Иванова", "山田", "Nowak", "García", "Ní Bhriain", "Haddad", "Okafor")
_SENTENCES = (
    "The export to CSV drops the last row when the filter is on.",
    "Customers on the \"Enterprise\" plan see a 500 after 30 s.",
    "Steps: open the board, drag a card to {Done}, refresh; the card is back in [In progress].",
    "Logs are under C:\\ProgramData\\Agent\\logs and /var/log/agent/*.log.",
    "Привет! Проверьте, пожалуйста, перевод на странице оплаты.",
    "請在週五之前完成審查，並更新發佈說明。",
    "Café-owners in Zürich asked for the naïve résumé template — see the attached PDF.",
    "Regression since v2.14.1: `GET /api/v1/cards?limit=200` takes 4× longer.",
    "Tabs\tand\ttabs: the importer splits on \\t, not on ';'.",
    "Emoji in titles 🚀🔥 break the PDF export (UTF-16 surrogates).",
    "Done when: tests pass, docs updated, changelog entry added.",
    "עדכון: הלקוח אישר את הדרישות.",
    "Line one of a pasted stack trace:\n  at Board.render (board.js:112:9)\n  at next (router.js:40:3)",
    "Numbers to check: 1e-7, -0.0, 12345678901234567890, 3.14159.",
)
_TAG_NAMES = ("bug", "frontend", "backend", "urgent", "customer", "tech-debt", "ux", "security", "i18n", "release")
_MIME = (("pdf", "application/pdf"), ("png", "image/png"), ("xlsx", "application/vnd.openxmlformats-officedocument"
         ".spreadsheetml.sheet"), ("txt", "text/plain"), ("zip", "application/zip"))


def _person(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    ident = rng.randrange(1, 5000)
    return {"id": ident, "uid": f"u-{ident:06d}", "full_name": f"{first} {last}",
            "email": f"user{ident}@example.test", "avatar": f"https://cdn.example.test/a/{ident:06d}.png",
            "type": rng.choice((1, 2, 3))}


def _stamp(rng: random.Random) -> str:
    return (f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:"
            f"{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z")


def realistic_card(i: int, rng: random.Random) -> dict[str, Any]:
    """A card as a work-management service sends it: several sentences of description (quotes, backslashes, tabs,
    newlines, non-ASCII), members, tags, files, custom properties and checklists (nested arrays), timestamps."""
    created = _stamp(rng)
    return {
        "id": i,
        "uid": f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-4{rng.getrandbits(12):03x}-"
               f"{rng.getrandbits(16):04x}-{rng.getrandbits(48):012x}",
        "title": f"{rng.choice(_SENTENCES)[:rng.randrange(20, 60)].rstrip()} #{i}",
        "description": " ".join(rng.choice(_SENTENCES) for _ in range(rng.randrange(2, 9))),
        "asap": rng.random() < 0.05,
        "archived": False,
        "blocked": rng.random() < 0.07,
        "board_id": 1,
        "column_id": rng.randrange(11, 16),
        "lane_id": rng.choice((101, 102)),
        "created": created,
        "updated": _stamp(rng),
        "due_date": _stamp(rng)[:10] if rng.random() < 0.3 else None,
        "size": rng.choice((1, 2, 3, 5, 8, 13, None)),
        "sort_order": round(rng.uniform(0, 100000), 4),
        "state": rng.randrange(1, 4),
        "tags": [{"id": k, "name": _TAG_NAMES[k], "color": k * 7 % 16}
                 for k in rng.sample(range(10), rng.randrange(5))],
        "members": [_person(rng) for _ in range(rng.randrange(1, 5))],
        "owner": _person(rng),
        "files": [
            {"id": rng.randrange(10**6), "name": f"{rng.choice(_TAG_NAMES)}-{k}.{ext}", "type": mime,
             "size": rng.randrange(1000, 50_000_000),
             "url": f"https://files.example.test/{i}/{k}?sig={rng.getrandbits(64):016x}",
             "created": _stamp(rng), "author": _person(rng)["full_name"]}
            for k, (ext, mime) in enumerate(rng.sample(_MIME, rng.randrange(4)))
        ],
        "custom_properties": {
            "estimate_hours": round(rng.uniform(0.5, 40), 1),
            "customer": rng.choice(("ACME GmbH", "Société Générale", "株式会社サンプル", "O'Reilly & Sons", None)),
            "components": rng.sample(["api", "web", "ios", "android", "billing", "search"], rng.randrange(4)),
            "risk": {"level": rng.choice(("low", "medium", "high")), "notes": [rng.choice(_SENTENCES)],
                     "matrix": [[rng.randrange(5) for _ in range(3)] for _ in range(2)]},
        },
        "checklists": [
            {"id": rng.randrange(10**6), "name": f"Checklist {k + 1}",
             "items": [{"id": j, "text": rng.choice(_SENTENCES)[:40], "checked": rng.random() < 0.5}
                       for j in range(rng.randrange(1, 5))]}
            for k in range(rng.randrange(3))
        ],
        "children_ids": [rng.randrange(10**5) for _ in range(rng.randrange(3))],
        "comment_count": rng.randrange(30),
    }


def realistic_board_bytes(n: int = 5000, *, seed: int = 37) -> bytes:
    """A board of ``n`` realistic cards (``realistic_card``), compact UTF-8 JSON, the same bytes for the same seed.
    One card in five is written with every non-ASCII character as a ``\\uXXXX`` escape, as some serialisers do."""
    rng = random.Random(seed)
    board = board_dict(0, seed=seed)
    cards = [json.dumps(realistic_card(i, rng), ensure_ascii=i % 5 == 0, separators=(",", ":")).encode()
             for i in range(1, n + 1)]
    head, _, tail = json.dumps(board, ensure_ascii=False, separators=(",", ":")).encode().partition(b'"cards":[]')
    return head + b'"cards":[' + b",".join(cards) + b"]" + tail
