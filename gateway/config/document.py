"""The config file read: YAML as the schema wants it (a duplicated key is a problem, a timestamp stays text, aliases
bounded), and the line each key is written on, so that a problem names it (``read_document``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .problems import ConfigError, loc

__all__ = ("Document", "read_document", "read_yaml")


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# Aliases let a small file stand for a huge (or endless) structure: more values than this is a problem.
_MAX_VALUES = 100_000


class _Loader(yaml.SafeLoader):
    """The file's YAML for the schema: a duplicated key is a mistake, not a silent override, and a timestamp stays
    the text it was (the key that holds it reads it: a date key says ``2026-02-30`` is no date, a string key keeps
    ``2026-01-01`` as written)."""


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # see _fast_document
    """The same, parsed and composed by libyaml (C): ten times faster on a config of thousands of companies. A file
    in which it finds a problem is read again by ``_Loader``, whose words the problem is given in. (PyYAML's wheels
    have libyaml; one built without it reads every file with ``_Loader``.)"""


_RESOLVERS = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# libyaml's composer recurses in C with no bound: a document nested deeper than this is left to _Loader, which stops at
# Python's recursion limit (a config is a few levels deep).
_MAX_DEPTH = 200
_OPENING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _construct_mapping(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(None, None, "a key must be a plain value, not a list or mapping",
                                                    key_node.start_mark)
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


def _construct_text(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]  # an explicit !!timestamp: text as well


for _kind in (_Loader, _FastLoader):
    _kind.yaml_implicit_resolvers = _RESOLVERS
    _kind.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    _kind.add_constructor(_TIMESTAMP_TAG, _construct_text)


class _Unreadable(Exception):
    def __init__(self, message: str, node: yaml.Node) -> None:
        super().__init__(message)
        self.line = node.start_mark.line + 1


def _key_lines(loader: yaml.SafeLoader | yaml.CSafeLoader, root: yaml.Node) -> dict[str, int]:
    """Each key's and item's path (as problems name it, ``loc``) -> the line it is written on. Refuses an alias
    that contains itself and a document of more than ``_MAX_VALUES`` values, before anything is built from it."""
    lines: dict[str, int] = {}
    count = 0
    open_nodes: set[int] = set()

    def walk(node: yaml.Node, path: list[int | str]) -> None:
        nonlocal count
        count += 1
        if count > _MAX_VALUES:
            raise _Unreadable(f"more than {_MAX_VALUES} values (aliases included)", node)
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return
        if id(node) in open_nodes:
            raise _Unreadable("an alias refers to a mapping or list that contains it", node)
        open_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines.setdefault(loc([*path, i]), item.start_mark.line + 1)
                walk(item, [*path, i])  # noqa: F821
        else:
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
                if isinstance(key, (str, int)):
                    lines.setdefault(loc([*path, key]), key_node.start_mark.line + 1)
                    walk(value_node, [*path, key])  # noqa: F821
                else:
                    walk(value_node, path)  # noqa: F821
        open_nodes.discard(id(node))

    try:
        walk(root, [])
    finally:
        # It calls itself: function and cell would be a cycle that only a full collection frees. (noqa F821 above:
        # ruff reads this del as unbinding the name for its calls, which all run before it.)
        del walk
    return lines


_PARENT_RE = re.compile(r"(\[\d+\]|\.[^.\[]*|^[^.\[]+)$")


@dataclass(frozen=True, slots=True)
class Document:
    """A config file's YAML and where each of its keys is written."""

    data: Any
    lines: Mapping[str, int] = dataclasses.field(default_factory=dict)  # loc(path) -> line (1-based)

    def line_of(self, path: str) -> int | None:
        """The line of ``path``, or of its nearest ancestor written in the file (a missing key: its mapping)."""
        while path:
            line = self.lines.get(path)
            if line is not None:
                return line
            path = _PARENT_RE.sub("", path)
        return None

    def annotate(self, problems: Sequence[str]) -> list[str]:
        """Each problem (``path: message``) with the line of its path: ``line 12: path: message``."""
        out = []
        for problem in problems:
            line = self.line_of(self._path_of(problem))
            out.append(f"line {line}: {problem}" if line is not None else problem)
        return out

    def _path_of(self, problem: str) -> str:
        """The path a problem names: its longest prefix before ": " that is a key of the file (a key may hold
        ": "), else what comes before the first ": "."""
        known = [i for i in range(len(problem)) if problem.startswith(": ", i) and problem[:i] in self.lines]
        return problem[:known[-1]] if known else problem.partition(": ")[0]


def read_document(path: str | Path) -> Document:
    """The file's YAML (duplicated keys refused) and the line of each key, or ConfigError."""
    source = str(path)
    text = _text(path, source)
    try:
        loader = _Loader(text)  # its reader refuses characters YAML does not allow (NUL) at once
    except yaml.YAMLError as err:
        raise ConfigError([_yaml_problem(err)], source) from None
    try:
        return _fast_document(text) or _document(loader)
    except yaml.YAMLError as err:
        raise ConfigError([_yaml_problem(err)], source) from None
    except _Unreadable as err:
        raise ConfigError([f"line {err.line}: {err}"], source) from None
    except RecursionError:
        raise ConfigError(["invalid YAML: nested too deeply"], source) from None
    finally:
        loader.dispose()


def _text(path: str | Path, source: str) -> str:
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError([f"cannot read the file: {err.strerror or err}"], source) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ConfigError([f"line {line}: the file is not UTF-8 text (byte {err.start + 1})"], source) from None


def _document(loader: yaml.SafeLoader | yaml.CSafeLoader) -> Document:
    node = loader.get_single_node()
    if node is None:
        return Document(None)
    lines = _key_lines(loader, node)
    return Document(loader.construct_document(node), lines)


def _fast_document(text: str) -> Document | None:
    """``text`` read by libyaml, or None where it finds a YAML problem or the document is nested too deep for it."""
    if not yaml.__with_libyaml__:
        return None
    try:
        if _deeper_than(text, _MAX_DEPTH):
            return None
        loader = _FastLoader(text)
        try:
            return _document(loader)
        finally:
            loader.dispose()
    except yaml.YAMLError:
        return None


def _deeper_than(text: str, limit: int) -> bool:
    """Whether ``text``'s mappings and lists nest deeper than ``limit``, from libyaml's events (no recursion)."""
    parser = _FastLoader(text)
    depth = 0
    try:
        while (event := parser.get_event()) is not None:
            if isinstance(event, _OPENING):
                depth += 1
                if depth > limit:
                    return True
            elif isinstance(event, _CLOSING):
                depth -= 1
        return False
    finally:
        parser.dispose()


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    if mark is None and isinstance(err, yaml.reader.ReaderError):
        text = err.reason[:1].lower() + err.reason[1:]  # an unacceptable character: where, from its position
        return f"invalid YAML: {text} (character {err.position + 1})"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err)
    return f"{where}invalid YAML: {problem}"


def read_yaml(path: str | Path) -> Any:
    """The file's YAML (duplicated keys refused), or ConfigError."""
    return read_document(path).data
