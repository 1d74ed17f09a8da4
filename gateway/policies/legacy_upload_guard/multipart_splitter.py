"""The multipart reader of the upload upgrade: the sniffer's state machine read to the end, handing out every part.

Pure, like ``multipart_sniffer``: no I/O. Where the sniffer stops at the first file part, the splitter reads on and
hands out each part's head (``PartHead``) and then its content as it arrives (``bytes``), then ``PART_END``. It is
stricter than the sniffer, because what it reads is translated: every rule the sniffer knows raises ``Ambiguous`` at
once (a file part does not win over a rule broken in another part's headers), and so do a few that only matter to a
translation (an RFC 8187 ``name*``, a ``Content-Transfer-Encoding`` other than 7bit, 8bit or binary, a nested
``multipart/*`` part). So a body the guard would refuse is refused here too, and only a body that every parser reads
alike is translated.

Memory stays bounded: the splitter keeps at most one part's header block or a delimiter's length of content, and
hands out content as soon as it cannot be the start of a delimiter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .multipart_sniffer import (
    _CRLF,
    _HEADER_LINE_RE,
    _TOKEN_RE,
    Ambiguous,
    Boundary,
    MalformedValue,
    MultipartSniffer,
    _extended_value,
    _State,
    parse_media_type,
    parse_parameters,
)

__all__ = ("PART_END", "Event", "MultipartSplitter", "PartEnd", "PartHead")

_PLAIN_CODINGS = frozenset({"7bit", "8bit", "binary"})


@dataclass(frozen=True, slots=True)
class PartHead:
    """One part's header block, as sent and as read."""

    index: int  # 0-based, in body order
    raw: bytes  # the header block without its final blank line
    name: str  # the field name
    filename: str | None  # the file name (``filename*`` decoded, preferred over ``filename``)
    content_type: str | None  # the media type's essence, lower-cased
    file_reason: str | None  # why the guard reads it as a file part; None: a text part
    media: str | None = None  # the part's Content-Type as the client wrote it (parameters such as charset kept)

    @property
    def is_file(self) -> bool:
        return self.file_reason is not None


class PartEnd:
    """The current part's content is complete."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PART_END"


PART_END = PartEnd()
Event = PartHead | bytes | PartEnd


class MultipartSplitter(MultipartSniffer):
    """Feed body bytes as they arrive (``split``), then ``end``; each returns the events they complete."""

    def __init__(self, boundary: Boundary, *, max_header_bytes: int = 16384, file_fields: Iterable[str] = ()) -> None:
        super().__init__(boundary, max_header_bytes=max_header_bytes, file_fields=file_fields)
        self._out: list[Event] = []

    def split(self, data: bytes) -> list[Event]:
        self.bytes_fed += len(data)
        if self._alternates:
            self._check_alternates(data)
        out: list[Event] = []
        self._out = out
        self._buf += self._skip_content(data)
        while self._step():
            self._strict()
        self._strict()
        return out

    def end(self) -> list[Event]:
        """The body has ended: nothing more to hand out, or Ambiguous (a body cut short before its close delimiter)."""
        self._strict()
        if self._state is not _State.EPILOGUE:
            raise Ambiguous("unterminated_body", "the multipart body ends before its close delimiter")
        return []

    def _strict(self) -> None:
        if self.pending is not None:
            raise self.pending

    def _classify_part(self, block: bytes) -> str | None:
        reason = super()._classify_part(block)
        self._strict()
        self._out.append(_head(self.parts, block, reason))
        # Never a "finding": the sniffer's reading would stop there, the splitter's goes on.
        return None

    def _take(self, n: int) -> None:
        if n > 0:
            self._out.append(bytes(self._buf[:n]))
            del self._buf[:n]

    def _content(self, data: bytes, end: int) -> None:
        self._out.append(data if end == len(data) else data[:end])

    def _part_end(self) -> None:
        self._out.append(PART_END)


def _head(index: int, block: bytes, reason: str | None) -> PartHead:
    """A header block the sniffer found well formed (one Content-Disposition, parseable, one name), read."""
    fields: dict[bytes, bytes] = {}
    for line in block.split(_CRLF):
        m = _HEADER_LINE_RE.fullmatch(line)
        assert m is not None  # the sniffer noted any other line, and a noted rule is refused before this
        fields.setdefault(m.group(1).lower(), m.group(2).strip(b" \t"))
    disposition = fields[b"content-disposition"].decode("latin-1")
    kind = _TOKEN_RE.match(disposition)
    assert kind is not None
    params = {key: value for key, value, _ in parse_parameters(disposition, kind.end(), escapes=True)}
    if "name*" in params:
        raise Ambiguous("extended_name", f"part {index} has an RFC 8187 name*, which parsers read differently")
    coding = fields.get(b"content-transfer-encoding")
    if coding is not None and coding.decode("latin-1").lower() not in _PLAIN_CODINGS:
        raise Ambiguous("content_transfer_encoding",
                        f"part {index} has a Content-Transfer-Encoding that some parsers decode and others do not")
    content_type = media_value = None
    raw_type = fields.get(b"content-type")
    if raw_type is not None:
        media_value = raw_type.decode("latin-1")
        try:
            media = parse_media_type(raw_type.decode("latin-1"))
        except MalformedValue:  # noted by the sniffer, so refused before this; kept for the type checker
            raise Ambiguous("malformed_part_content_type", f"part {index} has a Content-Type that cannot be parsed")
        if media.type == "multipart":
            raise Ambiguous("nested_multipart", f"part {index} is a nested multipart part (several files in one)")
        content_type = media.essence
    filename: str | None = None
    if "filename*" in params:
        filename = _extended_value(params["filename*"])
    elif "filename" in params:
        filename = _raw_text(params["filename"])
    return PartHead(index, block, _raw_text(params["name"]), filename, content_type, reason, media_value)


def _raw_text(value: str) -> str:
    """A header value read byte for byte (latin-1), as UTF-8 when it is: browsers send UTF-8 names raw."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value

