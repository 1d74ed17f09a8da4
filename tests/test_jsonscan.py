"""gateway.policies.board_cards._jsonscan, the C scanner: it must be built, vouch only for JSON arrays, and find their offsets exactly.

Its verdict on a text is compared with Python's own JSON parser (made strict: no NaN or Infinity) on hand-written
grammar cases, on every cut of valid texts, and on random damage; its offsets with a walk over the parsed elements.
tests/test_json_splice.py compares the whole scan, native against exact, on top of this.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import pytest

try:
    from gateway.policies.board_cards import _jsonscan  # CI builds it (scripts/bootstrap.sh): a missing build fails here, on purpose
except ImportError as missing:
    raise ImportError(
        "gateway.policies.board_cards._jsonscan, the C JSON scanner, is not built: install a C compiler (gcc) and run scripts/bootstrap.sh"
    ) from missing


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def is_json(text: bytes) -> bool:
    """RFC 8259, as the scanner reads it: Python's parser without its NaN/Infinity extension (UTF-8 is not checked:
    the text is decoded as latin-1, byte for byte)."""
    try:
        json.loads(text.decode("latin-1"), parse_constant=_reject_constant)
    except ValueError:
        return False
    return True


def scan(text: bytes, keep: int = 0) -> Any:
    return _jsonscan.scan_array(text, 0, keep)


ELEMENTS_VALID = [
    b"0", b"-0", b"7", b"-12", b"1.5", b"-0.0", b"1e5", b"1E+5", b"1e-05", b"2.5E10", b"123456789012345678901234567890",
    b"true", b"false", b"null", b'""', b'"a"', b'"\\""', b'"\\\\"', b'"\\/"', b'"\\b\\f\\n\\r\\t"', b'"\\u00e9"',
    b'"\\uD83D\\uDE80"', b'"\\ud800"', b'"\x7f"', b'"\xc3\xa9"', b'"\xff"', b"[]", b"{}", b'{"a":1}', b'{"":[]}',
    b'{"a":{"b":[1,{"c":null}]}}', b"[[[]]]", b'{"a" : 1 , "b" : [ 1 , 2 ] }', b'{"a":1,"a":2}',
    b'" \\u0041\\u004a"', b'"]}[{,:"',
]
ELEMENTS_INVALID = [
    b"01", b"-", b"1.", b".5", b"1e", b"1e+", b"+1", b"--1", b"0x10", b"1.5.2", b"NaN", b"Infinity", b"-Infinity",
    b"tru", b"True", b"nul", b"falsey", b"nulll", b'"', b'"abc', b'"\\"', b'"\\a"', b"\"\\'\"", b'"\\x41"',
    b'"\\u12"', b'"\\u12G4"', b'"\\U0041"', b'"\x00"', b'"\x1f"', b'"a\nb"', b'"\t"', b"[", b"]", b"{", b"[1,]",
    b"[,1]", b"[1 2]", b"[}", b"{]", b'{"a"}', b'{"a":}', b'{"a":1,}', b"{,}", b'{1:2}', b'{"a" 1}', b"{'a':1}",
    b'{"a":1 "b":2}', b"[1]]", b"[[1]", b"{}}", b"\x0c1", b"1\x0b",
]


@pytest.mark.parametrize("element", ELEMENTS_VALID + ELEMENTS_INVALID)
@pytest.mark.parametrize("spacing", ["", " ", "\n\t\r "])
def test_grammar_of_one_element(element: bytes, spacing: str) -> None:
    ws = spacing.encode()
    text = b"[" + ws + element + ws + b"]"
    valid = is_json(text)
    assert valid == (element in ELEMENTS_VALID)  # the reference agrees with the lists (\f and \v: not whitespace)
    got = scan(text, keep=1)
    if not valid:
        # Refused, or (for a text with a stray closing bracket) an array that ends early and is JSON.
        assert got is None or (got[0] < len(text) and is_json(text[: got[0]]))
    else:
        start = 1 + len(ws)
        assert got == (len(text), 1, [start + len(element)], start + len(element))


def test_grammar_between_elements() -> None:
    for text, want in [
        (b"[]", (2, 0, [], 1)),
        (b"[ ]", (3, 0, [], 2)),  # empty: the last end is where the ']' is, after the whitespace
        (b"[1,2,3]", (7, 3, [2, 4], 6)),
        (b"[1 , 2 ,\n3 ]", (12, 3, [2, 6], 10)),
        (b'[{"a":[1,2]},[3],"x",null]', (26, 4, [12, 16], 25)),
    ]:
        assert scan(text, keep=2) == want
    for text in (b"[1,,2]", b"[1,2,]", b"[,]", b"[1;2]", b"[1,2", b"[1,2}", b"[\x001]", b"[1"):
        assert scan(text, keep=2) is None
    # The scanner stops at the array's ']': what follows is the caller's to read.
    assert scan(b'[1],"z":x', keep=1) == (3, 1, [2], 2)


def test_arguments() -> None:
    text = b'{"cards":[1,2,3]}'
    assert _jsonscan.scan_array(text, 9, 10) == (16, 3, [11, 13, 15], 15)  # keep beyond the count: every end
    assert _jsonscan.scan_array(text, 9, 0) == (16, 3, [], 15)
    assert _jsonscan.scan_array(text, 9, -5) == (16, 3, [], 15)
    for pos in (-1, 0, 8, 10, len(text), len(text) + 10):
        assert _jsonscan.scan_array(text, pos, 1) is None  # no '[' there
    # bytes only: the scanner relies on the NUL that follows a bytes object's data, and on it not changing.
    for other in (bytearray(text), memoryview(text), "[1]"):
        with pytest.raises(TypeError):
            _jsonscan.scan_array(other, 9, 1)  # type: ignore[arg-type]
    class Sub(bytes):
        pass
    assert _jsonscan.scan_array(Sub(text), 9, 1) == (16, 3, [11], 15)
    with pytest.raises(TypeError):
        _jsonscan.scan_array(text, 9)  # type: ignore[call-arg]


@pytest.mark.parametrize("length", range(0, 70))
def test_strings_around_the_16_byte_steps(length: int) -> None:
    """Special bytes at every offset of a string, so that each falls in the 16-byte loop and in the byte loop."""
    for special, valid in ((b"", True), (b'\\"', True), (b"\\\\", True), (b"\\u0041", True), (b'"', False),
                           (b"\\", False), (b"\x01", False), (b"\\z", False), (b"\x80", True)):
        body = b"a" * length + special + b"c" * (length % 17)
        text = b'["' + body + b'"]'
        assert is_json(text) == valid
        got = scan(text, keep=1)
        assert (got is not None) == valid, (length, special)
        if valid:
            assert got == (len(text), 1, [len(text) - 1], len(text) - 1)
        # The same string left open at the end of the text, cut anywhere: never vouched for.
        for cut in range(1, len(text) - 1):
            assert scan(text[:cut]) is None


def test_every_cut_of_a_valid_text_is_refused() -> None:
    text = json.dumps(
        [{"id": 1, "t": "a \"q\" \\ é ✓", "n": [1.5e-3, -0, 12345678901234567890, True, None, {}], "e": []}, "s", 7],
        ensure_ascii=False,
    ).encode()
    assert scan(text, keep=3) is not None
    for cut in range(len(text)):
        assert scan(text[:cut]) is None


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth < 6 else 4)
    if kind == 0:
        return rng.choice(["", "a", "é ✓", '"', "\\", "\n\t", "\u0001", "x" * rng.randrange(40), "]},[{:"])
    if kind == 1:
        return rng.choice([0, -1, 7, 10**30, -(10**20), 1.5, -0.25, 1e100, 2.5e-8])
    if kind in (2, 3):
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["a", "b", "é", "k\"q", ""]): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


@pytest.mark.parametrize("seed", range(200))
def test_random_texts_and_damage(seed: int) -> None:
    rng = random.Random(9000 + seed)
    elements = [_random_value(rng, 1) for _ in range(rng.randrange(0, 8))]
    indent = rng.choice([None, None, 0, 2, "\t"])
    text = json.dumps(elements, indent=indent, ensure_ascii=rng.random() < 0.5).encode()
    keep = rng.randrange(0, 5)
    got = scan(text, keep)
    assert got is not None and got[0] == len(text) and got[1] == len(elements)
    # Each end found is where the elements written so far end: the text up to it, closed, parses to those elements.
    for i, end in enumerate(got[2]):
        assert json.loads(text[:end] + b"]") == elements[: i + 1]
    if elements:
        assert json.loads(text[: got[3]] + b"]") == elements
    # Damage: one byte changed, inserted or deleted; the verdict is the reference parser's.
    for _ in range(20):
        data = bytearray(text)
        at = rng.randrange(len(data))
        byte = rng.choice(b'{}[]",:\\ 0123456789.eE+-tfnaul\x00\x1f\n\x7f\xff')
        action = rng.randrange(3)
        if action == 0:
            data[at] = byte
        elif action == 1:
            data.insert(at, byte)
        else:
            del data[at]
        damaged = bytes(data)
        result = scan(damaged)
        if result is not None:
            assert is_json(damaged[: result[0]])  # vouched: the array it read is JSON (what follows is the caller's)
        elif damaged.startswith(b"["):
            assert not is_json(damaged)  # refused: not JSON


def test_nesting_limit() -> None:
    for depth, readable in ((511, True), (512, True), (513, False), (100_000, False)):
        text = b"[" + b"[" * depth + b"]" * depth + b"]"
        assert (scan(text) is not None) == readable
        text = b"[" + b'{"a":' * depth + b"1" + b"}" * depth + b"]"
        assert (scan(text) is not None) == readable


def test_no_object_per_element() -> None:
    """Memory does not grow with the array: only the first ``keep`` ends are kept."""
    text = b"[" + b",".join([b'{"a":[1,2,"x"]}'] * 200_000) + b"]"
    tracemalloc.start()
    try:
        got = scan(text, keep=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is not None and got[1] == 200_000 and len(got[2]) == 10
    assert peak < 16 * 1024  # against 3 MB of text and 200,000 elements
