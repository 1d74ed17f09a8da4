"""gateway.ops.heap: with its thresholds, a large body's memory freed is kept for the next one (no trim, no page faults
to grow the heap again); an operator's glibc setting wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.ops.heap import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]

# A board's worth of 256 KiB pieces allocated, then freed: how much of the process's resident memory went back.
_PROBE = r"""
import sys
from gateway.ops.heap import keep_freed_memory

def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

print(keep_freed_memory())
for _ in range(3):
    pieces = [b"\x01" * (256 * 1024) for _ in range(40)]
    held = rss()
    del pieces
    print(held - rss())
"""


def _returned(environ: dict[str, str]) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True,
                         env={**environ, "PYTHONPATH": str(ROOT)})
    first, *returned = out.stdout.split()
    return first == "True", min(int(n) for n in returned)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="glibc's malloc on Linux")
def test_freed_body_memory_is_kept_unless_the_operator_set_glibcs_own_thresholds() -> None:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    kept, returned = _returned(environ)
    assert kept and returned < 1 << 20  # the 10 MiB freed stays with the process
    ours, returned = _returned({**environ, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert not ours and returned > 8 << 20  # glibc's default behaviour: trimmed at once


def test_an_operators_setting_is_left_alone() -> None:
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        assert keep_freed_memory({name: "1"}) is False
