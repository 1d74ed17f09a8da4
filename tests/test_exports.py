"""Every name a gateway module lists in ``__all__`` is one it defines: ``from module import *`` and the reader who
trusts the list find it."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway

# Not imported: the command line's entry, and Alembic's env script (it runs a migration when imported).
SCRIPTS = ("gateway.__main__", "gateway.ops.ledger.migrations.env")
MODULES = sorted(m.name for m in pkgutil.walk_packages(gateway.__path__, "gateway.") if m.name not in SCRIPTS)


@pytest.mark.parametrize("name", MODULES)
def test_all_names_only_what_the_module_defines(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not define"


def test_the_modules_are_found() -> None:
    assert "gateway.ops.metrics" in MODULES and "gateway.config.secrets" in MODULES
