"""Freed memory kept for the next large body, instead of handed back to the kernel and faulted in again: glibc's
malloc trims its heap whenever more than its (adaptive) trim threshold is free at the top, so each 10 MB board held
while it is rewritten cost ~2,500 page faults to grow the heap and a trim to shrink it, a burst that delayed the small
requests behind it (docs/benchmarks.md, "The 1 KB p99 while never-seen boards are rewritten")."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

__all__ = ("MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory")

log = logging.getLogger("gateway")

# Allocations up to this size come from the heap (a body's pieces are 256 KiB); larger ones (a page joined whole, a
# rewritten board) are mapped and unmapped on their own, as glibc does by default from 128 KiB.
MMAP_THRESHOLD = 1 << 20
# Free memory kept at the top of the heap before it is trimmed: a few boards' worth. 64 MiB kept more than a large
# page's bridge could reuse (tests/integration/test_bridge_bounds.py's memory bound failed); 16 MiB trimmed too often.
TRIM_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's own ways to set them, which an operator's setting wins over.
_OPERATOR_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc's thresholds (above) unless the environment sets them; True when they were set here. A C library
    other than glibc (musl has no mallopt) is left as it is."""
    if any(name in environ for name in _OPERATOR_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        log.debug("malloc thresholds not set: this C library's mallopt refused them")
        return False
    return True
