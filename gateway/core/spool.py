"""The spool area: request bytes a policy must hold on disk before it can send them (the upload upgrade's file parts
that come before a comment's text), within one budget for the whole process (``spool.max_bytes``; ``SpoolFull``).
A spool file is removed when closed, and held under a lock for its life so that one left by a dead process is swept
at the next start (``SpoolArea.directory``); a file that cannot be written raises ``SpoolError`` with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ("SpoolArea", "SpoolConfig", "SpoolDirectory", "SpoolError", "SpoolFile", "SpoolFull")

log = logging.getLogger("gateway.spool")

MiB = 1 << 20
PREFIX = "gateway-upload-"
SUFFIX = ".part"
_CHUNK = 256 << 10
# An empty, unlocked spool file is only removed once it is this old: its process may be between creating and locking it.
_EMPTY_GRACE = 60.0


class SpoolConfig(BaseModel):
    """The ``spool`` section of the config."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    # Where spool files go (a policy may name another directory for its own); default: the system's temporary one.
    dir: str | None = Field(default=None, max_length=4096)
    # Bytes on disk for all the spool files of the process together; 0: nothing is spooled (503 instead).
    max_bytes: int = Field(default=256 * MiB, ge=0, le=1 << 40)

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError("spool.dir must be an absolute path")
        return value


class SpoolFull(Exception):
    """The process's spool budget is spent (``spool.max_bytes``)."""


class SpoolError(Exception):
    """A spool file could not be created or written; ``str()`` says why (never a traceback)."""


class SpoolArea:
    """The process's spool budget and the directories it spools to."""

    def __init__(self, config: SpoolConfig | None = None) -> None:
        config = config or SpoolConfig()
        self.limit = config.max_bytes
        self.default_dir = config.dir
        self.used = 0
        self._swept: dict[str, SpoolDirectory] = {}

    def configure(self, config: SpoolConfig) -> None:
        """A reloaded config: the new budget (files already written keep their bytes) and default directory."""
        self.limit = config.max_bytes
        self.default_dir = config.dir

    def directory(self, path: str | None = None) -> SpoolDirectory:
        """The directory ``path`` (default: ``spool.dir``, else the system's temporary one), swept of the files of
        processes that are gone the first time this process asks for it (at start, when the policies are built)."""
        resolved = path or self.default_dir or _system_temp_dir()
        found = self._swept.get(resolved)
        if found is None:
            found = self._swept[resolved] = SpoolDirectory(self, resolved)
            if not resolved:
                # A read-only container with no tmpfs: the gateway serves; a request that must spool gets the 503.
                log.warning("spool: no writable temporary directory (set spool.dir): a request that must spool "
                            "bytes will be answered 503")
                return found
            swept = sweep(resolved)
            if swept:
                log.warning("spool: removed %d file(s) left in %s by a process that is gone", swept, resolved)
        return found

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used = max(0, self.used - n)


class SpoolDirectory:
    """One directory of the area: where ``open`` makes its files."""

    def __init__(self, area: SpoolArea, path: str) -> None:
        self.area = area
        self.path = path

    async def open(self) -> SpoolFile:
        """A new spool file; ``SpoolError`` when it cannot be made."""
        if not self.path:
            raise SpoolError("cannot create a spool file: no writable temporary directory (set spool.dir)")
        try:
            return await asyncio.to_thread(SpoolFile, self.area, self.path)
        except OSError as err:
            raise SpoolError(f"cannot create a spool file in {self.path}: {err.strerror or err}") from None


class SpoolFile:
    """A named temporary file held under an exclusive lock, its bytes taken from the area's budget before they are
    written; removed (and its bytes given back) by ``close``."""

    def __init__(self, area: SpoolArea, directory: str) -> None:
        self._area = area
        fd, self.path = tempfile.mkstemp(prefix=PREFIX, suffix=SUFFIX, dir=directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._file = os.fdopen(fd, "w+b")
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise
        self.size = 0  # bytes taken from the budget (and written, or being written)
        self._closed = False

    async def write(self, data: bytes) -> None:
        """Append ``data``: ``SpoolFull`` when the budget cannot give its bytes (nothing written), ``SpoolError``
        when the disk refuses them."""
        if not self._area.take(len(data)):
            raise SpoolFull()
        self.size += len(data)
        try:
            await asyncio.to_thread(self._file.write, data)
        except OSError as err:
            raise SpoolError(f"cannot write to a spool file in {os.path.dirname(self.path)}: "
                             f"{err.strerror or err}") from None

    async def chunks(self) -> AsyncIterator[bytes]:
        """What was written, from the start."""
        try:
            await asyncio.to_thread(self._file.flush)
            await asyncio.to_thread(self._file.seek, 0)
            while data := await asyncio.to_thread(self._file.read, _CHUNK):
                yield data
        except OSError as err:
            raise SpoolError(f"cannot read a spool file back: {err.strerror or err}") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self._file.close()  # a failed flush of unwritten bytes must not keep the bytes taken
        self._area.give(self.size)
        self.size = 0


def _system_temp_dir() -> str:
    """The system's temporary directory, or "" where none is writable."""
    try:
        return tempfile.gettempdir()
    except OSError:
        return ""


def sweep(directory: str) -> int:
    """Remove the spool files in ``directory`` that no live process holds (their lock is free); returns how many.
    An empty one is left for ``_EMPTY_GRACE`` seconds: its process may not have locked it yet."""
    removed = 0
    try:
        names = [p for p in Path(directory).iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX)]
    except OSError:
        return 0
    now = time.time()
    for path in names:
        removed += _swept(path, now)
    return removed


def _swept(path: Path, now: float) -> bool:
    """Whether the spool file ``path`` was removed (one that cannot be opened is left: it is gone, or not ours)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return _removed(path, fd, now)
    finally:
        os.close(fd)


def _removed(path: Path, fd: int, now: float) -> bool:
    """Whether the spool file ``path`` (open as ``fd``) was removed: not when a live process holds its lock, nor
    while it is empty and younger than ``_EMPTY_GRACE`` seconds."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live process holds it
    info = os.fstat(fd)
    if info.st_size == 0 and now - info.st_mtime < _EMPTY_GRACE:
        return False
    try:
        path.unlink()
    except OSError:
        return False  # gone already, or a directory it may read but not change
    return True
