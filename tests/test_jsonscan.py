"""gateway.policies.board_cards._jsonscan, the C scanner: it must be built, read exactly the language of json_splice's
exact path, find the same offsets, and give the same answer however the text is cut into pieces.

References: the exact path (json_splice's regular expressions) for the verdict and every offset, on hand-written
grammar cases, on special bytes at every offset around the 64-byte blocks, on every cut of valid texts, on random
texts and random damage; Python's own JSON parser (made strict: no NaN or Infinity) for the one-way property that
valid JSON is always vouched for. Every case is also fed in pieces cut at every byte, or at random places, and with
each SIMD variant the CPU has. tests/test_json_splice.py compares the whole scan, native against exact, on top.
"""

from __future__ import annotations

import json
import random
import threading
import tracemalloc
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

try:
    from gateway.policies.board_cards import (
        _jsonscan,  # CI builds it (scripts/bootstrap.sh): a missing build fails here, on purpose
    )
except ImportError as missing:
    raise ImportError(
        "gateway.policies.board_cards._jsonscan, the C JSON scanner, is not built: install a C compiler (gcc) and run scripts/bootstrap.sh"
    ) from missing

from tests.json_testlib import exact_top_array

VARIANTS = [name for name in ("avx2", "sse2", "none") if _jsonscan.use_simd(name)]
_jsonscan.use_simd(VARIANTS[0])  # the best the CPU has: what the module chose at import


@pytest.fixture(params=VARIANTS)
def simd(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each classification the CPU can run (AVX2, SSE2; bytes one by one elsewhere), in turn."""
    assert _jsonscan.use_simd(request.param)
    try:
        yield request.param
    finally:
        _jsonscan.use_simd(VARIANTS[0])


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def is_json(text: bytes) -> bool:
    """RFC 8259: Python's parser without its NaN/Infinity extension (UTF-8 is not checked: the text is decoded as
    latin-1, byte for byte)."""
    try:
        json.loads(text.decode("latin-1"), parse_constant=_reject_constant)
    except ValueError:
        return False
    return True


def scan(text: bytes | Sequence[bytes], keep: int = 0) -> Any:
    """The scanner on a top-level array: (count, ends, last_end, end) or None. ``text``: bytes, or its pieces."""
    scanner = _jsonscan.Scanner(keep, top_array=True)
    for piece in [text] if isinstance(text, bytes) else text:
        scanner.feed(piece)
    return scanner.finish()


def cuts(text: bytes, rng: random.Random, every_byte: bool = False) -> Iterator[list[bytes]]:
    """The text cut into pieces: at every byte (when asked), in pieces of 63, 64 and 65 bytes, at random places."""
    if every_byte:
        yield [text[i : i + 1] for i in range(len(text))]
    for size in (63, 64, 65, 1 + rng.randrange(200)):
        yield [text[i : i + size] for i in range(0, len(text), size)]
    points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(1, 6))))
    yield [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def check(text: bytes, keep: int = 0, *, every_byte: bool = False) -> Any:
    """The scanner's answer on ``text``, checked against the exact path, whole and in pieces."""
    got = scan(text, keep)
    want = exact_top_array(text, keep)
    assert got == want, (text[:200], got, want)
    for pieces in cuts(text, random.Random(len(text) * 7 + keep), every_byte):
        assert scan(pieces, keep) == got, (text[:200], [len(p) for p in pieces][:20])
    return got


ELEMENTS_VALID = [
    b"0", b"-0", b"7", b"-12", b"1.5", b"-0.0", b"1e5", b"1E+5", b"1e-05", b"2.5E10", b"123456789012345678901234567890",
    b"true", b"false", b"null", b'""', b'"a"', b'"\\""', b'"\\\\"', b'"\\/"', b'"\\b\\f\\n\\r\\t"', b'"\\u00e9"',
    b'"\\uD83D\\uDE80"', b'"\\ud800"', b'"\x7f"', b'"\xc3\xa9"', b'"\xff"', b"[]", b"{}", b'{"a":1}', b'{"":[]}',
    b'{"a":{"b":[1,{"c":null}]}}', b"[[[]]]", b'{"a" : 1 , "b" : [ 1 , 2 ] }', b'{"a":1,"a":2}',
    b'" \\u0041\\u004a"', b'"]}[{,:"',
]
# Not JSON. The elements that are nested values with a fault only in their scalars, colons or commas are read by
# the exact path (strings and brackets are all it checks inside a nested value): the scanner reads them the same.
ELEMENTS_INVALID = [
    b"01", b"-", b"1.", b".5", b"1e", b"1e+", b"+1", b"--1", b"0x10", b"1.5.2", b"NaN", b"Infinity", b"-Infinity",
    b"tru", b"True", b"nul", b"falsey", b"nulll", b'"', b'"abc', b'"\\"', b'"\\a"', b"\"\\'\"", b'"\\x41"',
    b'"\\u12"', b'"\\u12G4"', b'"\\U0041"', b'"\x00"', b'"\x1f"', b'"a\nb"', b'"\t"', b"[", b"]", b"{", b"[1,]",
    b"[,1]", b"[1 2]", b"[}", b"{]", b'{"a"}', b'{"a":}', b'{"a":1,}', b"{,}", b'{1:2}', b'{"a" 1}', b"{'a':1}",
    b'{"a":1 "b":2}', b"[1]]", b"[[1]", b"{}}", b"\x0c1", b"1\x0b", b"[\\]", b'{"a":\\"x\\"}', b"[tru]", b"[\x00]",
    b'{"k":"\\x"}', b'["\x01"]',
]
NESTED_LOOSELY = {b"[1,]", b"[,1]", b"[1 2]", b'{"a"}', b'{"a":}', b'{"a":1,}', b"{,}", b'{1:2}', b'{"a" 1}',
                  b"{'a':1}", b'{"a":1 "b":2}', b"[tru]", b"[\x00]"}


@pytest.mark.parametrize("element", ELEMENTS_VALID + ELEMENTS_INVALID)
@pytest.mark.parametrize("spacing", ["", " ", "\n\t\r "])
def test_grammar_of_one_element(simd: str, element: bytes, spacing: str) -> None:
    ws = spacing.encode()
    text = b"[" + ws + element + ws + b"]"
    valid = is_json(text)
    assert valid == (element in ELEMENTS_VALID)  # the reference agrees with the lists (\f and \v: not whitespace)
    got = check(text, keep=1, every_byte=True)
    if valid or element in NESTED_LOOSELY:
        start = 1 + len(ws)
        assert got == (1, [start + len(element)], start + len(element), len(text))
    else:
        assert got is None


def test_grammar_between_elements(simd: str) -> None:
    for text, want in [
        (b"[]", (0, [], 1, 2)),
        (b"[ ]", (0, [], 2, 3)),  # empty: the last end is where the ']' is, after the whitespace
        (b"[1,2,3]", (3, [2, 4], 6, 7)),
        (b"[1 , 2 ,\n3 ]", (3, [2, 6], 10, 12)),
        (b'[{"a":[1,2]},[3],"x",null]', (4, [12, 16], 25, 26)),
        (b' \n[1]\r\n\t ', (1, [4], 4, 5)),
    ]:
        assert check(text, keep=2, every_byte=True) == want
    for text in (b"[1,,2]", b"[1,2,]", b"[,]", b"[1;2]", b"[1,2", b"[1,2}", b"[\x001]", b"[1", b"[1]x", b"[1] 2",
                 b"[1][2]", b"[1]\x00", b"\xef\xbb\xbf[1]", b"", b"  ", b"1", b'"[1]"', b"{}"):
        assert check(text, keep=2, every_byte=True) is None


def test_top_level_object() -> None:
    def members(text: bytes | Sequence[bytes], keep: int = 1) -> Any:
        scanner = _jsonscan.Scanner(keep)
        for piece in [text] if isinstance(text, bytes) else text:
            scanner.feed(piece)
        return scanner.finish()

    text = b' {"a" : 1, "c\\u0061rds":[{"x":"]"} , 2],"o":{"p":[1,{"]}":0}]},"e":[],"s":"\\"","n":[1 2]}\n'
    want = [
        (2, 5, 8, 9, None),
        (11, 23, 24, 39, (2, [34], 38, 39)),
        (40, 43, 44, 62, None),
        (63, 66, 67, 69, (0, [], 68, 69)),
        (70, 73, 74, 78, None),
        (79, 82, 83, 88, False),  # an array that is not by the grammar element by element: only its extent
    ]
    assert [(text[a:b], text[c:d]) for a, b, c, d, _ in want] == [
        (b'"a"', b"1"), (b'"c\\u0061rds"', b'[{"x":"]"} , 2]'), (b'"o"', b'{"p":[1,{"]}":0}]}'), (b'"e"', b"[]"),
        (b'"s"', b'"\\""'), (b'"n"', b"[1 2]")]
    assert members(text) == want
    rng = random.Random(5)
    for pieces in cuts(text, rng, every_byte=True):
        assert members(pieces) == want
    assert members(b"{}") == [] and members(b"\t{ }\r\n") == []
    for bad in (b"{", b"}", b'{"a":1,}', b'{"a" 1}', b"{'a':1}", b'{"a":1}}', b'{"a":tru}', b'{"a":01}', b'{"a":[}',
                b'{"a":1} x', b'{"a":"\\x"}', b'{a:1}', b'{"a":1 "b":2}', b"[1]", b'"x"', b"", b'{"a":{"b"}'[:-1]):
        assert members(bad) is None, bad


def test_arguments() -> None:
    scanner = _jsonscan.Scanner(-5, top_array=True)  # a negative keep: no end kept
    assert scanner.feed(bytearray(b"[1,")) and scanner.feed(memoryview(b"2]"))  # any bytes-like object
    assert scanner.finish() == (2, [], 4, 5) == scanner.finish()  # finish is final, and may be asked again
    with pytest.raises(ValueError):
        scanner.feed(b" ")
    with pytest.raises(TypeError):
        _jsonscan.Scanner(1).feed("[1]")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _jsonscan.Scanner()  # type: ignore[call-arg]
    scanner = _jsonscan.Scanner(1, top_array=True)
    # Bytes wait until they fill a block of 64: a fault shows once its block is read (at the latest, at finish).
    assert scanner.feed(b"[1]") and scanner.feed(b"x")
    assert not scanner.feed(b" " * 64) and not scanner.feed(b"[")  # refused: the rest is ignored
    assert scanner.finish() is None
    scanner = _jsonscan.Scanner(1, top_array=True)
    assert scanner.feed(b"[1]x") and scanner.finish() is None
    # Reused after __init__: nothing of the first text is left.
    scanner = _jsonscan.Scanner(1)
    scanner.feed(b'{"a":[1,2')
    scanner.__init__(1, top_array=True)  # type: ignore[misc]
    scanner.feed(b"[3]")
    assert scanner.finish() == (1, [2], 2, 3)


SPECIALS = [
    (b"", True), (b'\\"', True), (b"\\\\", True), (b"\\u0041", True), (b"\\uD83D\\uDE80", True), (b'\\\\\\"', True),
    (b'\\\\\\\\\\"', True), (b"\\/\\b\\f\\n\\r\\t", True), (b"\xe6\x97\xa5\xe6\x9c\xac", True), (b"\x80", True),
    (b"]}[{,:", True), (b'"', False), (b"\\", False), (b"\\\\\\", False), (b"\x01", False), (b"\x1f", False),
    (b"\\z", False), (b"\\u12", False), (b"\\u12G4", False), (b"\\U0041", False), (b"\\\x00", False),
]


@pytest.mark.parametrize("length", [*range(70), *range(118, 134)])
def test_strings_around_the_64_byte_blocks(simd: str, length: int) -> None:
    """Special bytes at every offset of a string around the blocks' edges (escapes, runs of backslashes before a
    quote, multi-byte UTF-8, control characters), in a string element and in a string nested in an object; cut into
    pieces at every byte: the same answer as the exact path."""
    for special, valid in SPECIALS:
        body = b"a" * length + special + b"z" * (length % 17)
        for text in (b'["' + body + b'"]', b'[{"k":"' + body + b'"}]'):
            got = check(text, keep=1, every_byte=length in (0, 62, 63, 64, 65, 126, 127, 128))
            assert (got is not None) == valid, (length, special, text)
            if valid:
                assert got == (1, [len(text) - 1], len(text) - 1, len(text))
            # The same string left open at the end of the text, cut anywhere: never vouched for.
            for cut in range(1, len(text) - 1, 7):
                assert scan(text[:cut]) is None


def test_every_cut_of_a_valid_text_is_refused(simd: str) -> None:
    text = json.dumps(
        [{"id": 1, "t": "a \"q\" \\ é ✓", "n": [1.5e-3, -0, 12345678901234567890, True, None, {}], "e": []}, "s", 7,
         -12345678901234567890123.25e+10, "\\\\\"", True],
        ensure_ascii=False,
    ).encode()
    assert check(text, keep=3, every_byte=True) is not None
    for cut in range(len(text)):
        assert scan(text[:cut]) is None
        assert scan([text[: cut // 2], text[cut // 2 : cut]]) is None


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth < 6 else 4)
    if kind == 0:
        return rng.choice(["", "a", "é ✓", '"', "\\", "\n\t", "\u0001", "x" * rng.randrange(90), "]},[{:", "\\\"" * 5,
                           "日本語" * rng.randrange(30)])
    if kind == 1:
        return rng.choice([0, -1, 7, 10**30, -(10**20), 1.5, -0.25, 1e100, 2.5e-8, 10**rng.randrange(80)])
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
    got = check(text, keep)
    assert got is not None and got[3] == len(text) and got[0] == len(elements)
    # Each end found is where the elements written so far end: the text up to it, closed, parses to those elements.
    for i, end in enumerate(got[1]):
        assert json.loads(text[:end] + b"]") == elements[: i + 1]
    if elements:
        assert json.loads(text[: got[2]] + b"]") == elements
    # Damage: one byte changed, inserted or deleted; the verdict and offsets are the exact path's, and a text that
    # is JSON is always vouched for.
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
        result = check(damaged, keep)
        if is_json(damaged):
            assert result is not None


def test_pieces_split_utf8_numbers_and_the_end() -> None:
    """Multi-byte characters, big integers and literals split between pieces, the array's end in the last piece."""
    rng = random.Random(77)
    big = b"-" + b"9" * 300 + b".5e-300"
    text = b'[{"t":"\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80 \\u00e9\\"\\\\"},' + big + b",true,null,false," + big + b"]"
    got = check(text, keep=10, every_byte=True)
    assert got is not None and got[0] == 6 and got[3] == len(text)
    for cut in range(1, len(text)):
        assert scan([text[:cut], text[cut:]], 10) == got
        assert scan([text[:cut], text[cut:] + b"  \n"], 10) == got
        assert scan([text[:cut], text[cut:-1]], 10) is None  # the ']' missing
        assert scan([text[:cut], text[cut:], b"x"], 10) is None  # data after the end
    assert scan([text, b""], 10) == got and scan([b"", text], 10) == got
    for _ in range(200):
        points = sorted({rng.randrange(len(text)) for _ in range(rng.randrange(1, 40))})
        assert scan([text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)], 10) == got


def test_nesting_limit(simd: str) -> None:
    for depth, readable in ((511, True), (512, True), (513, False), (100_000, False)):
        text = b"[" + b"[" * depth + b"]" * depth + b"]"
        assert (scan(text) is not None) == readable
        assert (scan([text[i : i + 1000] for i in range(0, len(text), 1000)]) is not None) == readable
        text = b"[" + b'{"a":' * depth + b"1" + b"}" * depth + b"]"
        assert (scan(text) is not None) == readable
    # In the top-level object: a member's value counts from itself; a member's array, read element by element,
    # from its elements (as the exact path counts the array named ``cards``).
    for depth, readable in ((512, True), (513, False)):
        for value in (b'{"k":' * depth + b"1" + b"}" * depth, b"[" * (depth + 1) + b"]" * (depth + 1)):
            scanner = _jsonscan.Scanner(0)
            scanner.feed(b'{"a":' + value + b"}")
            assert (scanner.finish() is not None) == readable


def test_no_object_per_element() -> None:
    """Memory does not grow with the array: only the first ``keep`` ends are kept."""
    text = b"[" + b",".join([b'{"a":[1,2,"x"]}'] * 200_000) + b"]"
    pieces = [text[i : i + 65536] for i in range(0, len(text), 65536)]
    tracemalloc.start()
    try:
        got = scan(pieces, keep=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is not None and got[0] == 200_000 and len(got[1]) == 10
    assert peak < 16 * 1024  # against 3 MB of text in 49 pieces, and 200,000 elements


def test_a_large_feed_lets_other_threads_run() -> None:
    """A feed of 1 MiB or more reads without the GIL: another thread runs meanwhile, and a second use of the same
    scanner from that thread is refused (not interleaved)."""
    text = b"[" + b",".join([b'{"a":"' + b"x" * 200 + b'"}'] * 60_000) + b"]"
    scanner = _jsonscan.Scanner(0, top_array=True)
    seen: list[str] = []

    def other() -> None:
        while not done.is_set():
            try:
                scanner.feed(b" ")
            except RuntimeError:
                seen.append("busy")
                return

    done = threading.Event()
    thread = threading.Thread(target=other)
    thread.start()
    try:
        for _ in range(20):
            if seen:
                break
            fresh = _jsonscan.Scanner(0, top_array=True)
            scanner = fresh
            assert fresh.feed(text)
    finally:
        done.set()
        thread.join()
    assert seen == ["busy"]
