"""Memory management that holds the GIL, so the event loop. A full collection walks every tracked object (about
100 ms on a shared 2-core machine for the ~100,000 of a gateway with SQLAlchemy loaded): start-up's objects, which
live as long as the process, are frozen out of its walks (``freeze_startup``). A config of thousands of companies is
millions of objects made at once: made with automatic collection paused (``paused``), then frozen (``freeze_built``),
on a thread that gives the GIL up within a millisecond when the loop asks (``quick_handover``); the config a reload
replaced is freed on that thread in pieces (``let_go``), not in one cascade of frees in C."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ("freeze_built", "freeze_startup", "let_go", "paused", "quick_handover")

# While a thread works beside the event loop: how long the loop waits for the GIL before the thread is made to give it
# up (Python's default, 5 ms, is paid at each of the several wake-ups of the loop that one request takes).
_HANDOVER = 0.001


def freeze_startup(*, full: bool = True) -> None:
    """Collect what start-up left (a full collection before the first request; only the young generations later,
    when the loop is serving), then freeze what is left."""
    gc.collect() if full else gc.collect(1)
    gc.freeze()


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside: a collection afterwards walks the objects made inside once, not every time
    more are made. Nested, the outermost restores the collector."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freeze_built() -> None:
    """What is tracked now (a reload's new config and all built from it, which live until the next reload) goes to
    the permanent generation, uncollected: no full collection, on whichever thread, walks it again."""
    gc.freeze()


def let_go(holder: list[Any]) -> None:
    """Free what ``holder``'s one item holds, on this thread and a piece at a time: each object only this function
    still refers to is taken apart (what it refers to kept here) before it goes, so that no single free cascades
    through the whole structure and the GIL is given up between pieces. An object referred to from elsewhere is only
    let go of, never touched: the structure may share objects with the running one."""
    pieces = [holder.pop()]
    with quick_handover():
        while pieces:
            piece = pieces.pop()
            if sys.getrefcount(piece) <= 2:  # this name and the call's argument: nothing else holds it
                pieces.extend(gc.get_referents(piece))


@contextmanager
def quick_handover() -> Iterator[None]:
    """Inside, a thread that holds the GIL gives it up within ``_HANDOVER`` when another (the event loop) waits."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(_HANDOVER)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
