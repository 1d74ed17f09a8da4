"""The request journal and the tap that hashes request bodies as they arrive."""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

__all__ = ["BodyTap", "Journal", "JournalEntry"]

JournalEntry = dict[str, Any]


class BodyTap:
    """Counts and hashes request body bytes in arrival order without keeping them."""

    __slots__ = ("_hash", "length", "truncated", "uploads")

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.length = 0
        self.truncated = False
        self.uploads: list[dict[str, Any]] = []

    def feed(self, chunk: bytes | bytearray) -> None:
        if chunk:
            self._hash.update(chunk)
            self.length += len(chunk)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


class Journal:
    """The last ``size`` requests received, oldest first."""

    def __init__(self, size: int) -> None:
        self._entries: deque[JournalEntry] = deque(maxlen=size)
        self._seq = 0

    def record(self, entry: JournalEntry) -> None:
        self._seq += 1
        self._entries.append({"seq": self._seq, **entry})

    def entries(self) -> list[JournalEntry]:
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()
