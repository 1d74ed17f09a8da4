"""The upload upgrade's reading of a multipart body: every part, handed out as events (``PartHead``, its content as
``bytes``, ``PART_END``) by the core's multipart reader.

Stricter than the guard's sniffer, because what it reads is translated: every rule broken in a part's headers is
refused at once (a file part does not win over it), and so are a few that only matter to a translation (an RFC 8187
``name*``, a ``Content-Transfer-Encoding`` other than 7bit, 8bit or binary, a nested ``multipart/*`` part).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...core.multipart import (
    Ambiguous,
    Boundary,
    MalformedValue,
    MultipartReader,
    PartHeaders,
    Read,
    extended_value,
    parse_disposition,
    parse_media_type,
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


class MultipartSplitter:
    """Feed body bytes as they arrive (``split``), then ``end``; each returns the events they complete."""

    def __init__(self, boundary: Boundary, *, max_header_bytes: int = 16384, file_fields: Iterable[str] = ()) -> None:
        self._reader = MultipartReader(boundary, self, max_header_bytes=max_header_bytes, file_fields=file_fields)
        self._out: list[Event] = []

    @property
    def bytes_fed(self) -> int:
        return self._reader.bytes_fed

    @property
    def _buf(self) -> bytearray:
        """What the reader holds between feeds (bounded: tests check it)."""
        return self._reader.held

    def split(self, data: bytes) -> list[Event]:
        out: list[Event] = []
        self._out = out
        self._reader.feed(data)
        return out

    def end(self) -> list[Event]:
        """The body has ended: nothing more to hand out, or Ambiguous (a body cut short before its close delimiter)."""
        self._reader.close()
        return []

    # --- the reader's events ---------------------------------------------------------------------------------------

    def on_part(self, part: PartHeaders) -> Read:
        if part.problems:
            raise part.problems[0]
        self._out.append(_head(part))
        return Read.CONTENT

    def on_content(self, data: bytes) -> None:
        self._out.append(data)

    def on_part_end(self) -> None:
        self._out.append(PART_END)


def _head(part: PartHeaders) -> PartHead:
    """A header block the reader found well formed (one Content-Disposition, parseable, one name), read."""
    index = part.index
    fields = {name: values[0] for name, values in part.fields.items()}
    disposition = fields[b"content-disposition"].decode("latin-1")
    _, parsed = parse_disposition(disposition)
    params = {key: value for key, value, _ in parsed}
    if "name*" in params:
        raise Ambiguous("extended_name", f"part {index} has an RFC 8187 name*, which parsers read differently")
    _check_coding(index, fields.get(b"content-transfer-encoding"))
    raw_type = fields.get(b"content-type")
    media_value = None if raw_type is None else raw_type.decode("latin-1")
    content_type = None if media_value is None else _essence(index, media_value)
    return PartHead(index, part.raw, _raw_text(params["name"]), _filename(params), content_type, part.file_reason,
                    media_value)


def _check_coding(index: int, coding: bytes | None) -> None:
    if coding is not None and coding.decode("latin-1").lower() not in _PLAIN_CODINGS:
        raise Ambiguous("content_transfer_encoding",
                        f"part {index} has a Content-Transfer-Encoding that some parsers decode and others do not")


def _essence(index: int, media_value: str) -> str:
    """A part's Content-Type as type/subtype; a nested multipart part is refused."""
    try:
        media = parse_media_type(media_value)
    except MalformedValue as err:  # a problem of the part's, so refused before this; kept for the type checker
        raise Ambiguous("malformed_part_content_type",
                        f"part {index} has a Content-Type that cannot be parsed") from err
    if media.type == "multipart":
        raise Ambiguous("nested_multipart", f"part {index} is a nested multipart part (several files in one)")
    return media.essence


def _filename(params: dict[str, str]) -> str | None:
    if "filename*" in params:
        return extended_value(params["filename*"])
    if "filename" in params:
        return _raw_text(params["filename"])
    return None


def _raw_text(value: str) -> str:
    """A header value read byte for byte (latin-1), as UTF-8 when it is: browsers send UTF-8 names raw."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value
