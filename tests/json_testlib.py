"""Random JSON texts for the board scan's tests and its fuzz (tests/fuzz_jsonscan.py): the writer of board-like
documents, the damage done to them, and the exact path's answers that the native scanner must give."""

from __future__ import annotations

import json
import random
from typing import Any

from gateway.policies.board_cards import json_splice

__all__ = ("MESSAGE", "MUTATIONS", "Writer", "card_array_document", "exact_top_array", "layout_fields")

MESSAGE = ("cards_deprecation_message", json.dumps("see the card list ✓").encode())


class Writer:
    """Random JSON texts: random whitespace, escapes, unicode, numbers as written, nesting."""

    def __init__(self, rng: random.Random, pretty: bool) -> None:
        self.rng = rng
        self.pretty = pretty

    def ws(self) -> str:
        if not self.pretty:
            return ""
        return self.rng.choice(["", " ", "\n  ", "\t", "\r\n", "  "])

    def string(self) -> str:
        pieces = ["a", "Тест", "日本", "🚀", " ", "[", "]", "{", "}", ",", ":", '\\"', "\\\\", "\\n", "\\u00e9",
                  "\\ud83d\\ude80", "\\/", "x" * 5]
        return '"' + "".join(self.rng.choice(pieces) for _ in range(self.rng.randrange(0, 6))) + '"'

    def number(self) -> str:
        return self.rng.choice(["0", "-1", "7", "12345678901234567890123456789", "1.0", "1.50", "-0.0", "2e3",
                                "1E+2", "3.14159e-10", "123456789012345678901234567890.5"])

    def value(self, depth: int) -> str:
        kind = self.rng.randrange(7 if depth < 9 else 4)
        if kind == 0:
            return self.string()
        if kind == 1:
            return self.number()
        if kind == 2:
            return self.rng.choice(["true", "false", "null"])
        if kind == 3:
            return self.string()
        if kind in (4, 5):
            items = [self.value(depth + 1) for _ in range(self.rng.randrange(0, 4))]
            return "[" + self.ws() + ("," + self.ws()).join(items) + self.ws() + "]"
        return self.object(depth + 1, self.rng.randrange(0, 4))

    def object(self, depth: int, size: int, keys: list[str] | None = None) -> str:
        keys = keys or [self.string() for _ in range(size)]
        members = [f"{k}{self.ws()}:{self.ws()}{self.value(depth)}" for k in keys]
        return "{" + self.ws() + ("," + self.ws()).join(members) + self.ws() + "}"

    def document(self, cards: int | None, position: int) -> bytes:
        suffixes = ["", "é", "[", '"']
        keys = [json.dumps(f"k{i}" + self.rng.choice(suffixes)) for i in range(self.rng.randrange(0, 5))]
        members = [f"{k}{self.ws()}:{self.ws()}{self.value(1)}" for k in keys]
        if cards is not None:
            elements = [self.object(2, self.rng.randrange(0, 5)) if self.rng.random() < 0.8 else self.value(2)
                        for _ in range(cards)]
            array = "[" + self.ws() + ("," + self.ws()).join(elements) + self.ws() + "]"
            members.insert(min(position, len(members)), f'"cards"{self.ws()}:{self.ws()}{array}')
        return (self.ws() + "{" + self.ws() + ("," + self.ws()).join(members) + self.ws() + "}" + self.ws()).encode()


def layout_fields(layout: json_splice.Layout) -> tuple[Any, ...]:
    return (layout.size, layout.members, layout.target, layout.count, layout.is_array, layout.element_ends,
            layout.last_element_end, layout.extra)


def card_array_document(rng: random.Random, writer: Writer, cards: int, position: int) -> bytes:
    """Like Writer.document, but every card an object or array."""
    suffixes = ["", "é", "[", '"', "]", "]}", "],"]
    keys = [json.dumps(f"k{i}" + rng.choice(suffixes)) for i in range(rng.randrange(0, 5))]
    members = [f"{k}{writer.ws()}:{writer.ws()}{writer.value(1)}" for k in keys]
    elements = [writer.object(2, rng.randrange(0, 5)) if rng.random() < 0.8
                else "[" + ",".join(writer.value(3) for _ in range(rng.randrange(0, 3))) + "]"
                for _ in range(cards)]
    array = "[" + writer.ws() + ("," + writer.ws()).join(elements) + writer.ws() + "]"
    members.insert(min(position, len(members)), f'"cards"{writer.ws()}:{writer.ws()}{array}')
    ws = writer.ws
    return (ws() + "{" + ws() + ("," + ws()).join(members) + ws() + "}" + ws()).encode()


MUTATIONS = [b'"', b"\\", b"[", b"]", b"{", b"}", b",", b":", b"x", b"1", b" ", b"\n", b"\x01", b"\x00", b"\\u12",
              b"\\x", b'\\"', b"\\\\"]


def exact_top_array(text: bytes, keep: int = 0) -> Any:
    """The exact path on the same text: what the scanner must answer."""
    try:
        pos = json_splice._skip_ws(text, 0)
        if pos >= len(text) or text[pos] != 0x5B:
            return None
        end, count, ends, last_end = json_splice._scan_array(text, pos, keep)
    except json_splice.NotJSON:
        return None
    if json_splice._skip_ws(text, end) != len(text):
        return None
    return (count, ends, last_end, end)
