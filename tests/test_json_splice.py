"""json_splice: results equal a parse-and-edit with json.loads; untouched parts stay byte for byte."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gateway.policies.board_cards import json_splice
from gateway.policies.board_cards.json_splice import NotJSON, drop, scan, truncate
from tests.json_testlib import MESSAGE, MUTATIONS, Writer, card_array_document, layout_fields


def pairs(text: bytes) -> Any:
    """json.loads that keeps key order and duplicates visible, and numbers as written."""
    return json.loads(text, object_pairs_hook=list, parse_float=str, parse_int=str)


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


# The native path (the compiled scanner) against the exact element-by-element path on the same text.


def _pieces(body: bytes, keep: int) -> list[list[bytes]]:
    """The body cut into pieces: 64 bytes (the scanner's blocks), 63 and 65, random sizes, and at every byte when
    short."""
    rng = random.Random(len(body) * 131 + keep)
    out = [[body[i : i + size] for i in range(0, len(body), size)] for size in (63, 64, 65, 1 + rng.randrange(300))]
    points = sorted(rng.sample(range(len(body) + 1), min(len(body) + 1, rng.randrange(1, 8))))
    out.append([body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)])
    if len(body) <= 400:
        out.append([body[i : i + 1] for i in range(len(body))])
    return out


def _scan_paths(
    monkeypatch: pytest.MonkeyPatch, body: bytes, keep: int, extra_key: str | None = MESSAGE[0]
) -> tuple[Any, Any, bool]:
    """(exact result, result with the native scanner, whether it vouched); a result is a Layout's fields or
    'NotJSON'. The exact run has the native scanner off. The native one is also run on the body fed in pieces (as
    ``Reader`` reads it while it arrives), which must give the same result."""
    used: list[bool] = []
    original = json_splice._native_layout

    def spy(*args: Any) -> Any:
        out = original(*args)
        used.append(out is not None)
        return out

    def run(text: bytes | json_splice.Pieces) -> Any:
        try:
            return layout_fields(scan(text, "cards", keep=keep, extra_key=extra_key))
        except NotJSON:
            return "NotJSON"

    with monkeypatch.context() as m:
        m.setattr(json_splice, "_Scanner", None)
        exact = run(body)
        assert run(json_splice.Pieces([body[:7], body[7:]])) == exact
    with monkeypatch.context() as m:
        m.setattr(json_splice, "_native_layout", spy)
        other = run(body)
        vouched = any(used)
        for pieces in _pieces(body, keep):
            used.clear()
            assert run(json_splice.Pieces(pieces)) == other and any(used) == vouched, [len(p) for p in pieces][:20]
    return exact, other, vouched


@pytest.mark.parametrize("seed", range(300))
def test_native_path_reads_arrays_of_containers(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(4000 + seed)
    writer = Writer(rng, pretty=seed % 3 == 1)
    body = card_array_document(rng, writer, rng.choice([2, 3, 6, 20]), rng.randrange(0, 6))
    keep = rng.randrange(0, 3)
    exact, native, used = _scan_paths(monkeypatch, body, keep)
    assert exact != "NotJSON"
    assert native == exact and used
    layout = scan(body, "cards", keep=keep, extra_key=MESSAGE[0])
    original = pairs(body)
    assert pairs(truncate(body, layout, keep)) == [(k, v[:keep] if k == "cards" else v) for k, v in original]
    assert pairs(drop(body, layout)) == [(k, v) for k, v in original if k != "cards"]


@pytest.mark.parametrize(
    "tail",
    [
        b"}",
        b',"after":"]"}',
        b',"after":"],\\"x\\":1}"}',
        b',"after":[1,[2],{"a":"]"}],"z":{"b":[]}}',
        b',"a]":"]}","b]":["]"]}',
        b',"after":[],"more":[[]]}  \n',
        b',"s":"\\\\","t":"\\\\\\"]"}',
    ],
)
def test_native_path_finds_the_end_of_the_array(monkeypatch: pytest.MonkeyPatch, tail: bytes) -> None:
    cards = b",".join(b'{"id":%d,"t":"a]b\\"],\\\\","x":[[1],{"y":"]"}]}' % i for i in range(6))
    body = b'{"before":["]"],"cards":[' + cards + b"]" + tail
    exact, native, used = _scan_paths(monkeypatch, body, 2)
    assert used and native == exact and exact[3] == 6
    layout = scan(body, "cards", keep=2)
    assert json.loads(drop(body, layout)) == {k: v for k, v in json.loads(body).items() if k != "cards"}


@pytest.mark.parametrize(
    "body",
    [
        # Strings after the first element: raw control characters, unterminated, escaped closing quote.
        b'{"cards":[{},{"a":"a\nb"}]}', b'{"cards":[{},{"a":"a\tb"}]}', b'{"cards":[{},{"a":"\x01"}]}',
        b'{"cards":[{},{"a":"x}]}', b'{"cards":[{},{"a":"x\\"}]}', b'{"cards":[{},{"a":"\\\\\\"}]}',
        # Brackets: unbalanced, mismatched kinds, nothing closes the array.
        b'{"cards":[{},{"a":[}]}', b'{"cards":[{},{"a":1]]}', b'{"cards":[{},[}]}', b'{"cards":[{},{}}',
        b'{"cards":[{},{}', b'{"cards":[{},{}]',
        # Backslashes outside strings; separators; scalars between the elements.
        b'{"cards":[{},{"a":\\"x\\"}]}', b'{"cards":[{},{"a":1\\n}]}', b'{"cards":[{},,{}]}',
        b'{"cards":[{},{},]}', b'{"cards":[{},{}{}]}', b'{"cards":[{},1 2,{}]}', b'{"cards":[{},tru,{}]}',
        # After the array: strict, as everywhere at the top level.
        b'{"cards":[{},{}],}', b'{"cards":[{},{}]"x":1}', b'{"cards":[{},{}],"cards":[]}',
        b'{"cards":[{},{}],"m":1,"m":2,"cards_deprecation_message":1,"cards_deprecation_message":2}',
        b'{"cards":[{},{}]} x', b'{"cards":[{},{}]}}', b'{"cards":[{},{}],"x":[1}',
        # Stray scalar text next to an element, escape letters in elements after the first.
        b'{"a":1,"cards":[{"k":1},{"k":2} x,{"k":3}],"z":2}', b'{"a":1,"cards":[{"k":1},{"k":2},"s"{"k":3}],"z":2}',
        b'{"a":1,"cards":[{"k":1},{"k":"\\x"},{"k":"\\u12"}],"z":2}',
        b'{"a":1,"cards":[{"k":1},{"k":"\\u12G4\\\\"},{"k":3}],"z":2}',
    ],
)
def test_native_path_refuses_what_the_exact_path_refuses(monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    exact, native, _ = _scan_paths(monkeypatch, body, 1)
    assert exact == native == "NotJSON"


def test_a_member_name_that_is_not_utf8_is_still_a_name() -> None:
    # An escaped name is decoded like a plain one (it used to raise UnicodeDecodeError, not NotJSON).
    layout = scan(b'{"a\\n\xff":1,"b\xff":2,"cards":[1,2]}', "cards", keep=1)
    assert [m.key for m in layout.members] == ["a\n\udcff", "b\udcff", "cards"]
    assert layout.count == 2


# The native path (the compiled scanner, gateway/policies/board_cards/_jsonscan.c, reads the whole text): whatever it
# does not vouch for goes to the exact path; its result must always be the exact path's.
# tests/test_jsonscan.py checks the scanner's grammar on its own.


def _scan_native(monkeypatch: pytest.MonkeyPatch, body: bytes, keep: int) -> tuple[Any, Any, bool]:
    return _scan_paths(monkeypatch, body, keep)


def _damaged(rng: random.Random, pretty: bool) -> bytes:
    body = bytearray(card_array_document(rng, Writer(rng, pretty), rng.choice([3, 5, 8]), rng.randrange(0, 6)))
    for _ in range(rng.choice([1, 1, 2, 3])):
        at = rng.randrange(0, len(body) + 1)
        r = rng.random()
        if r < 0.25 and at < len(body):
            del body[at : at + rng.randrange(1, 3)]
        elif r < 0.35 and at < len(body):
            body[at] = rng.randrange(256)
        else:
            body[at:at] = rng.choice(MUTATIONS)
    return bytes(body)


def _large_board(cards: int, **fields: Any) -> bytes:
    from tests.board_fixtures import board_dict

    board = board_dict(cards, padding=200)
    board.update(fields)
    return json.dumps(board, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("seed", range(300))
def test_native_path_equals_the_exact_path_on_random_documents(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(6000 + seed)
    pretty = seed % 3 == 1
    writer = Writer(rng, pretty=pretty)
    body = writer.document(rng.choice([0, 1, 2, 3, 5, 8, 13]), rng.randrange(0, 6))
    keep = rng.randrange(0, 6)
    exact, native, used = _scan_native(monkeypatch, body, keep)
    assert exact != "NotJSON"
    assert native == exact
    # Valid text, with an array of cards or not: always read natively.
    assert used


@pytest.mark.parametrize("seed", range(600))
def test_native_path_on_damaged_documents(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Damage anywhere: the native path answers exactly as the exact path (it vouches for JSON only)."""
    rng = random.Random(7000 + seed)
    data = _damaged(rng, seed % 3 == 1)
    keep = rng.randrange(0, 3)
    exact, native, used = _scan_native(monkeypatch, data, keep)
    assert native == exact
    # It reads exactly the exact path's language: whatever the exact path accepts, the native path vouched for.
    assert used == (exact != "NotJSON")


@pytest.mark.parametrize(
    "body",
    [
        # A second member of the same name: the native path reads the first; the scan after it finds the second.
        b'{"cards":[{"a":1},{"b":2}],"x":1,"cards":[{"a":1}]}',
        b'{"cards":[{"a":1}],"cards":[{"a":1}]}',
        b'{"cards":[1,2],"x":[3],"cards":[1,2,3,4,5,6,7]}',
        b'{"cards":[[1],[2]],"t":[[1],[2]],"cards":[[1],[2],"t"]}',
    ],
)
def test_native_path_with_a_repeated_member(monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    # The native scanner reads the text; the repeated name is left to the exact path, which says why it refuses.
    exact, native, used = _scan_native(monkeypatch, body, 1)
    assert exact == native == "NotJSON" and not used


def test_native_path_whitespace_and_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whitespace anywhere, inside the array or not: read natively, with the exact path's offsets.
    for body in (b'{"cards":[ {"a":1},{"b":2}]}', b'{"cards":[{"a":1} ,{"b":2}]}', b'{"cards":[{"a":1},{"b":2} ]}',
                 b'{"cards":[{"a":1},\n{"b":2}],"z":[1]}', b'{"cards":[ ]}', b'{"cards":[\t]  }',
                 b'{ "cards" : [ { "a" : 1 } ,\r\n { "b" : [ 2 , 3 ] } ] , "z" : 1 }', b'{"cards":[]}',
                 b'{"cards":[1]}'):
        exact, native, used = _scan_native(monkeypatch, body, 1)
        assert used and native == exact != "NotJSON"
    members = _members_of
    assert members(b'{"cards":[1,2]}', 1) == [(1, 8, 9, 14, (2, [11], 13, 14))]
    assert members(b'{"x":[1,3],"cards":[1,2]}', 2) == [(1, 4, 5, 10, (2, [7, 9], 9, 10)),
                                                       (11, 18, 19, 24, (2, [21, 23], 23, 24))]
    assert members(b'{"cards":[1 2],"x":"]"}', 1) == [(1, 8, 9, 14, False), (15, 18, 19, 22, None)]


def _members_of(body: bytes, keep: int) -> Any:
    from gateway.policies.board_cards._jsonscan import Scanner

    scanner = Scanner(keep)
    scanner.feed(body)
    return scanner.finish()


def test_native_path_checks_every_element(monkeypatch: pytest.MonkeyPatch) -> None:
    """Escape letters and stray scalars in the elements after the first ones: the native path refuses them, so the
    text goes to the exact path, which refuses it too."""
    for body in (b'{"a":1,"cards":[{"k":1},{"k":2} x,{"k":3}],"z":2}',
                 b'{"a":1,"cards":[{"k":1},{"k":"\\x"},{"k":"\\u12"}],"z":2}'):
        exact, native, used = _scan_native(monkeypatch, body, 1)
        assert exact == native == "NotJSON" and not used
    # A misspelt literal inside an element: the exact path does not read scalars inside nested values (it checks
    # strings and brackets there), and neither does the native one: both read the body, with the same layout.
    for body in (b'{"a":1,"cards":[{"k":1},{"k":tru},{"k":3}],"z":2}', b'{"cards":[{"k" 1,,},[1 2]],"z":{"q"}}'):
        exact, native, used = _scan_native(monkeypatch, body, 1)
        assert native == exact != "NotJSON" and used


def test_a_body_the_native_path_refuses_is_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad escape letter in a late card of a large board: the body does not parse and passes through, with the
    native scanner built or not (the exact path checks every element)."""
    body = _large_board(400)
    at = body.index(b'"title":"', len(body) // 2) + len(b'"title":"')
    body = body[:at] + b"\\x" + body[at:]
    with pytest.raises(NotJSON):
        scan(body, "cards", keep=100)
    monkeypatch.setattr(json_splice, "_Scanner", None)
    with pytest.raises(NotJSON):
        scan(body, "cards", keep=100)


def test_native_path_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The native path reads values nested up to 512 levels (the exact path's limit), and leaves deeper ones to the
    exact path, whose answer stands (it skips the innermost shallow levels in one go, so it reads a few more)."""
    card = b'{"title":"' + b"x" * 200 + b'"}'
    for depth, native_reads in ((511, True), (512, True), (513, False), (600, False), (100_000, False)):
        body = b'{"cards":[' + card + b"," + b"[" * depth + b"]" * depth + b'],"z":1}'
        exact, native, used = _scan_native(monkeypatch, body, 1)
        assert native == exact and used == native_reads
        assert (exact == "NotJSON") == (depth >= 600)
        if exact != "NotJSON":
            layout = json_splice.scan(body, "cards", keep=1)
            assert layout.count == 2 and json.loads(drop(body, layout)) == {"z": 1}
            assert json.loads(truncate(body, layout, 1)) == {"cards": [{"title": "x" * 200}], "z": 1}


def test_native_path_reads_arrays_of_small_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    """No object is made per element, so arrays of tiny elements are read natively too."""
    small = b'{"cards":[' + b",".join(b"%d" % i for i in range(5000)) + b'],"z":1}'
    exact, native, used = _scan_native(monkeypatch, small, 100)
    assert used and native == exact and exact[3] == 5000


def test_native_path_reads_a_large_board_faithfully(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _large_board(400, note="✓ \U0001F680 \\ \"")
    # Numbers as written, which a parse and re-serialise would change: a big integer, a float with trailing zeros.
    body = body.replace(b'"cards":[{', b'"cards":[{"big":1' + b"0" * 40 + b',"f":1.500e-3,', 1)
    body = body.replace(b'},{"id"', b'},{"big":-1' + b"0" * 30 + b',"id"', 150)
    exact, native, used = _scan_native(monkeypatch, body, 100)
    assert used and native == exact and native[3] == 400
    layout = scan(body, "cards", keep=100, extra_key=MESSAGE[0])  # the thresholds as shipped
    assert layout_fields(layout) == exact
    original = pairs(body)
    capped = truncate(body, layout, 100, MESSAGE)
    assert cards_of(pairs(capped)) == cards_of(original)[:100]
    assert capped.startswith(body[: layout.element_ends[99]])  # the upstream's bytes, up to the cut
    assert layout.target is not None
    assert capped.endswith(body[layout.members[layout.target].end :])
    assert body[layout.last_element_end : layout.members[layout.target].end] == b"]"
    assert b'"big":1' + b"0" * 40 + b',"f":1.500e-3,' in capped
    dropped = drop(body, layout)
    assert pairs(dropped) == [(k, v) for k, v in original if k != "cards"]


# A body as the pieces it arrived in (``Pieces``), and its scan while it arrives (``Reader``).


@pytest.mark.parametrize("seed", range(40))
def test_pieces_read_like_the_joined_body(seed: int) -> None:
    rng = random.Random(8000 + seed)
    body = _large_board(rng.choice([1, 3, 20]))
    points = sorted(rng.sample(range(1, len(body)), rng.randrange(0, 30)))
    pieces = json_splice.Pieces([body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)])
    assert len(pieces) == len(body)
    for _ in range(50):
        a = rng.randrange(0, len(body) + 10)
        b = rng.randrange(a, len(body) + 20)
        assert pieces.slice(a, b) == body[a:b]
        assert pieces.matches(a, body[a:b]) == (a <= len(body))
        if a < b <= len(body):
            assert not pieces.matches(a, body[a:b - 1] + bytes([body[b - 1] ^ 1]))
    other = json_splice.Pieces([body[i : i + 1000] for i in range(0, len(body), 1000)])
    assert pieces == other == body and pieces != body[:-1] and pieces != json_splice.Pieces([body, b" "])
    assert pieces != json_splice.Pieces([body[:-1] + b"}"[:0] + bytes([body[-1] ^ 1])])
    # The edits read the same bytes from the pieces as from the joined body.
    layout = scan(pieces, "cards", keep=1, extra_key=MESSAGE[0])
    assert layout_fields(layout) == layout_fields(scan(body, "cards", keep=1, extra_key=MESSAGE[0]))
    assert truncate(pieces, layout, 1, MESSAGE) == truncate(body, layout, 1, MESSAGE)
    assert drop(pieces, layout, MESSAGE) == drop(body, layout, MESSAGE)
    assert json_splice.set_member(pieces, layout, "x", b"[1]", before="cards", remove=("id",)) == \
        json_splice.set_member(body, layout, "x", b"[1]", before="cards", remove=("id",))
    assert bytes(pieces) == body and pieces.pieces == (body,)  # joined once, and only the joined copy kept


class _CountingScanner:
    """The native scanner, counting the bytes it is fed."""

    fed = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner = _REAL_SCANNER(*args, **kwargs)

    def feed(self, data: bytes) -> bool:
        _CountingScanner.fed += len(data)
        return bool(self._inner.feed(data))

    def finish(self) -> Any:
        return self._inner.finish()


_REAL_SCANNER: Any = json_splice._Scanner


def _cut(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def test_reader_compares_with_the_earlier_body_before_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_splice, "_Scanner", _CountingScanner)
    body = _large_board(60)
    earlier = json_splice.Pieces(_cut(body, 4096))
    want = layout_fields(scan(body, "cards", keep=5, extra_key=MESSAGE[0]))

    def read(pieces: list[bytes], same_as: Any) -> tuple[json_splice.Reader, int]:
        _CountingScanner.fed = 0
        reader = json_splice.Reader("cards", keep=5, extra_key=MESSAGE[0], same_as=same_as)
        for piece in pieces:
            reader.feed(piece)
        return reader, _CountingScanner.fed

    # The same bytes, cut differently: equal, and never read.
    for same_as in (earlier, body):
        reader, fed = read(_cut(body, 1000), same_as)
        assert reader.same and fed == 0 and reader.body == body
    # Different bytes: early, in the last piece, a longer or a shorter body: read whole, the same layout as a scan.
    assert body.endswith(b"false}")
    late = body[:-6] + b"true }"
    for other in (body.replace(b'"id":2,', b'"id":3,', 1), late, body + b" ", body[:-1], body[:100]):
        reader, fed = read(_cut(other, 777), earlier)
        assert not reader.same
        got: Any
        expected: Any
        try:
            got = layout_fields(reader.layout())
        except NotJSON:
            got = "NotJSON"
        try:
            expected = layout_fields(scan(other, "cards", keep=5, extra_key=MESSAGE[0]))
        except NotJSON:
            expected = "NotJSON"
        assert got == expected and reader.body == other
    reader, fed = read(_cut(late, 777), earlier)
    assert fed == len(late) and layout_fields(reader.layout())[2:] == want[2:]  # read whole: the difference was last
    # No earlier body: read as it comes.
    reader, fed = read(_cut(body, 999), None)
    assert not reader.same and fed == len(body) and layout_fields(reader.layout()) == want


def test_reader_without_the_native_scanner(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _large_board(30)
    want = layout_fields(scan(body, "cards", keep=3, extra_key=MESSAGE[0]))
    monkeypatch.setattr(json_splice, "_Scanner", None)
    reader = json_splice.Reader("cards", keep=3, extra_key=MESSAGE[0], same_as=body[:-1] + b" ")
    for piece in _cut(body, 500):
        reader.feed(piece)
    assert not reader.same and layout_fields(reader.layout()) == want
    reader = json_splice.Reader("cards", keep=3)
    for piece in _cut(body[:-1], 500):
        reader.feed(piece)
    with pytest.raises(NotJSON):
        reader.layout()
