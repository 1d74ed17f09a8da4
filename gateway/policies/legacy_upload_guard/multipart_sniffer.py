"""The guard's reading of a multipart body: does it carry a file part? The core's multipart reader does the reading;
this consumer stops at the first file part and keeps the first rule broken before it (a file part wins)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from ...core.multipart import Ambiguous, Boundary, MultipartReader, PartHeaders, Read

__all__ = ("MultipartSniffer", "PartFinding", "Verdict")


class Verdict(enum.Enum):
    NEED_MORE = "need_more"
    FILE = "file"
    NO_FILE = "no_file"


@dataclass(frozen=True, slots=True)
class PartFinding:
    index: int  # 0-based part number
    reason: str


class MultipartSniffer:
    """Feed body bytes as they arrive; ``feed`` answers FILE as soon as a file part's headers are complete. NO_FILE
    is only answered by ``feed_eof`` after a complete, well-formed body. Ambiguous is raised at once when the structure
    of the body is in doubt, and for a rule broken in a part's headers once the body has ended without a file part
    (``pending`` holds it until then)."""

    def __init__(self, boundary: Boundary, *, max_header_bytes: int = 16384, file_fields: Iterable[str] = ()) -> None:
        self._reader = MultipartReader(boundary, self, max_header_bytes=max_header_bytes, file_fields=file_fields)
        self.finding: PartFinding | None = None

    @property
    def pending(self) -> Ambiguous | None:
        return self._reader.pending

    @property
    def bytes_fed(self) -> int:
        return self._reader.bytes_fed

    @property
    def parts(self) -> int:
        return self._reader.parts

    @property
    def _buf(self) -> bytearray:
        """What the reader holds between feeds (bounded: tests check it)."""
        return self._reader.held

    def feed(self, data: bytes) -> Verdict:
        if self.finding is None:
            self._reader.feed(data)
        return Verdict.NEED_MORE if self.finding is None else Verdict.FILE

    def feed_eof(self) -> Verdict:
        if self.finding is not None:
            return Verdict.FILE
        self._reader.close()
        return Verdict.NO_FILE

    # --- the reader's events ---------------------------------------------------------------------------------------

    def on_part(self, part: PartHeaders) -> Read:
        if part.file_reason is None:
            return Read.SKIP
        self.finding = PartFinding(part.index, part.file_reason)
        return Read.STOP

    def on_content(self, data: bytes) -> None:
        return

    def on_part_end(self) -> None:
        return
