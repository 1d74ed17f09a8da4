"""json_splice: results equal a parse-and-edit with json.loads; untouched parts stay byte for byte."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gateway import json_splice
from gateway.json_splice import NotJSON, drop, scan, truncate

MESSAGE = ("cards_deprecation_message", json.dumps("see the card list ✓").encode())


def pairs(text: bytes) -> Any:
    """json.loads that keeps key order and duplicates visible, and numbers as written."""
    return json.loads(text, object_pairs_hook=list, parse_float=str, parse_int=str)


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


def cards_of(doc: list[tuple[str, Any]]) -> list[Any]:
    return next(v for k, v in doc if k == "cards")


@pytest.mark.parametrize("seed", range(300))
def test_random_documents_match_a_parse_and_edit(seed: int) -> None:
    rng = random.Random(seed)
    writer = Writer(rng, pretty=seed % 2 == 1)
    count = rng.choice([0, 1, 2, 3, 5, 8])
    body = writer.document(count, rng.randrange(0, 6))
    original = pairs(body)
    keep = rng.randrange(0, 6)
    layout = scan(body, "cards", keep=keep, extra_key=MESSAGE[0])
    assert layout.count == count == len(cards_of(original))

    capped = pairs(truncate(body, layout, keep, MESSAGE))
    expected = []
    for k, v in original:
        expected.append((k, v[:keep] if k == "cards" else v))
        if k == "cards":
            expected.append((MESSAGE[0], json.loads(MESSAGE[1])))
    assert capped == expected

    dropped = drop(body, layout, MESSAGE)
    expected = [(MESSAGE[0], json.loads(MESSAGE[1])) if k == "cards" else (k, v) for k, v in original]
    assert pairs(dropped) == expected
    assert pairs(drop(body, layout)) == [(k, v) for k, v in original if k != "cards"]

    # Bytes outside the cut are the original's, byte for byte.
    member = layout.target_member
    assert member is not None
    assert dropped.startswith(body[: member.start])
    assert dropped.endswith(body[member.end :])


@pytest.mark.parametrize("seed", range(100))
def test_random_documents_without_cards(seed: int) -> None:
    rng = random.Random(1000 + seed)
    body = Writer(rng, pretty=True).document(None, 0)
    layout = scan(body, "cards", keep=3)
    assert layout.target is None and layout.count == 0
    assert [m.key for m in layout.members] == [k for k, _ in pairs(body)]


@pytest.mark.parametrize("seed", range(100))
def test_truncated_documents_are_refused(seed: int) -> None:
    rng = random.Random(2000 + seed)
    body = Writer(rng, pretty=False).document(rng.randrange(0, 4), 1)
    cut = rng.randrange(0, len(body) - 1)
    with pytest.raises(NotJSON):
        scan(body[:cut], "cards")


@pytest.mark.parametrize(
    "body",
    [
        b"", b"   ", b"[]", b'"cards"', b"null", b"{", b"}", b'{"cards":[1,2]', b'{"cards":[1,2]}}', b'{"cards":[1,2],}',
        b'{"cards" [1]}', b'{cards:[1]}', b'{"cards":[1 2]}', b'{"cards":[01]}', b'{"cards":[tru]}',
        b'{"cards":["\\x"]}', b'{"cards":["a\nb"]}', b'{"cards":[{"a":[1}]}', b'{"cards":[{"a":1]]}',
        b'{"cards":[1],"cards":[2]}', b'{"a":1}{"b":2}', b"\xef\xbb\xbf{}", b'{"cards":["unterminated]}',
        b'{"a":\\"x"}', b'{"cards":[]} x',
    ],
)
def test_invalid_texts_are_refused(body: bytes) -> None:
    with pytest.raises(NotJSON):
        scan(body, "cards")


def test_deep_nesting_beyond_the_fast_pattern() -> None:
    deep = "[" * 40 + '"]}["' + "]" * 40
    body = ('{"a":' + deep + ',"cards":[' + ",".join([deep] * 3) + "]}").encode()
    layout = scan(body, "cards", keep=1)
    assert layout.count == 3
    assert json.loads(truncate(body, layout, 1))["cards"] == [json.loads(deep)]
    with pytest.raises(NotJSON):
        scan(b'{"cards":' + b"[" * 1000 + b"]" * 1000 + b"}", "cards")


def test_escaped_key_names_are_recognised() -> None:
    body = b'{"c\\u0061rds":[1,2,3],"x":1}'
    layout = scan(body, "cards", keep=1)
    assert layout.count == 3
    assert json.loads(truncate(body, layout, 1)) == {"cards": [1], "x": 1}


def test_non_array_cards_and_existing_message() -> None:
    layout = scan(b'{"cards":null}', "cards")
    assert layout.target == 0 and not layout.is_array
    body = b'{"cards_deprecation_message":"old","cards":[1]}'
    layout = scan(body, "cards", keep=0, extra_key=MESSAGE[0])
    out = drop(body, layout, MESSAGE)
    assert json.loads(out) == {"cards_deprecation_message": "see the card list ✓"}
    assert out.count(b"cards_deprecation_message") == 1


def test_splice_refuses_overlaps() -> None:
    with pytest.raises(ValueError):
        json_splice.splice(b"abcdef", [(0, 3, b""), (2, 4, b"")])
