"""The config file's YAML is read by libyaml (C) when it can be, by PyYAML's Python reader otherwise (a problem is
worded by the latter): both read every file alike, values and lines, and a file nested deeper than libyaml's composer
can safely recurse is left to the Python reader."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import document
from gateway.config.document import read_document

ROOT = Path(__file__).resolve().parent.parent

TEXTS = {
    "anchors": "base: &b {cap: 100, removal: remove_key}\nroutes:\n  - {name: a, chain: [{board_cards: *b}]}\n"
               "  - name: b\n    chain: &c\n      - board_cards: *b\n  - {name: c, chain: *c}\n",
    "tags": "a: !!str 2026-01-01\nb: !!timestamp 2026-01-01\nc: 2026-01-01T10:00:00Z\nd: !!int '7'\ne: !!float 1\n",
    "scalars": "a: yes\nb: ~\nc: 0x1f\nd: .inf\ne: '010'\nf: 1_000\ng: |\n  two\n  lines\nh: >\n  folded\n  text\n",
    "keys": "1: one\n? complex key\n: value\n'quoted: key': x\nnull: n\nfalse: f\n",
    "flow": "tenants: [{name: a, hosts: [a.test, 'b.test'], upstream: \"http://127.0.0.1:1\"}]\nx: {y: [1, [2, [3]]]}\n",
    "unicode": "name: \"caf\\u00e9 \\U0001F600\"\nother: é\n",
    "empty": "",
    "comments": "# only a comment\n",
    "nested": "a:" + "".join(f"\n{'  ' * i}k{i}:" for i in range(1, 60)) + " leaf\n",
}


def _python(text: str) -> document.Document:
    loader = document._Loader(text)
    try:
        return document._document(loader)
    finally:
        loader.dispose()


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_libyaml_reads_as_the_python_reader_does(text: str) -> None:
    fast = document._fast_document(text)
    assert fast is not None
    assert fast == _python(text)


def test_the_shipped_and_documented_configs_are_read_alike() -> None:
    paths = [ROOT / "config" / "gateway.yaml", *sorted((ROOT / "deploy").rglob("gateway.yaml"))]
    for path in paths:
        text = path.read_text()
        fast = document._fast_document(text)
        assert fast is not None and fast == _python(text), path


@pytest.mark.parametrize("text", ["a: [1, 2\n", "a: b: c\n", "- a\nb: c\n", "a: *missing\n", "--- 1\n--- 2\n",
                                  "a: 'open\n", "a:\n\t- b\n",
                                  "a: &b {x: 1}\nc:\n  <<: *b\n", "1: one\ntrue: t\n"])
def test_a_file_with_a_problem_is_left_to_the_python_reader(text: str, tmp_path: Path) -> None:
    assert document._fast_document(text) is None
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(Exception) as python:
        _python(text)
    assert isinstance(python.value, yaml.YAMLError)
    with pytest.raises(document.ConfigError, match="invalid YAML"):
        read_document(path)


def test_a_deep_file_never_reaches_libyamls_composer() -> None:
    deep = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"  # libyaml's composer would overflow the C stack
    assert document._deeper_than(deep, document._MAX_DEPTH)
    assert document._fast_document(deep) is None
    shallow = "a: " + "[" * (document._MAX_DEPTH - 1) + "]" * (document._MAX_DEPTH - 1) + "\n"  # and the mapping
    assert not document._deeper_than(shallow, document._MAX_DEPTH)


def test_a_deep_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(document.ConfigError, match="nested too deeply"):
        read_document(path)


def test_without_libyaml_every_file_is_read_by_the_python_reader(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(TEXTS["flow"])
    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    assert document._fast_document(TEXTS["flow"]) is None
    assert read_document(path) == _python(TEXTS["flow"])
