"""Request ids: 128 random bits (a generator seeded from the OS), 32 hex digits, never repeated, not shared with a
forked child, not repeated when another module seeds the random module."""

from __future__ import annotations

import os
import random
import re

from gateway.core.http import new_request_id


def test_ids_are_32_hex_digits_and_distinct() -> None:
    ids = [new_request_id() for _ in range(3000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_reuse_the_parents_buffered_ids() -> None:
    new_request_id()  # the generator's state, which the child must not share
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


def test_seeding_the_random_module_does_not_repeat_ids() -> None:
    state = random.getstate()
    try:
        random.seed(7)
        first = new_request_id()
        random.seed(7)
        assert new_request_id() != first
    finally:
        random.setstate(state)
