"""A long differential fuzz of the C scanner against json_splice's exact path (not collected by pytest: run it).

    .venv/bin/python -m tests.fuzz_jsonscan [--cases 200000] [--seed 1]

Each case is a random board-like document (tests/json_testlib.py's writers: random whitespace, escapes, unicode,
big numbers, nesting), damaged or not (bytes changed, inserted, deleted: quotes, backslashes, brackets, escapes,
control characters, UTF-8 pieces), fed to the native scanner in random pieces with a random SIMD variant, and
compared with the exact path: the same layout or the same refusal, and the native path vouches exactly when the
exact path accepts. Every tenth case also reads a bare array (top_array, as ``array_elements`` does). It stops at the
first disagreement and prints the case.

Under AddressSanitizer (out-of-bounds reads of the pieces, of the scanner's own buffers):

    gcc -shared -fPIC -O1 -g -fsanitize=address -fno-omit-frame-pointer -I"$(python -c 'import sysconfig;
        print(sysconfig.get_paths()["include"])')" gateway/policies/board_cards/_jsonscan.c -o /tmp/asan/_jsonscan.so
    then run this module with that build in place of the package's, PYTHONMALLOC=malloc (so that ASan sees where each
    bytes object ends), LD_PRELOAD=$(gcc -print-file-name=libasan.so) and ASAN_OPTIONS=detect_leaks=0.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from gateway.policies.board_cards import _jsonscan, json_splice
from tests.json_testlib import MESSAGE, MUTATIONS, Writer, card_array_document, exact_top_array, layout_fields

VARIANTS = [name for name in ("avx2", "sse2", "none") if _jsonscan.use_simd(name)]
_EXTRA = [b"\xe6\x97\xa5", b"\xf0\x9f", b"\\u00", b"\\\\\\", b'\\"\\"', b"]}", b"[{", b"1e", b"-", b"tru", b"0.",
          b"\t", b"\x7f", b"\xff"]


def _exact(body: bytes, keep: int) -> Any:
    try:
        return layout_fields(json_splice._scan_exact(body, "cards", keep=keep, extra_key=MESSAGE[0]))
    except json_splice.NotJSON:
        return "NotJSON"


def _native(body: bytes, keep: int, pieces: list[bytes]) -> tuple[Any, bool]:
    reader = json_splice.Reader("cards", keep=keep, extra_key=MESSAGE[0])
    for piece in pieces:
        reader.feed(piece)
    vouched: list[bool] = []
    original = json_splice._native_layout

    def spy(*args: Any) -> Any:
        out = original(*args)
        vouched.append(out is not None)
        return out

    json_splice._native_layout = spy  # type: ignore[assignment]
    got: Any
    try:
        try:
            got = layout_fields(reader.layout(body))
        except json_splice.NotJSON:
            got = "NotJSON"
    finally:
        json_splice._native_layout = original
    return got, any(vouched)


def _cut(rng: random.Random, body: bytes) -> list[bytes]:
    kind = rng.randrange(4)
    if kind == 0:
        return [body]
    if kind == 1:
        size = rng.choice([1, 2, 3, 7, 63, 64, 65, 100])
        return [body[i : i + size] for i in range(0, len(body), size)]
    points = sorted(rng.sample(range(len(body) + 1), min(len(body) + 1, rng.randrange(1, 12))))
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


def _damage(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        at = rng.randrange(0, len(data) + 1)
        r = rng.random()
        if r < 0.25 and at < len(data):
            del data[at : at + rng.randrange(1, 3)]
        elif r < 0.35 and at < len(data):
            data[at] = rng.randrange(256)
        else:
            data[at:at] = rng.choice(MUTATIONS + _EXTRA)
    return bytes(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    start = time.monotonic()
    accepted = 0
    for case in range(args.cases):
        _jsonscan.use_simd(rng.choice(VARIANTS))
        writer = Writer(rng, pretty=rng.random() < 0.4)
        if rng.random() < 0.7:
            body = card_array_document(rng, writer, rng.choice([1, 2, 3, 5, 8]), rng.randrange(0, 6))
        else:
            body = writer.document(rng.choice([None, 0, 1, 3]), rng.randrange(0, 6))
        body = _damage(rng, body)
        keep = rng.randrange(0, 4)
        exact = _exact(body, keep)
        native, vouched = _native(body, keep, _cut(rng, body))
        if native != exact or vouched != (exact != "NotJSON"):
            print(f"case {case}: disagreement\nbody={body!r}\nkeep={keep}\nexact={exact}\nnative={native}\n"
                  f"vouched={vouched} simd={_jsonscan.simd()}")
            return 1
        accepted += exact != "NotJSON"
        if case % 10 == 0:
            # The document as an element of a bare array (read loosely inside, as the exact path reads it).
            text = _damage(rng, b" [" + body + b"," + rng.choice([b"1", b' "s" ', b"-0.5e+3", body]) + b"]\n")
            scanner = _jsonscan.Scanner(keep, top_array=True)
            for piece in _cut(rng, text):
                scanner.feed(piece)
            got, want = scanner.finish(), exact_top_array(text, keep)
            if got != want:
                print(f"case {case}: top-level array disagreement\ntext={text!r}\nkeep={keep}\nexact={want}\n"
                      f"native={got}")
                return 1
        if case and case % 50_000 == 0:
            print(f"  {case} cases, {accepted} accepted, {time.monotonic() - start:.0f} s", flush=True)
    print(f"{args.cases} cases ({accepted} accepted by the exact path), no disagreement, "
          f"{time.monotonic() - start:.0f} s; variants {', '.join(VARIANTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
