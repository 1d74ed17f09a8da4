"""The sweep of a spool directory at start (``core.spool.sweep``): the files of processes that are gone are removed,
those a live process holds (their lock taken) and fresh empty ones are kept, and other files are never touched."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from gateway.core.spool import PREFIX, SUFFIX, sweep


def _spool_file(directory: Path, name: str, data: bytes = b"") -> Path:
    path = directory / f"{PREFIX}{name}{SUFFIX}"
    path.write_bytes(data)
    return path


def test_sweep_removes_only_the_spool_files_no_live_process_holds(tmp_path: Path) -> None:
    left = _spool_file(tmp_path, "left", b"bytes of an upload whose process is gone")
    old_empty = _spool_file(tmp_path, "old-empty")
    hour_ago = time.time() - 3600
    os.utime(old_empty, (hour_ago, hour_ago))
    fresh_empty = _spool_file(tmp_path, "fresh-empty")  # its process may not have locked it yet
    held = _spool_file(tmp_path, "held", b"bytes still being written")
    other = tmp_path / "not-a-spool-file.part"
    other.write_bytes(b"someone else's")
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a lock on another open file: as a live process holds it
        assert sweep(str(tmp_path)) == 2
    finally:
        os.close(fd)
    assert not left.exists() and not old_empty.exists()
    assert fresh_empty.exists() and held.exists() and other.exists()
    # Once its lock is free, the held file is swept too.
    assert sweep(str(tmp_path)) == 1
    assert not held.exists() and fresh_empty.exists()


def test_sweep_of_a_missing_directory_removes_nothing(tmp_path: Path) -> None:
    assert sweep(str(tmp_path / "gone")) == 0
