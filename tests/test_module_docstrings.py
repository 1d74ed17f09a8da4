"""Module docstrings say what a module is for, in a few lines; the long explanations live in the docs (or beside the
code they explain). No docstring of the gateway's modules runs to 10 lines."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parent.parent / "gateway"
MAX_LINES = 9


def _docstring_lines(path: Path) -> int:
    docstring = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
    return len(docstring.strip().splitlines()) if docstring else 0


def test_every_module_docstring_is_short() -> None:
    long = {str(p.relative_to(GATEWAY.parent)): n for p in sorted(GATEWAY.rglob("*.py"))
            if (n := _docstring_lines(p)) > MAX_LINES}
    assert long == {}


def test_the_count_is_of_the_docstring_lines(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""One.\n\nThree.\n"""\n\nx = 1\n')
    assert _docstring_lines(module) == 3
    module.write_text("x = 1\n")
    assert _docstring_lines(module) == 0
