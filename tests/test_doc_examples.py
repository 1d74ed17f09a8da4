"""The example outputs in the docs are what the tool prints today.

A fenced block in README.md or docs/ whose first line is `$ gateway ...` is run (from the repository's root, as
`python -m gateway ...`, stderr after stdout as a terminal shows them) and must print exactly the rest of the block.
After a change to what a command prints, regenerate every such block with:

    .venv/bin/python tests/test_doc_examples.py --write
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"^```[a-z]*\n(\$ gateway [^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Example:
    doc: Path
    command: str  # after "$ "
    shown: str
    start: int  # offsets of the output in the doc
    end: int


def examples() -> list[Example]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            found.append(Example(doc, m.group(1)[2:], m.group(2), m.start(2), m.end(2)))
    return found


def printed(command: str) -> str:
    argv = shlex.split(command)
    assert argv[0] == "gateway", command
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_NOW"}
    out = subprocess.run([sys.executable, "-m", "gateway", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env=env)
    return out.stdout + out.stderr


def test_the_rollout_page_has_examples_of_each_command() -> None:
    commands = [e.command for e in examples() if e.doc.name == "rollout.md"]
    assert any(c.startswith("gateway rollout ") for c in commands), commands
    assert any(c.startswith("gateway check-config ") for c in commands), commands


def test_every_example_output_is_what_the_tool_prints() -> None:
    found = examples()
    assert found
    for example in found:
        actual = printed(example.command)
        assert actual == example.shown, (
            f"{example.doc.relative_to(ROOT)}: `{example.command}` prints something else now; regenerate with "
            f"`.venv/bin/python tests/test_doc_examples.py --write`. It prints:\n{actual}")


def _write() -> None:
    for doc in sorted({e.doc for e in examples()}):
        text = doc.read_text(encoding="utf-8")
        for example in sorted((e for e in examples() if e.doc == doc), key=lambda e: -e.start):
            text = text[: example.start] + printed(example.command) + text[example.end :]
        doc.write_text(text, encoding="utf-8")
        print(f"rewrote the examples of {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    _write()
