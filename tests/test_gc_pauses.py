"""The memory management of a reload's thread (gateway/ops/gc_pauses.py): a replaced structure freed in pieces, what
it shares with the running one untouched; the collector paused and restored; the GIL handed over quickly inside."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

from gateway.ops.gc_pauses import let_go, paused, quick_handover


class Part:
    def __init__(self, *held: Any) -> None:
        self.held = list(held)


def test_let_go_frees_what_only_it_holds_and_leaves_what_is_shared() -> None:
    shared = Part({"kept": [1, 2, 3]})
    owned = [Part(Part(), {"n": i}) for i in range(100)]
    gone = [weakref.ref(part) for part in owned] + [weakref.ref(part.held[0]) for part in owned]
    structure = {"owned": owned, "shared": shared, "nested": Part(owned[0], shared)}
    del owned
    let_go([structure])
    del structure
    assert all(ref() is None for ref in gone)
    assert shared.held == [{"kept": [1, 2, 3]}]  # referred to from here: let go of, never taken apart


def test_let_go_empties_the_holder() -> None:
    holder: list[Any] = [Part(Part())]
    let_go(holder)
    assert holder == []


def test_collection_is_paused_inside_and_restored_by_the_outermost() -> None:
    assert gc.isenabled()
    with paused():
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_switch_interval_is_short_inside_only() -> None:
    before = sys.getswitchinterval()
    with quick_handover():
        assert sys.getswitchinterval() == 0.001
    assert sys.getswitchinterval() == before
