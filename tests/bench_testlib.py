"""The benchmark scripts of bench/, loaded as modules for the tests of their pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ("load",)

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name: str) -> ModuleType:
    """bench/``name``.py as the module ``bench_<name>`` (bench/ put on the path: the scripts import their neighbours,
    benchlib and run, by name)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module
