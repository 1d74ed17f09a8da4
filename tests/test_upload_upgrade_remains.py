"""What a file part of a failed upload upgrade may have left on the service (``FileEntry.may_remain``, named in the
bridge's warning): its id, else its candidates, else "?" when its fate is unknown; nothing for a file whose fate is
known and leaves nothing behind."""

from __future__ import annotations

import pytest

from gateway.policies.legacy_upload_guard.upgrade.outcomes import FileEntry, FileStatus


def _entry(status: FileStatus, file_id: str | None = None, candidates: tuple[str, ...] = ()) -> FileEntry:
    return FileEntry(0, "files[]", "a.pdf", status, id=file_id, candidates=list(candidates))


@pytest.mark.parametrize(("entry", "remains"), [
    (_entry(FileStatus.UNKNOWN, "f1", ("c1", "c2")), "f1"),
    (_entry(FileStatus.UNKNOWN, None, ("c1", "c2")), "c1/c2"),
    (_entry(FileStatus.UNKNOWN), "?"),
    (_entry(FileStatus.ROLLBACK_FAILED, "f1"), "f1"),
    (_entry(FileStatus.ROLLBACK_FAILED, None, ("c1",)), "c1"),
    (_entry(FileStatus.ROLLBACK_FAILED), None),
    (_entry(FileStatus.UPLOADED, "f1"), None),
    (_entry(FileStatus.ROLLED_BACK, "f1"), None),
    (_entry(FileStatus.NOT_FOUND, None, ("c1",)), None),
    (_entry(FileStatus.NOT_SENT), None),
])
def test_what_a_file_part_may_leave_behind(entry: FileEntry, remains: str | None) -> None:
    assert entry.may_remain == remains
