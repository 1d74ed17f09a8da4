"""The one reader of multipart/form-data bodies: bytes in, events out to a consumer, whose answers say what to read.

Pure (no I/O, no aiohttp) and strict: what two common parsers could read differently is ``Ambiguous``, never
guessed (docs/policies/legacy_upload_guard.md lists the rules; tests/differential the parsers). Memory stays bounded:
one part's header block, or a delimiter's length of content. Its consumers: the upload guard's sniffer, the upload
upgrade's splitter and the edge's ``_method`` finder.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

__all__ = (
    "Ambiguous",
    "Boundary",
    "MalformedValue",
    "MediaType",
    "MultipartReader",
    "PartConsumer",
    "PartHeaders",
    "Read",
    "extended_value",
    "form_data_boundary",
    "header_fields",
    "parse_disposition",
    "parse_media_type",
    "parse_parameters",
    "request_media_type",
)

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN_RE = re.compile(_TOKEN)
# qdtext without the backslash: in a media type a quoted-pair is refused, because parsers disagree on whether it
# escapes.
_QUOTED = r'"[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]*"'
_PARAM_RE = re.compile(rf"[ \t]*;[ \t]*(?:({_TOKEN})=({_TOKEN}|{_QUOTED}))?")
# With RFC 9110 quoted-pairs: how a parser that honours backslash escapes reads a parameter list (a Content-Disposition
# is read this way, and also as a parser that ends a quoted value at the first quote does).
_ESCAPED = r'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_ESCAPED_PARAM_RE = re.compile(rf"[ \t]*;[ \t]*(?:({_TOKEN})=({_TOKEN}|{_ESCAPED}))?")
_QUOTED_PAIR_RE = re.compile(r"\\(.)")
_QUOTE_OR_PAIR_RE = re.compile(r'\\.|"')
# "name=" or "filename=" as formidable's regular expressions find them (after any non-word character, quotes
# included): where that is not a parameter name, a parser that searches the header text reads another field.
_PARAMETER_LIKE_RE = re.compile(r"(?<![A-Za-z0-9_])(file)?name(?=[*0-9]*[ \t]*=)", re.IGNORECASE)
_MEDIA_TYPE_RE = re.compile(rf"[ \t]*({_TOKEN})/({_TOKEN})")
# Part header lines: a field name, a colon, a value without control characters (obs-text is allowed: browsers
# send UTF-8 file names raw).
_HEADER_LINE_RE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([\t \x21-\x7e\x80-\xff]*)")
_BARE_LF_RE = re.compile(rb"(?<!\r)\n|\r(?!\n)")
# RFC 2046's bchars: 1 to 70, not ending with a space (the parsers of tests/differential agree on every one of them
# in a quoted boundary; an unquoted one must be a token, see parse_media_type).
_BOUNDARY_RE = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")

_CRLF = b"\r\n"


class MalformedValue(ValueError):
    """A header value that does not follow its grammar."""


class Ambiguous(Exception):
    """A body (or its headers) that parsers could read differently; ``rule`` is a stable name for it."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


@dataclass(frozen=True, slots=True)
class MediaType:
    type: str  # lower-cased
    subtype: str  # lower-cased
    params: tuple[tuple[str, str, bool], ...]  # (lower-cased name, value without quotes, was quoted)

    @property
    def essence(self) -> str:
        return f"{self.type}/{self.subtype}"


def parse_parameters(text: str, pos: int = 0, *, escapes: bool = False) -> tuple[tuple[str, str, bool], ...]:
    """``*( OWS ";" OWS [ name "=" ( token / quoted-string ) ] )`` from ``pos`` to the end, or MalformedValue.

    Quoted strings have no backslash, unless ``escapes``: then quoted-pairs are read (and unescaped) as RFC 9110
    says."""
    params: list[tuple[str, str, bool]] = []
    end = len(text.rstrip(" \t"))
    pattern = _ESCAPED_PARAM_RE if escapes else _PARAM_RE
    while pos < end:
        m = pattern.match(text, pos)
        if m is None or m.end() > end:
            raise MalformedValue(f"cannot parse the parameters at {text[pos:pos + 40]!r}")
        pos = m.end()
        if m.group(1) is None:
            continue
        value = m.group(2)
        quoted = value.startswith('"')
        if quoted:
            value = _QUOTED_PAIR_RE.sub(r"\1", value[1:-1]) if escapes else value[1:-1]
        params.append((m.group(1).lower(), value, quoted))
    return tuple(params)


def parse_media_type(value: str) -> MediaType:
    """RFC 9110 ``media-type`` (type/subtype and parameters), strictly: no comments, no lists, no escapes."""
    m = _MEDIA_TYPE_RE.match(value)
    if m is None:
        raise MalformedValue(f"not a media type: {value[:60]!r}")
    return MediaType(m.group(1).lower(), m.group(2).lower(), parse_parameters(value, m.end()))


def request_media_type(values: list[str], suspicious: re.Pattern[str]) -> MediaType | None:
    """The media type of a request's Content-Type lines (``values``): None when there is none, or when it cannot be
    parsed and does not look like what ``suspicious`` finds; Ambiguous when there are several, or when it cannot be
    parsed and some parser could still read it as such."""
    if len(values) > 1:
        raise Ambiguous("duplicate_content_type", "the request has more than one Content-Type header")
    if not values:
        return None
    try:
        return parse_media_type(values[0])
    except MalformedValue:
        if suspicious.search(values[0]):
            raise Ambiguous("malformed_content_type", "the Content-Type cannot be parsed") from None
        return None


@dataclass(frozen=True, slots=True)
class Boundary:
    value: bytes
    quoted: bool

    @property
    def delimiter(self) -> bytes:
        return b"--" + self.value

    @property
    def alternates(self) -> tuple[bytes, ...]:
        # A parser that keeps the quotes of a quoted boundary looks for another delimiter: it must not occur either.
        return (b'--"' + self.value,) if self.quoted else ()


def _boundary_parameter(media: MediaType) -> tuple[str, bool]:
    """The one boundary parameter's value and whether it was quoted (the parameter names are checked already: a
    second one is refused there)."""
    found = [(value, quoted) for name, value, quoted in media.params if name == "boundary"]
    if not found:
        raise Ambiguous("missing_boundary", "the multipart Content-Type has no boundary parameter")
    ((value, quoted),) = found
    return value, quoted


def form_data_boundary(media: MediaType) -> Boundary:
    """The boundary of a ``multipart/form-data`` media type, or Ambiguous when parsers could disagree on it."""
    if media.essence != "multipart/form-data":
        raise Ambiguous("multipart_subtype", f"only multipart/form-data is accepted here, not {media.essence}")
    _check_parameter_names([name for name, _, _ in media.params])
    value, quoted = _boundary_parameter(media)
    if not _BOUNDARY_RE.fullmatch(value):
        raise Ambiguous(
            "boundary_characters", "the boundary must be 1 to 70 letters, digits or '_', '.', '+', '-'"
        )
    return Boundary(value.encode("ascii"), quoted)


def _check_parameter_names(names: list[str]) -> None:
    """A multipart media type's parameters: none repeated, no other spelling of ``boundary``."""
    if len(set(names)) != len(names):
        rule = "duplicate_boundary" if names.count("boundary") > 1 else "duplicate_parameter"
        raise Ambiguous(rule, "the Content-Type repeats a parameter")
    if any(name.startswith("boundary") and name != "boundary" for name in names):
        raise Ambiguous("boundary_parameter", "the Content-Type has an extended or misspelled boundary parameter")


def _field_bases(names: Iterable[str]) -> frozenset[str]:
    return frozenset(n.lower().removesuffix("[]") for n in names)


def _searched(disposition: str) -> tuple[str | None, list[str]]:
    """A Content-Disposition as a parser that searches its text for ``name=`` and ``filename=`` reads it: the first
    of those that is not a parameter (inside a quoted value, or the end of another parameter's name), and the field
    names it reads, a quoted one ending at the first quote (backslash included)."""
    names: list[str] = []
    for m in _PARAMETER_LIKE_RE.finditer(disposition):
        before = disposition[: m.start()]
        outside = sum(q.group(0) == '"' for q in _QUOTE_OR_PAIR_RE.finditer(before)) % 2 == 0
        if not (outside and before.rstrip(" \t").endswith(";")):
            return ("filename" if m.group(1) else "name"), names
        rest = disposition[m.end() :]
        if not m.group(1) and rest.startswith('="'):
            names.append(rest[2:].partition('"')[0])
    return None, names


def extended_value(value: str) -> str:
    """An RFC 8187 ``charset'language'value`` decoded (as UTF-8 when the charset is unknown)."""
    charset, sep, rest = value.partition("'")
    if not sep:
        return unquote(value)
    encoded = rest.partition("'")[2]
    try:
        return unquote(encoded, encoding=charset or "utf-8", errors="replace")
    except LookupError:
        return unquote(encoded, errors="replace")


def parse_disposition(value: str) -> tuple[str, tuple[tuple[str, str, bool], ...]]:
    """A Content-Disposition: its type and its parameters (quoted-pairs read as RFC 9110 says), or MalformedValue."""
    kind = _TOKEN_RE.match(value)
    if kind is None:
        raise MalformedValue(f"not a disposition: {value[:60]!r}")
    return kind.group(0), parse_parameters(value, kind.end(), escapes=True)


def header_fields(block: bytes) -> dict[bytes, list[bytes]]:
    """A part's header block, one well-formed line per header: lower-cased name -> its values, in order."""
    fields: dict[bytes, list[bytes]] = {}
    for line in block.split(_CRLF):
        m = _HEADER_LINE_RE.fullmatch(line)
        if m is not None:
            fields.setdefault(m.group(1).lower(), []).append(m.group(2).strip(b" \t"))
    return fields


@dataclass(frozen=True, slots=True)
class PartHeaders:
    """One part's header block as the reader read it: the event a consumer decides on."""

    index: int  # 0-based, in body order
    raw: bytes  # the block without its final blank line (empty for a part without headers)
    names: tuple[str, ...]  # the field names parsers could read (a searched or an RFC 8187 spelling included)
    file_reason: str | None  # why parsers would read it as a file part; None: a text part
    problems: tuple[Ambiguous, ...]  # the rules its headers break, in the order they were found

    @property
    def fields(self) -> Mapping[bytes, list[bytes]]:
        return header_fields(self.raw)


class Read(enum.Enum):
    """A consumer's answer to a part's headers."""

    SKIP = "skip"  # drop the part's content unread
    CONTENT = "content"  # hand the part's content to ``on_content`` as it arrives
    STOP = "stop"  # read no further: the consumer has decided


class PartConsumer(Protocol):
    """What the reader hands its events to; any of them may raise ``Ambiguous`` to refuse the body."""

    def on_part(self, part: PartHeaders) -> Read: ...

    def on_content(self, data: bytes) -> None: ...

    def on_part_end(self) -> None: ...


class _State(enum.Enum):
    START = 0  # before the first delimiter: a preamble, in which there is no delimiter
    AFTER_DELIMITER = 1  # CRLF (a part follows) or "--" (the close delimiter)
    HEADERS = 2
    BODY = 3
    EPILOGUE = 4  # after the close delimiter: an epilogue, in which there is no delimiter


class MultipartReader:
    """Feed body bytes as they arrive (``feed``), then ``close``. Each part's headers go to the consumer's
    ``on_part``, whose answer says whether its content is read (``on_content``, then ``on_part_end``) or dropped,
    or whether the reading stops. A rule broken inside a part's headers is in that part's ``problems`` (the first
    of the body's is kept in ``pending``), for the consumer to weigh: a file part may win over it. A broken
    structure (where parts begin and end) raises ``Ambiguous`` at once: ``pending`` if there is one, since the
    consumer would have refused for it.

    A part is a file part when its Content-Disposition has a ``filename`` parameter (any spelling starting with
    ``filename``), when it has a Content-Type other than text/plain, or when its field name is one of
    ``file_fields`` (``files`` also covers ``files[]`` and ``files[0]``).
    """

    def __init__(self, boundary: Boundary, consumer: PartConsumer, *, max_header_bytes: int = 16384,
                 file_fields: Iterable[str] = ()) -> None:
        self._consumer = consumer
        self._delimiter = boundary.delimiter
        self._alternates = boundary.alternates
        self._alt_keep = max((len(a) for a in self._alternates), default=1) - 1
        self._alt_tail = b""
        self._max_header_bytes = max_header_bytes
        self._file_bases = _field_bases(file_fields)
        self.held = bytearray()  # what is kept between two feeds (bounded; see the class's notes)
        self._state = _State.START
        self._read = Read.SKIP  # the current part's: what its consumer asked for
        self._scanned = 0  # bytes of the current header block already checked
        self._preamble = False  # bytes before the first delimiter were dropped
        self.parts = 0  # parts whose headers were read
        self.bytes_fed = 0
        self.stopped = False  # the consumer answered STOP
        self.pending: Ambiguous | None = None  # the first rule broken in a part's headers

    @property
    def complete(self) -> bool:
        """Whether the close delimiter was read."""
        return self._state is _State.EPILOGUE

    def feed(self, data: bytes) -> None:
        if self.stopped:
            return
        self.bytes_fed += len(data)
        if self._alternates:
            self._check_alternates(data)
        self.held += self._skip_content(data)
        try:
            while not self.stopped and self._step():
                pass
        except Ambiguous as err:
            raise (self.pending or err) from None

    def close(self) -> None:
        """The body has ended: ``pending`` if a part's headers broke a rule, Ambiguous if the body ended before its
        close delimiter."""
        if self.stopped:
            return
        if self.pending is not None:
            raise self.pending
        if self._state is not _State.EPILOGUE:
            raise Ambiguous("unterminated_body", "the multipart body ends before its close delimiter")

    # --- content ------------------------------------------------------------------------------------------------

    def _content(self, data: bytes, end: int) -> None:
        """``data[:end]`` is content of the current part (handed out, or dropped without a copy)."""
        if self._read is Read.CONTENT:
            self._consumer.on_content(data if end == len(data) else data[:end])

    def _take(self, n: int) -> None:
        """The first ``n`` held bytes are the current part's content."""
        if n > 0:
            if self._read is Read.CONTENT:
                self._consumer.on_content(bytes(self.held[:n]))
            del self.held[:n]

    def _skip_content(self, data: bytes) -> bytes:
        """Inside a part, the common case: ``data`` holds no delimiter, and none straddles the bytes held back from
        the last feed and ``data``. Then all but its last few bytes are content, which never pass through the
        buffer; a large upload costs no copy here. Returns what is left for the buffer."""
        delimiter = self._delimiter
        keep = len(delimiter) + 2
        if self._state is not _State.BODY or len(data) <= 2 * keep or delimiter in data:
            return data
        held = self.held
        if delimiter in bytes(held) + data[: len(delimiter)]:
            return data  # read the usual way
        if held:
            self._content(bytes(held), len(held))
            held.clear()
        self._content(data, len(data) - keep)
        return data[len(data) - keep :]

    def _check_alternates(self, data: bytes) -> None:
        # Searched in place, plus the few bytes where one could straddle the last feed and this one: a whole
        # upload may be read through here, so a feed is not copied.
        keep = self._alt_keep
        seam = self._alt_tail + data[:keep]
        for alternate in self._alternates:
            if alternate in data or alternate in seam:
                raise Ambiguous("alternate_delimiter", "the body contains the quoted boundary as a delimiter")
        self._alt_tail = (self._alt_tail + data[-keep:])[-keep:] if keep else b""

    # --- structure ----------------------------------------------------------------------------------------------

    def _step(self) -> bool:
        """Advance by one syntactic element if the buffer holds it; False when more bytes are needed."""
        state = self._state
        if state is _State.BODY:
            return self._step_body()
        if state is _State.HEADERS:
            return self._step_headers()
        if state is _State.AFTER_DELIMITER:
            return self._step_after_delimiter()
        if state is _State.START:
            return self._step_start()
        return self._step_epilogue()

    def _step_start(self) -> bool:
        # RFC 2046 5.1.1 allows a preamble: parsers look for the delimiter in it, so none may be there but the first,
        # at the start of the body or of a line (its CRLF belongs to the delimiter).
        buf = self.held
        delimiter = self._delimiter
        i = buf.find(delimiter)
        if i == -1:
            # Keep what a delimiter straddling two feeds needs, and the two bytes before it.
            keep = len(delimiter) + 2
            if len(buf) > keep:
                del buf[: len(buf) - keep]
                self._preamble = True
            return False
        if (i > 0 or self._preamble) and buf[i - 2 : i] != _CRLF:
            rule = "line_endings" if buf[i - 1 : i] == b"\n" else "preamble"
            raise Ambiguous(rule, "the boundary occurs in the preamble without a CRLF before it")
        del buf[: i + len(delimiter)]
        self._state = _State.AFTER_DELIMITER
        return True

    def _step_after_delimiter(self) -> bool:
        buf = self.held
        if not buf:
            return False
        if buf[:1] == b"\n":
            raise Ambiguous("line_endings", "a delimiter line ends with a bare LF instead of CRLF")
        if len(buf) < 2:
            if bytes(buf[:1]) not in (b"\r", b"-"):
                raise Ambiguous("delimiter_suffix", "a boundary delimiter is followed by other characters")
            return False
        self._state = _after_delimiter(bytes(buf[:2]))
        del buf[:2]
        return True

    def _step_epilogue(self) -> bool:
        # Every parser of tests/differential ignores the epilogue, one that reads on would find parts after it.
        buf = self.held
        delimiter = self._delimiter
        if buf.find(delimiter) != -1:
            raise Ambiguous("epilogue", "the boundary delimiter occurs after the close delimiter")
        keep = len(delimiter) - 1
        if len(buf) > keep:
            del buf[: len(buf) - keep]
        return False

    def _step_headers(self) -> bool:
        buf = self.held
        if buf[:2] == _CRLF:
            # No header at all: nothing makes it a file part, the part's body starts at once.
            del buf[:2]
            problem = Ambiguous("missing_disposition", f"part {self.parts} has no headers (no Content-Disposition)")
            self._part(PartHeaders(self.parts, b"", (), None, (problem,)))
            return True
        # Only bytes not checked by an earlier feed are scanned (with the overlap each search needs), so a client
        # that trickles a header block byte by byte costs linear time.
        seen = self._scanned
        end = buf.find(b"\r\n\r\n", max(0, seen - 3))
        # A CR at the very end may be the first half of a CRLF still on its way.
        limit = end + 4 if end != -1 else len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        self._scan_headers(seen, limit)
        self._scanned = limit
        if (len(buf) if end == -1 else end) > self._max_header_bytes:
            raise Ambiguous("part_headers_too_large", f"the headers of part {self.parts} are too large")
        if end == -1:
            return False
        block = bytes(buf[:end])
        del buf[: end + 4]
        self._scanned = 0
        self._part(_read_headers(self.parts, block, self._file_bases))
        return True

    def _scan_headers(self, seen: int, limit: int) -> None:
        """The header bytes up to ``limit`` not scanned yet (``seen`` were) hold no bare LF or CR and no delimiter."""
        buf = self.held
        if _BARE_LF_RE.search(buf, max(0, seen - 1), limit):
            raise Ambiguous("line_endings", f"the headers of part {self.parts} use a bare LF or CR")
        if buf.find(self._delimiter, max(0, seen - len(self._delimiter) + 1), limit) != -1:
            raise Ambiguous("delimiter_in_headers", f"the headers of part {self.parts} contain the boundary")

    def _part(self, part: PartHeaders) -> None:
        """A part's headers are read: its consumer decides, and its body starts."""
        if part.problems and self.pending is None:
            self.pending = part.problems[0]
        read = self._consumer.on_part(part)
        self.parts += 1
        self._state = _State.BODY
        if read is Read.STOP:
            self.stopped = True
            read = Read.SKIP
        self._read = read

    def _step_body(self) -> bool:
        buf = self.held
        delimiter = self._delimiter
        i = buf.find(delimiter)
        if i == -1:
            # Keep enough to see a delimiter (and the CRLF before it) that straddles two feeds.
            keep = len(delimiter) + 2
            if len(buf) > keep:
                self._take(len(buf) - keep)
            return False
        self._check_own_line(i)
        after = i + len(delimiter)
        if len(buf) < after + 2:
            if len(buf) == after + 1 and bytes(buf[after : after + 1]) not in (b"\r", b"-"):
                raise _bad_suffix(bytes(buf[after : after + 1]))
            self._take(i - 2)
            return False
        state = _after_delimiter(bytes(buf[after : after + 2]))
        self._take(i - 2)
        self._consumer.on_part_end()
        self._read = Read.SKIP
        del buf[: len(delimiter) + 4]
        self._state = state
        return True

    def _check_own_line(self, i: int) -> None:
        """The delimiter found at ``i`` in a part's body must start a line: the CRLF before it is part of it."""
        buf = self.held
        if i < 2 or buf[i - 2 : i] != _CRLF:
            rule = "line_endings" if i >= 1 and buf[i - 1 : i] == b"\n" else "delimiter_not_on_own_line"
            raise Ambiguous(rule, f"the boundary occurs in part {self.parts - 1} without a CRLF before it")


def _after_delimiter(suffix: bytes) -> _State:
    """The state after a delimiter and the two bytes that follow it: a part's headers, or the epilogue."""
    if suffix == _CRLF:
        return _State.HEADERS
    if suffix == b"--":
        return _State.EPILOGUE
    raise _bad_suffix(suffix[:1])


def _bad_suffix(first: bytes) -> Ambiguous:
    """A delimiter followed by ``first``, which starts neither CRLF nor "--"."""
    rule = "line_endings" if first in (b"\r", b"\n") else "delimiter_suffix"
    return Ambiguous(rule, "a boundary delimiter is followed by something other than CRLF or '--'")


# --- a part's headers ------------------------------------------------------------------------------------------


def _read_headers(n: int, block: bytes, file_bases: frozenset[str]) -> PartHeaders:
    """Part ``n``'s header block: the rules it breaks, and why it is a file part, if it is. What can still be read of
    an ambiguous block is read: a file part in an ambiguous part is still a file part."""
    problems: list[Ambiguous] = []
    note = problems.append
    fields: dict[bytes, list[bytes]] = {}
    for name, value in _header_lines(n, block, note):
        fields.setdefault(name, []).append(value)
    _note_repeated(n, fields, note)
    if not fields.get(b"content-disposition"):
        note(Ambiguous("missing_disposition", f"part {n} has no Content-Disposition"))
    names: list[str] = []
    reason = _file_reason(n, fields, names, note, file_bases)
    return PartHeaders(n, block, tuple(names), reason, tuple(problems))


def _file_reason(n: int, fields: dict[bytes, list[bytes]], names: list[str], note: Callable[[Ambiguous], None],
                 file_bases: frozenset[str]) -> str | None:
    """Why parsers would read part ``n`` as a file part (None: a text part); the field names its dispositions give
    are added to ``names``, as far as they were read."""
    for raw in fields.get(b"content-disposition", ()):
        if _has_filename(n, raw.decode("latin-1"), names, note):
            return "filename parameter"
    media_type = _non_text_type(n, fields.get(b"content-type", ()), note)
    if media_type is not None:
        return f"content type {media_type}"
    # The bases carry no brackets: "files" covers "files", "files[]" and "files[0]".
    field = next((name for name in names if name.lower().partition("[")[0] in file_bases), None)
    return None if field is None else f"field name {field!r}"


def _header_lines(n: int, block: bytes, note: Callable[[Ambiguous], None]) -> list[list[bytes]]:
    """The block's header lines as [lower-cased name, value], a folded line read unfolded (as the parsers that
    accept it do); the lines parsers could read differently noted."""
    headers: list[list[bytes]] = []
    for line in block.split(_CRLF):
        if line[:1] in (b" ", b"\t"):
            note(Ambiguous("folded_header", f"part {n} has a folded (obs-fold) header line"))
            if headers:
                headers[-1][1] += b" " + line.strip(b" \t")
            continue
        m = _HEADER_LINE_RE.fullmatch(line)
        if m is None:
            note(Ambiguous("malformed_part_header", f"part {n} has a header line that is not 'Name: value'"))
            continue
        headers.append([m.group(1).lower(), m.group(2).strip(b" \t")])
    return headers


def _note_repeated(n: int, fields: dict[bytes, list[bytes]], note: Callable[[Ambiguous], None]) -> None:
    for name in (b"content-disposition", b"content-type", b"content-transfer-encoding"):
        if len(fields.get(name, ())) > 1:
            rule = f"duplicate_part_{name.decode().replace('-', '_')}"
            note(Ambiguous(rule, f"part {n} repeats {name.decode()}"))


def _non_text_type(n: int, values: Iterable[bytes], note: Callable[[Ambiguous], None]) -> str | None:
    """The first Content-Type of a part that makes it a file part (any but text/plain), None if none does."""
    for raw in values:
        try:
            media = parse_media_type(raw.decode("latin-1"))
        except MalformedValue:
            note(Ambiguous("malformed_part_content_type", f"part {n} has a Content-Type that cannot be parsed"))
            continue
        # multipart/* included: RFC 2388 sent several files of one field as a nested multipart/mixed part.
        if media.essence != "text/plain":
            return media.essence
    return None


def _has_filename(n: int, raw: str, names: list[str], note: Callable[[Ambiguous], None]) -> bool:
    """Whether this Content-Disposition has a filename parameter; the field names it gives are added to ``names``."""
    try:
        kind, params = parse_disposition(raw)
    except MalformedValue:
        note(Ambiguous("malformed_disposition", f"part {n} has a Content-Disposition that cannot be parsed"))
        return False
    keys = [key for key, _, _ in params]
    names += _note_disposition(n, raw, kind, keys, note)
    if any(key.startswith("filename") for key in keys):
        return True
    _field_names(n, params, names, note)
    return False


def _note_disposition(n: int, raw: str, kind: str, keys: list[str], note: Callable[[Ambiguous], None]) -> list[str]:
    """The rules a parsed Content-Disposition breaks, noted; the field names a parser that searches its text reads."""
    stray, searched_names = _searched(raw)
    if stray is not None:
        note(Ambiguous(f"{stray}_outside_parameter", f"part {n} has '{stray}=' outside a parameter name"))
    if kind.lower() != "form-data":
        note(Ambiguous("disposition_type", f"part {n} is not a form-data part ({kind!r})"))
    if len(set(keys)) != len(keys):
        note(Ambiguous("duplicate_disposition_parameter", f"part {n} repeats a Content-Disposition parameter"))
    return searched_names


def _field_names(n: int, params: tuple[tuple[str, str, bool], ...], names: list[str],
                 note: Callable[[Ambiguous], None]) -> None:
    """The field names a disposition without a filename gives, added to ``names``; a missing or misspelled one
    noted."""
    for key, value, _ in params:
        if key == "name":
            names.append(value)
        elif key == "name*":
            # RFC 8187: parsers that decode it read this name, the others the plain one (or none).
            names += (value, extended_value(value))
        elif key.startswith("name"):
            note(Ambiguous("extended_name", f"part {n} has a misspelled or continued name parameter"))
    if not any(key in ("name", "name*") for key, _, _ in params):
        note(Ambiguous("missing_name", f"part {n} has no field name"))
