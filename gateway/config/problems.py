"""How a config problem is named: ``ConfigError`` with every problem found, each ``path: message`` with its key's path
as ``loc`` writes it (``routes[3].chain[1].board_cards.cap``); pydantic's errors in that form, an unknown key with the
known key nearest to it."""

from __future__ import annotations

import collections.abc
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from ..core.keys import UNKNOWN_KEY, did_you_mean

__all__ = ("ConfigError", "loc", "pydantic_problems")


class ConfigError(Exception):
    """Raised with every problem found; ``str()`` is the one message an operator reads."""

    def __init__(self, problems: Sequence[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n" + "\n".join(f"  {p}" for p in self.problems))


def loc(parts: Sequence[int | str]) -> str:
    """A key's path as problems name it: ``routes[3].chain[1].board_cards.cap`` (a key's unprintable characters as
    ``\\xNN``, so that a problem is one line of plain text)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            if not text.isprintable():
                text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
            out += ("." if out else "") + text
    return out or "(top level)"


def pydantic_problems(err: ValidationError, prefix: Sequence[int | str] = (),
                      model: type[BaseModel] | None = None) -> list[str]:
    """Each error of ``model``'s validation as ``path: message``; an unknown key with the known key nearest to it."""
    problems = []
    for item in err.errors(include_url=False):
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden" and model is not None and item["loc"]:
            msg = UNKNOWN_KEY + did_you_mean(item["loc"][-1], _keys_at(model, item["loc"][:-1]))
        problems.append(f"{loc([*prefix, *item['loc']])}: {msg}")
    return problems


def _keys_at(model: type[BaseModel], path: Sequence[int | str]) -> set[str]:
    """The keys the schema knows in the mapping at ``path`` under ``model`` (none where the path cannot be followed
    through the annotations, as through a union's member named in the path)."""
    kinds: list[Any] = [model]
    for part in path:
        kinds = [inner for kind in kinds for option in _options(kind) for inner in _inside(option, part)]
    return {name for kind in kinds for option in _options(kind) if _is_model(option) for name in option.model_fields}


def _options(kind: Any) -> list[Any]:
    """``kind`` without Annotated's metadata, a union as its members."""
    origin = get_origin(kind)
    if origin is Annotated:
        return _options(get_args(kind)[0])
    if origin in (Union, types.UnionType):
        return [option for member in get_args(kind) for option in _options(member)]
    return [kind]


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _inside(kind: Any, part: int | str) -> list[Any]:
    """What ``kind`` holds at ``part``: a model's field, a list's or tuple's item, a mapping's value."""
    origin, args = get_origin(kind), get_args(kind)
    if _is_model(kind) and isinstance(part, str):
        field = kind.model_fields.get(part)
        return [field.annotation] if field is not None else []
    if origin in (list, tuple, collections.abc.Sequence) and isinstance(part, int) and args:
        return [args[0]]
    if origin in (dict, collections.abc.Mapping) and len(args) == 2:
        return [args[1]]
    return []
