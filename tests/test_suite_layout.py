"""A newcomer can place the tests: no module of the suite imports a test module or a conftest.py. What tests share is
in the test libraries (tests/gateway_testlib.py and the other ``*_testlib.py``, tests/board_fixtures.py), fixtures
in conftest.py."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts[1:])


def test_no_module_of_the_suite_imports_a_test_module() -> None:
    found = {
        str(path.relative_to(TESTS.parent)): sorted({name for name in _imported(path) if _is_test_module(name)})
        for path in TESTS.rglob("*.py")
        if "node_modules" not in path.parts
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_the_check_sees_an_import_of_a_test_module(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.integration.test_board_cards import board_config\nimport tests.conftest\n")
    assert [name for name in _imported(module) if _is_test_module(name)] == [
        "tests.integration.test_board_cards", "tests.integration.test_board_cards.board_config", "tests.conftest"]
    module.write_text("from tests.gateway_testlib import make_config\nfrom tests import postgres_testlib\n")
    assert [name for name in _imported(module) if _is_test_module(name)] == []
