"""Request ids: 128 bits from the OS, 32 hex digits, never repeated, not shared with a forked child."""

from __future__ import annotations

import os
import re

from gateway.core.http import new_request_id


def test_ids_are_32_hex_digits_and_distinct() -> None:
    ids = [new_request_id() for _ in range(3000)]  # several refills of the buffer
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_reuse_the_parents_buffered_ids() -> None:
    new_request_id()  # the buffer now holds ids the parent will hand out next
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = [new_request_id() for _ in range(256)]
    assert re.fullmatch(r"[0-9a-f]{32}", child) and child not in parent
