"""Byte-level editing of one member of a JSON object, without re-serialising anything else.

``scan`` reads the top level of a JSON text whose value is an object and records where each member starts and
ends; for one named member whose value is an array it also records where each element ends. ``truncate`` and
``drop`` then cut the raw bytes at those offsets, so everything that is kept (key order, whitespace, unicode and
escapes, integers of any size, floats as written) stays byte for byte what the upstream sent.

What is checked ("JSON enough to be safe" for cutting): the top level strictly (one object, string keys, colons,
commas, scalars by the JSON grammar, nothing but whitespace after it); inside nested values, that strings are closed
with valid escapes and no raw control characters, and that brackets balance with matching kinds. A text that fails
these checks raises ``NotJSON``; the caller passes it through untouched.

Speed: the array is read natively first (``_native_array``): a small C module built with the package checks it
by the whole JSON grammar and records the same offsets, at about 0.4 ns a byte (about 7 times faster than the
bulk path below, 20 times the exact path). Whatever it cannot vouch for goes on to the paths below, which give the
answer, so the result is the same either way; without the compiled module, they read every array.

Otherwise nested values are skipped by one precompiled regular expression per value (nesting up to ``_FAST_DEPTH``
levels in the pattern, deeper values by an explicit stack), so Python runs once per top-level member and once per
array element, not once per token. The regex engine still visits every byte of every string (about 7 ns a byte), so
where the native scanner is not built and at least ``_FAST_MIN_BYTES`` of the text follow the first ``keep``
elements of the array (at least one), the rest of the array is read in bulk instead (``_rest_of_array``): whole-text
byte operations reduce it to its skeleton outside strings, and one regex pass over that skeleton checks and counts
the elements. Whatever that reading cannot vouch for (an element that is not an object or array, nesting deeper than
``_SKEL_DEPTH``, a control character outside strings, a long tail after the array, anything malformed) sends the
scan back to the exact path, which then gives the answer, so for valid JSON the result is the same either way.

What the bulk reading does not check, in the elements it skips (after the first ``keep``, and its comma): escape
letters (``"\\x"`` or ``"\\u12"`` there pass, ``\\"`` and ``\\\\`` are read exactly), and scalar text next to an
element without a comma (``{} 1``, ``{} "s"``). The exact path refuses such a text. Nothing of that is kept: the
members, the first ``keep`` elements and everything after the array are read exactly as before, so a cut text is
JSON whenever its kept parts are. The native path checks all of it (it only vouches for JSON; a text it refuses goes
to the exact path, never to the bulk reading), and reads nesting as deep as the exact path (``_MAX_DEPTH`` levels;
deeper values it leaves to the exact path, whose answer stands).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_ArrayScan = Callable[[bytes, int, int], "tuple[int, int, list[int], int] | None"]
_native_scan: _ArrayScan | None
try:
    from ._jsonscan import scan_array as _native_scan
except ImportError:  # not built (no C compiler at install): the Python paths give the same answers, more slowly
    _native_scan = None
NATIVE = _native_scan is not None  # whether the compiled scanner is there (board_cards warns when it is not)

__all__ = ("Layout", "Member", "NotJSON", "drop", "scan", "splice", "truncate")


class NotJSON(ValueError):
    """The body is not a JSON object this module can edit safely; ``str()`` says why, never with the body."""


@dataclass(frozen=True, slots=True)
class Member:
    key: str
    start: int  # offset of the key's opening quote
    value_start: int
    end: int  # offset just after the value


@dataclass(frozen=True, slots=True)
class Layout:
    """Where things are in one scanned body."""

    size: int
    members: tuple[Member, ...]
    target: int | None  # index in ``members`` of the array member being edited, None when absent
    count: int  # elements in that array (0 when absent or not an array)
    is_array: bool
    element_ends: tuple[int, ...]  # offset just after each of the first ``keep`` elements
    last_element_end: int  # offset just after the last element (just after '[' when empty)
    extra: int | None  # index of the member named ``extra_key`` if the upstream already sent one

    @property
    def target_member(self) -> Member | None:
        return None if self.target is None else self.members[self.target]


_WS = re.compile(rb"[ \t\r\n]*+")
_KEY = re.compile(rb'"[^"\\\x00-\x1f]*+(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*+)*+"')
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][+-]?[0-9]++)?|true|false|null|" + _KEY.pattern)
# Inside nested values: runs of anything but quotes and brackets, and well-formed strings.
_FLAT = (
    rb'[^"\[\]{}\\]*+(?:"[^"\\\x00-\x1f]*+(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*+)*+"[^"\[\]{}\\]*+)*+'
)
_FAST_DEPTH = 6


def _nested(depth: int) -> bytes:
    inner = _FLAT
    for _ in range(depth):
        inner = _FLAT + rb"(?:(?:\[" + inner + rb"\]|\{" + inner + rb"\})" + _FLAT + rb")*+"
    return inner


_COMPOSITE = re.compile(rb"\[" + _nested(_FAST_DEPTH - 1) + rb"\]|\{" + _nested(_FAST_DEPTH - 1) + rb"\}")
_FLAT_RE = re.compile(_FLAT)
_CLOSER = {0x5B: 0x5D, 0x7B: 0x7D}  # '[' -> ']', '{' -> '}'
_MAX_DEPTH = 512


def _skip_deep(body: bytes, pos: int) -> int:
    """Skip a composite value nested deeper than the fast pattern handles, with an explicit stack."""
    stack: list[int] = []
    n = len(body)
    flat = _FLAT_RE.match
    composite = _COMPOSITE.match
    while True:
        c = body[pos] if pos < n else -1
        if c in (0x5B, 0x7B):
            m = composite(body, pos) if stack else None
            if m is not None:
                # A shallow enough value inside the deep one: skipped in one go.
                pos = m.end()
                m = flat(body, pos)
                assert m is not None
                pos = m.end()
                continue
            stack.append(_CLOSER[c])
            if len(stack) > _MAX_DEPTH:
                raise NotJSON("nesting too deep")
            pos += 1
        elif c in (0x5D, 0x7D):
            if not stack or stack.pop() != c:
                raise NotJSON(f"unbalanced bracket at offset {pos}")
            pos += 1
            if not stack:
                return pos
        else:
            raise NotJSON(f"invalid string or unexpected end at offset {pos}")
        m = flat(body, pos)
        assert m is not None  # the pattern matches the empty string
        pos = m.end()


def _skip_value(body: bytes, pos: int) -> int:
    c = body[pos] if pos < len(body) else -1
    if c in (0x5B, 0x7B):
        m = _COMPOSITE.match(body, pos)
        return m.end() if m is not None else _skip_deep(body, pos)
    m = _SCALAR.match(body, pos)
    if m is None:
        raise NotJSON(f"invalid value at offset {pos}")
    return m.end()


def _key_text(raw: bytes) -> str:
    if b"\\" not in raw:
        return raw[1:-1].decode("utf-8", "surrogateescape")
    # Decoded like the plain case: a name that is not UTF-8 is still a name (json.loads of the bytes would raise).
    text: str = json.loads(raw.decode("utf-8", "surrogateescape"))
    return text


def _skip_ws(body: bytes, pos: int) -> int:
    m = _WS.match(body, pos)
    assert m is not None
    return m.end()


def scan(body: bytes, key: str, *, keep: int = 0, extra_key: str | None = None) -> Layout:
    """Scan the top-level object; for member ``key`` (if an array) record the ends of its first ``keep`` elements."""
    n = len(body)
    pos = _skip_ws(body, 0)
    if pos >= n or body[pos] != 0x7B:
        raise NotJSON("the top-level value is not an object")
    pos = _skip_ws(body, pos + 1)
    members: list[Member] = []
    seen: set[str] = set()
    target = extra = None
    count = 0
    is_array = False
    ends: list[int] = []
    last_end = 0
    if pos < n and body[pos] == 0x7D:
        pos += 1
    else:
        while True:
            m = _KEY.match(body, pos)
            if m is None:
                raise NotJSON(f"expected a member name at offset {pos}")
            start = pos
            name = _key_text(m.group())
            if name in seen and name in (key, extra_key):
                raise NotJSON(f"the member {name!r} appears twice")
            seen.add(name)
            pos = _skip_ws(body, m.end())
            if pos >= n or body[pos] != 0x3A:
                raise NotJSON(f"expected ':' at offset {pos}")
            pos = value_start = _skip_ws(body, pos + 1)
            if name == key and pos < n and body[pos] == 0x5B:
                target, is_array = len(members), True
                native = _native_array(body, pos, keep)
                if native is None:
                    native = _scan_array(body, pos, keep)
                pos, count, ends, last_end = native
            else:
                if name == key:
                    target = len(members)
                elif name == extra_key:
                    extra = len(members)
                pos = _skip_value(body, pos)
            members.append(Member(name, start, value_start, pos))
            pos = _skip_ws(body, pos)
            c = body[pos] if pos < n else -1
            if c == 0x2C:
                pos = _skip_ws(body, pos + 1)
            elif c == 0x7D:
                pos += 1
                break
            else:
                raise NotJSON(f"expected ',' or '}}' at offset {pos}")
    if _skip_ws(body, pos) != n:
        raise NotJSON(f"unexpected data after the top-level object at offset {pos}")
    return Layout(n, tuple(members), target, count, is_array, tuple(ends), last_end, extra)


def _scan_array(body: bytes, pos: int, keep: int) -> tuple[int, int, list[int], int]:
    n = len(body)
    pos = _skip_ws(body, pos + 1)
    ends: list[int] = []
    last_end = pos
    if pos < n and body[pos] == 0x5D:
        return pos + 1, 0, ends, last_end
    count = 0
    probe = max(keep, 1)  # after this element and its comma, the rest of a large array may be read in bulk
    skip = _skip_value
    ws = _WS.match
    while True:
        pos = skip(body, pos)
        count += 1
        last_end = pos
        if count <= keep:
            ends.append(pos)
        pos = ws(body, pos).end()  # type: ignore[union-attr]
        c = body[pos] if pos < n else -1
        if c == 0x2C:
            pos = ws(body, pos + 1).end()  # type: ignore[union-attr]
            # The bulk reading stands in for the native scanner where it is not built. Where it is, the text it
            # refused is not JSON (or nests too deep): only the exact path, which checks what bulk skips, may answer.
            if count == probe and n - pos >= _FAST_MIN_BYTES and _native_scan is None:
                rest = _rest_of_array(body, pos)
                if rest is not None:
                    more, last_end, end = rest
                    return end, count + more, ends, last_end
        elif c == 0x5D:
            return pos + 1, count, ends, last_end
        else:
            raise NotJSON(f"expected ',' or ']' at offset {pos}")


# The array, natively: ``gateway.policies.board_cards._jsonscan.scan_array`` (C, built with the package; see its source) reads the whole
# array strictly by the JSON grammar (escape letters, numbers, literals, nesting; not UTF-8, which the Python paths
# do not check either) and returns the same tuple as ``_scan_array``, at about 0.4 ns a byte, making no object per
# element. It vouches for JSON only: for anything else (or nesting deeper than ``_MAX_DEPTH``) it returns None and
# the Python paths below read the array and give the answer, with the reason. Without the compiled module (no C
# compiler where the package was installed) every array goes to the Python paths: the same answers, more slowly.
def _native_array(body: bytes, pos: int, keep: int) -> tuple[int, int, list[int], int] | None:
    """The array starting at ``pos``, read by the compiled scanner; None when it cannot vouch for it."""
    return None if _native_scan is None else _native_scan(body, pos, keep)


# The rest of a large array, in bulk. ``_skeleton`` reduces a text to what lies outside its strings, brackets and
# commas, without a Python step per token: ``\\`` and ``\"`` become one backslash (so every quote left delimits a
# string), ``translate`` keeps quotes, brackets, commas, backslashes and line breaks and turns other control
# characters into NUL, ``replace`` drops adjacent quote pairs (the parity of every other quote is unchanged, and most
# strings vanish: they hold no kept character), and the few quotes left split the text into outside and inside runs.
# About 2-3 ns a byte in all (the escape substitution costs about 0.2 us per escaped quote or backslash).
_FAST_MIN_BYTES = 256 * 1024
_SKEL_DEPTH = 8  # nesting levels of one element checked by the skeleton pattern; deeper: the exact path
_TAIL_TRIES = 64  # closing-bracket candidates tried for the end of the array, from the end of the text
_TAIL_MAX = 64 * 1024  # and no further than this from the end (a longer tail: the exact path)
_SKEL_CHUNK = 1 << 20  # bytes read per step (each step ends just after a quote, so no escape is split)
_QUOTING_ESCAPES = re.compile(rb'\\[\\"]')
_SKEL_KEEP = b'"[]{},\\\t\n\r'
_SKEL_TABLE = bytes(0 if c < 0x20 and c not in b"\t\n\r" else c for c in range(256))
_SKEL_DELETE = bytes(c for c in range(0x20, 256) if c not in _SKEL_KEEP)


def _skeleton_value(depth: int) -> bytes:
    inner = rb",*+"
    for _ in range(depth - 1):
        inner = rb",*+(?:(?:\[" + inner + rb"\]|\{" + inner + rb"\}),*+)*+"
    return rb"\[" + inner + rb"\]|\{" + inner + rb"\}"


_SKEL_VALUE = re.compile(_skeleton_value(_SKEL_DEPTH))


def _skeleton(body: bytes, start: int) -> bytes | None:
    """Brackets and commas outside strings in ``body[start:]`` (``start`` outside any string), in order.

    None when a string is not closed or holds a raw control character, or when there is a control character (other
    than whitespace) or a backslash outside strings. Escape letters are not checked. The text is read in steps of
    about ``_SKEL_CHUNK`` bytes, each ending just after a quote (so no escape is split): smaller copies, in cache.
    """
    n = len(body)
    kept: list[bytes] = []
    view = memoryview(body)
    pos = start
    while pos < n:
        end = body.find(b'"', pos + _SKEL_CHUNK) + 1 if pos + _SKEL_CHUNK < n else n
        if end <= 0:
            end = n
        if body.find(b"\\", pos, end) >= 0:
            chunk = _QUOTING_ESCAPES.sub(b"\\\\", view[pos:end])
        else:
            chunk = body[pos:end]
        kept.append(chunk.translate(_SKEL_TABLE, _SKEL_DELETE).replace(b'""', b""))
        pos = end
    text = b"".join(kept)
    if b"\x00" in text:
        return None  # a control character (in a string, or outside one where only the exact path may allow it)
    runs = text.split(b'"')
    if not len(runs) % 2:
        return None  # a string is not closed
    inside = b"".join(runs[1::2])
    if b"\n" in inside or b"\r" in inside or b"\t" in inside:
        return None  # a raw line break or tab in a string
    outside = b"".join(runs[0::2])
    if b"\\" in outside:
        return None  # a backslash outside a string
    return outside.translate(None, b"\t\n\r")


def _rest_of_array(body: bytes, pos: int) -> tuple[int, int, int] | None:
    """From the element starting at ``pos``: (elements left, end of the last one, offset after the array's ']').

    None when the bulk reading cannot vouch for the answer; the caller then goes on element by element. The
    skeleton from ``pos`` must be ``E`` then ``,E`` for each further element, each an object or array (nested at
    most ``_SKEL_DEPTH`` deep, brackets of matching kinds), then ``]``, then the skeleton of the members after the
    array. The array's closing bracket is then found in the text from its end: the last ``]`` after which the rest
    parses strictly as the end of the top-level object with exactly those members. A ``]`` inside a string cannot
    be followed by that (an odd number of unescaped quotes would follow it), nor a ``]`` inside an element (the
    text after it would close more than one level), nor one closing a later member's value (fewer members follow).
    """
    skeleton = _skeleton(body, pos)
    if skeleton is None:
        return None
    rest, _ = _SKEL_VALUE.subn(b"o", skeleton)
    j = rest.find(b"]")
    if j < 1 or not j % 2 or rest[:j] != b"o" + b",o" * (j // 2):
        return None
    members = rest[j + 1 :]
    n = len(body)
    limit = n
    for _ in range(_TAIL_TRIES):
        close = body.rfind(b"]", pos, limit)
        if close < 0 or n - close > _TAIL_MAX:
            return None
        if _tail_shape(body, close + 1) == members:
            break
        limit = close
    else:
        return None
    last = close
    while body[last - 1] in b" \t\r\n":
        last -= 1
    return j // 2 + 1, last, close + 1


def _tail_shape(body: bytes, pos: int) -> bytes | None:
    """The skeleton of ``(, member)* }`` and nothing after, parsed strictly from ``pos``; None when it does not parse.

    ``,o`` for a member whose value is an object or array, ``,`` for a scalar, then ``}``.
    """
    n = len(body)
    shape: list[bytes] = []
    try:
        pos = _skip_ws(body, pos)
        while True:
            c = body[pos] if pos < n else -1
            if c == 0x7D:
                return b"".join(shape) + b"}" if _skip_ws(body, pos + 1) == n else None
            if c != 0x2C:
                return None
            m = _KEY.match(body, _skip_ws(body, pos + 1))
            if m is None:
                return None
            pos = _skip_ws(body, m.end())
            if pos >= n or body[pos] != 0x3A:
                return None
            pos = _skip_ws(body, pos + 1)
            shape.append(b",o" if pos < n and body[pos] in (0x5B, 0x7B) else b",")
            pos = _skip_ws(body, _skip_value(body, pos))
    except NotJSON:
        return None


def splice(body: bytes, edits: Sequence[tuple[int, int, bytes]]) -> bytes:
    """Replace each ``[start, end)`` by its bytes; edits are sorted and do not overlap."""
    parts: list[bytes] = []
    pos = 0
    for start, end, data in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < pos:
            raise ValueError("overlapping edits")
        parts.append(body[pos:start])
        parts.append(data)
        pos = end
    parts.append(body[pos:])
    return b"".join(parts)


def _member_bytes(name: str, value: bytes) -> bytes:
    return json.dumps(name, ensure_ascii=False).encode() + b":" + value


def _set_extra(layout: Layout, after: int, name: str, value: bytes) -> tuple[int, int, bytes]:
    """An edit that sets member ``name``: its value is replaced if present, else it is inserted at ``after``."""
    if layout.extra is not None:
        member = layout.members[layout.extra]
        return (member.value_start, member.end, value)
    return (after, after, b"," + _member_bytes(name, value))


def truncate(body: bytes, layout: Layout, keep: int, extra: tuple[str, bytes] | None = None) -> bytes:
    """Keep the first ``keep`` elements of the target array (``keep`` <= what was scanned); optionally set a member."""
    member = layout.target_member
    if member is None or not layout.is_array:
        raise ValueError("nothing to truncate")
    if keep > len(layout.element_ends) and keep < layout.count:
        raise ValueError("the layout was scanned with a smaller keep")
    edits: list[tuple[int, int, bytes]] = []
    if keep < layout.count:
        cut = layout.element_ends[keep - 1] if keep > 0 else member.value_start + 1
        edits.append((cut, layout.last_element_end, b""))
    if extra is not None:
        edits.append(_set_extra(layout, member.end, *extra))
    return splice(body, edits)


def drop(body: bytes, layout: Layout, extra: tuple[str, bytes] | None = None) -> bytes:
    """Remove the target member (key and value); optionally set a member (in its place when new)."""
    i = layout.target
    if i is None:
        raise ValueError("nothing to drop")
    members = layout.members
    member = members[i]
    if extra is not None and layout.extra is None:
        return splice(body, [(member.start, member.end, _member_bytes(*extra))])
    edits: list[tuple[int, int, bytes]] = []
    if i + 1 < len(members):
        edits.append((member.start, members[i + 1].start, b""))
    elif i > 0:
        edits.append((members[i - 1].end, member.end, b""))
    else:
        edits.append((member.start, member.end, b""))
    if extra is not None:
        edits.append(_set_extra(layout, member.end, *extra))
    return splice(body, edits)
