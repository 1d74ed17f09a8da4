"""Byte-level editing of one member of a JSON object (the board's ``cards``), without re-serialising anything else:
``scan`` (or ``Reader``, fed a body's pieces as they arrive) records where the top-level members and the named
array's elements end, and ``truncate``/``drop`` cut the raw bytes there. A text that is not JSON enough to be cut
safely raises ``NotJSON``. The native path (``_jsonscan``) and the exact path, what each checks and their speeds:
docs/policies/board_cards.md ("Speed", "The native scanner")."""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ._jsonscan import MemberFound, Scanner

_Scanner: type[Scanner] | None
try:
    from ._jsonscan import Scanner as _Scanner
except ImportError:  # not built (no C compiler at install): the exact path gives the same answers, more slowly
    _Scanner = None
NATIVE = _Scanner is not None  # whether the compiled scanner is there (board_cards warns when it is not)

__all__ = ("Layout", "Member", "NotJSON", "Pieces", "Reader", "TooManyElements", "array_elements", "array_spans",
           "drop", "scan", "set_member", "splice", "truncate")


class NotJSON(ValueError):
    """The body is not a JSON object this module can edit safely; ``str()`` says why, never with the body."""


class TooManyElements(ValueError):
    """``array_spans``: the array has more elements than the caller takes (counted, no span made)."""


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


class Pieces:
    """A body's text kept as the pieces it arrived in, not joined: its length, slices and comparisons read the pieces
    where they are. ``bytes(pieces)`` joins them once (and keeps only the joined copy). A view for reading and
    comparing (the scan, the memo); the body a reply holds and sends is ``core.exchange.Pieces``."""

    __slots__ = ("_pieces", "_starts", "_size")

    def __init__(self, pieces: Sequence[bytes | bytearray] = ()) -> None:
        self._pieces: list[bytes | bytearray] = [piece for piece in pieces if piece]
        self._starts: list[int] = []
        size = 0
        for piece in self._pieces:
            self._starts.append(size)
            size += len(piece)
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        if len(self._pieces) != 1 or not isinstance(self._pieces[0], bytes):
            self._pieces = [b"".join(self._pieces)] if self._size else []
            self._starts = [0] if self._size else []
        return bytes(self._pieces[0]) if self._pieces else b""

    @property
    def pieces(self) -> tuple[bytes | bytearray, ...]:
        return tuple(self._pieces)

    def slice(self, start: int, end: int) -> bytes:
        """``bytes(self)[start:end]`` (offsets within the body), copying only the bytes in the slice."""
        start, end = max(0, min(start, self._size)), max(0, min(end, self._size))
        if end <= start:
            return b""
        i = bisect_right(self._starts, start) - 1
        parts: list[memoryview] = []
        while start < end:
            piece = self._pieces[i]
            offset = start - self._starts[i]
            take = min(len(piece) - offset, end - start)
            if take == len(piece) and isinstance(piece, bytes) and not parts and start + take == end:
                return piece
            parts.append(memoryview(piece)[offset : offset + take])
            start += take
            i += 1
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def matches(self, offset: int, data: bytes | bytearray) -> bool:
        """Whether the body holds ``data`` at ``offset`` (compared in place, no copy)."""
        if offset < 0 or offset + len(data) > self._size:
            return False
        if not data:
            return True
        view = memoryview(data)
        i = bisect_right(self._starts, offset) - 1
        done = 0
        while done < len(data):
            piece = self._pieces[i]
            at = offset + done - self._starts[i]
            take = min(len(piece) - at, len(data) - done)
            if not piece.startswith(view[done : done + take], at):
                return False
            done += take
            i += 1
        return True

    def __eq__(self, other: object) -> bool:
        if isinstance(other, bytes):
            return len(other) == self._size and self.matches(0, other)
        if not isinstance(other, Pieces):
            return NotImplemented
        if other._size != self._size:
            return False
        offset = 0
        for piece in other._pieces:
            if not self.matches(offset, piece):
                return False
            offset += len(piece)
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Pieces: {len(self._pieces)} pieces, {self._size} bytes>"


Text = bytes | Pieces  # a body: whole, or as the pieces it arrived in


def _slice(body: Text, start: int, end: int) -> bytes:
    return body[start:end] if isinstance(body, bytes) else body.slice(start, end)


def _pieces_of(body: Text) -> Sequence[bytes | bytearray]:
    return (body,) if isinstance(body, bytes) else body.pieces


def scan(body: Text, key: str, *, keep: int = 0, extra_key: str | None = None) -> Layout:
    """Scan the top-level object; for member ``key`` (if an array) record the ends of its first ``keep`` elements."""
    reader = Reader(key, keep=keep, extra_key=extra_key)
    for piece in _pieces_of(body):
        reader.feed(piece)
    return reader.layout(body)


class Reader:
    """``scan`` of a body while it arrives: ``feed`` it each piece as it comes (``Reply.read_pieces``), then
    ``layout()``. Each piece is read by the native scanner when it is fed, so a large body is read a piece at a time,
    between the event loop's other work; the pieces are kept as they came (``body``), never joined.

    With ``same_as`` (the body of an earlier scan): while the pieces are equal to it they are only compared, not
    read; a body equal to it byte for byte is never read at all (``same``: the earlier scan holds), and one that
    differs is read from its start as soon as it does.
    """

    __slots__ = ("_key", "_keep", "_extra_key", "_pieces", "_size", "_same_as", "_scanner", "_vouched")

    def __init__(self, key: str, *, keep: int = 0, extra_key: str | None = None, same_as: Text | None = None) -> None:
        self._key = key
        self._keep = keep
        self._extra_key = extra_key
        self._pieces: list[bytes | bytearray] = []
        self._size = 0
        self._same_as = same_as
        self._scanner = _Scanner(keep) if _Scanner is not None else None
        self._vouched = self._scanner is not None  # the native scanner still vouches for what it read

    def feed(self, piece: bytes | bytearray) -> None:
        """The body's next piece (never raises: a text that is not JSON shows in ``layout``)."""
        if not piece:
            return
        same = self._same_as
        if same is not None:
            if same.matches(self._size, piece) if isinstance(same, Pieces) else same.startswith(piece, self._size):
                self._pieces.append(piece)
                self._size += len(piece)
                return
            self._differs()
        self._pieces.append(piece)
        self._size += len(piece)
        if self._vouched and self._scanner is not None:
            self._vouched = self._scanner.feed(piece)

    def _differs(self) -> None:
        """The body is not the earlier one: what was only compared so far is read now."""
        self._same_as = None
        if self._vouched and self._scanner is not None:
            for piece in self._pieces:
                if not self._scanner.feed(piece):
                    self._vouched = False
                    break

    @property
    def same(self) -> bool:
        """Whether the body fed is ``same_as``, byte for byte (it was then not read)."""
        return self._same_as is not None and self._size == len(self._same_as)

    @property
    def body(self) -> Pieces:
        """The pieces fed so far."""
        return Pieces(self._pieces)

    def layout(self, body: Text | None = None) -> Layout:
        """The layout of the body fed (``NotJSON`` when it is not a JSON object this module can edit safely).
        ``body``: the same bytes as fed, when the caller has them in another form."""
        if self._same_as is not None:
            self._differs()
        if body is None:
            body = self.body
        if self._vouched and self._scanner is not None:
            found = self._scanner.finish()
            if found is not None:
                layout = _native_layout(body, cast("list[MemberFound]", found), self._key, self._keep, self._extra_key)
                if layout is not None:
                    return layout
        # Not vouched for (not JSON, nested too deeply, a repeated member ...), or no native scanner: the exact path
        # gives the answer, and the reason.
        return _scan_exact(body if isinstance(body, bytes) else bytes(body), self._key, keep=self._keep,
                           extra_key=self._extra_key)


def _native_layout(body: Text, found: list[MemberFound], key: str, keep: int, extra_key: str | None) -> Layout | None:
    """The Layout from the native scanner's members; None where the exact path must answer (a repeated ``key`` or
    ``extra_key``, a ``key`` array that breaks the grammar), which it does with the reason."""
    members: list[Member] = []
    seen: set[str] = set()
    target = extra = None
    count = last_end = 0
    is_array = False
    ends: Sequence[int] = ()
    for start, key_end, value_start, end, array in found:
        name = _key_text(_slice(body, start, key_end))
        if name in seen and name in (key, extra_key):
            return None
        seen.add(name)
        if name == key:
            target = len(members)
            if array is not None:
                if array is False or array is True:
                    return None
                is_array = True
                count, ends, last_end, _ = array
        elif name == extra_key:
            extra = len(members)
        members.append(Member(name, start, value_start, end))
    return Layout(len(body), tuple(members), target, count, is_array, tuple(ends), last_end, extra)


def _scan_exact(body: bytes, key: str, *, keep: int = 0, extra_key: str | None = None) -> Layout:
    """``scan`` by the exact path: regular expressions, member by member and element by element."""
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
                pos, count, ends, last_end = _scan_array(body, pos, keep)
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
        elif c == 0x5D:
            return pos + 1, count, ends, last_end
        else:
            raise NotJSON(f"expected ',' or ']' at offset {pos}")


def splice(body: Text, edits: Sequence[tuple[int, int, bytes]]) -> bytes:
    """Replace each ``[start, end)`` by its bytes; edits are sorted and do not overlap."""
    parts: list[bytes] = []
    pos = 0
    for start, end, data in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < pos:
            raise ValueError("overlapping edits")
        parts.append(_slice(body, pos, start))
        parts.append(data)
        pos = end
    parts.append(_slice(body, pos, len(body)))
    return b"".join(parts)


def _member_bytes(name: str, value: bytes) -> bytes:
    return json.dumps(name, ensure_ascii=False).encode() + b":" + value


def _set_extra(layout: Layout, after: int, name: str, value: bytes) -> tuple[int, int, bytes]:
    """An edit that sets member ``name``: its value is replaced if present, else it is inserted at ``after``."""
    if layout.extra is not None:
        member = layout.members[layout.extra]
        return (member.value_start, member.end, value)
    return (after, after, b"," + _member_bytes(name, value))


def truncate(body: Text, layout: Layout, keep: int, extra: tuple[str, bytes] | None = None) -> bytes:
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


def drop(body: Text, layout: Layout, extra: tuple[str, bytes] | None = None) -> bytes:
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


def array_elements(body: bytes) -> list[bytes]:
    """The raw bytes of each element of a JSON text whose top-level value is an array (checked as ``scan`` checks
    an array member); ``NotJSON`` otherwise."""
    return [body[start:stop] for start, stop in array_spans(body)]


def array_spans(body: bytes, *, most: int | None = None) -> list[tuple[int, int]]:
    """Where each element of a JSON text whose top-level value is an array starts and ends (checked as ``scan``
    checks an array member); ``NotJSON`` otherwise. With ``most``: ``TooManyElements`` for an array of more elements,
    found by counting them (only ``most + 1`` offsets are kept), before any span is made."""
    n = len(body)
    pos = _skip_ws(body, 0)
    if pos >= n or body[pos] != 0x5B:
        raise NotJSON("the top-level value is not an array")
    keep = n if most is None else most + 1
    found = None
    if _Scanner is not None:
        scanner = _Scanner(keep, top_array=True)
        if scanner.feed(body):
            found = scanner.finish()  # the whole text: the array, and nothing but whitespace after it
    if isinstance(found, tuple):
        count, ends, _, _ = found
    else:
        end, count, ends, _ = _scan_array(body, pos, keep)
        if _skip_ws(body, end) != n:
            raise NotJSON(f"unexpected data after the top-level array at offset {end}")
    if most is not None and count > most:
        raise TooManyElements(f"the array has more than {most} elements")
    spans: list[tuple[int, int]] = []
    start = _skip_ws(body, pos + 1)
    for stop in ends:
        spans.append((start, stop))
        start = _skip_ws(body, _skip_ws(body, stop) + 1)  # past the comma
    assert len(spans) == count
    return spans


def set_member(body: Text, layout: Layout, key: str, value: bytes, *, before: str | None = None,
               remove: Sequence[str] = ()) -> bytes:
    """Set top-level member ``key`` to the raw JSON ``value``: in place when present, else inserted just before
    member ``before`` when there is one, else at the end. Members named in ``remove`` are taken out. Every other byte
    stays as it was."""
    members = layout.members
    names = [m.key for m in members]
    kept = [i for i, name in enumerate(names) if name not in remove or name == key]
    edits: list[tuple[int, int, bytes]] = []
    if not kept and members:
        edits.append((members[0].start, members[-1].end, b""))
    else:
        for i in (i for i in range(len(members)) if i not in kept):
            # A member goes with the separator that joins it to the next kept member, or else to the previous one.
            later = next((j for j in kept if j > i), None)
            if later is not None:
                edits.append((members[i].start, members[later].start, b""))
            else:
                earlier = max(j for j in kept if j < i)
                edits.append((members[earlier].end, members[i].end, b""))
    edits = _merge(edits)
    if key in names:
        member = members[names.index(key)]
        edits.append((member.value_start, member.end, value))
        return splice(body, edits)
    new = _member_bytes(key, value)
    if before is not None and before in names and names.index(before) in kept:
        at = members[names.index(before)].start
        edits.append((at, at, new + b","))
    elif kept:
        at = members[kept[-1]].end
        edits.append((at, at, b"," + new))
    else:
        # No member is left: the new one is the object's only member, just after the opening brace.
        at = _skip_ws(body if isinstance(body, bytes) else bytes(body), 0) + 1
        edits.append((at, at, new))
    return splice(body, edits)


def _merge(edits: list[tuple[int, int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Deletions that touch or overlap joined into one."""
    out: list[tuple[int, int, bytes]] = []
    for start, end, data in sorted(edits):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end), b"")
        else:
            out.append((start, end, data))
    return out
