"""Every option of the config is set somewhere: in a test, the shipped config, a benchmark or the deployment files
(issue 33: 12 of them were set nowhere, their effect never seen). The options are every leaf of every model, the
gateway's sections and each policy's options; "set" is a key written with a value (YAML ``key:``, a dict's
``"key":``, a keyword ``key=``), outside comments. A lower bound, not a proof: a key's name may be set for another
section's option of the same name, or only to a value the test expects refused."""

from __future__ import annotations

import os
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel

from gateway.config import GatewayConfig
from gateway.policies import POLICIES

ROOT = Path(__file__).resolve().parent.parent
WHERE = ("tests", "config", "bench", "deploy")
SUFFIXES = {".py", ".yaml", ".yml", ".json", ".sh"}


def _models(kind: Any) -> list[type[BaseModel]]:
    origin = get_origin(kind)
    if origin is Annotated:
        return _models(get_args(kind)[0])
    if origin is not None or isinstance(kind, types.UnionType):
        return [model for arg in get_args(kind) for model in _models(arg)]
    return [kind] if isinstance(kind, type) and issubclass(kind, BaseModel) else []


def leaves(model: type[BaseModel], prefix: str = "", seen: tuple[type[BaseModel], ...] = ()) -> Iterator[str]:
    """Each option of ``model`` as its dotted path (a nested model's options instead of the model's key)."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        inner = [m for m in _models(field.annotation) if m not in seen]
        if inner:
            for nested in inner:
                yield from leaves(nested, f"{prefix}{key}.", (*seen, nested))
        else:
            yield f"{prefix}{key}"


def every_option() -> list[str]:
    options = set(leaves(GatewayConfig))
    for name, spec in POLICIES.items():
        options |= set(leaves(spec.options, f"{name}."))
    return sorted(options)


def _texts(root: Path = ROOT) -> list[str]:
    texts = []
    for where in WHERE:
        for directory, subdirectories, files in os.walk(root / where):
            subdirectories[:] = [d for d in subdirectories if d not in ("node_modules", "__pycache__")]
            texts += [(Path(directory) / name).read_text(errors="replace") for name in files
                      if Path(name).suffix in SUFFIXES and name != Path(__file__).name]
    return texts


def _set_somewhere(key: str, texts: list[str]) -> bool:
    k = re.escape(key)
    written = re.compile(rf"""^[^#\n]*?(["']{k}["']\s*[:\]]|\b{k}\s*=(?!=)|^\s*-?\s*{k}\s*:|[{{,]\s*{k}\s*:)""", re.M)
    for text in texts:
        at = text.find(key)
        while at != -1:  # only the lines that name the key are matched against the pattern
            start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
            if written.search(text, start, len(text) if end == -1 else end):
                return True
            at = text.find(key, at + len(key))
    return False


def unset(root: Path = ROOT) -> list[str]:
    texts = _texts(root)
    return [option for option in every_option() if not _set_somewhere(option.rsplit(".", 1)[-1], texts)]


def test_every_option_is_set_somewhere() -> None:
    assert len(every_option()) > 150
    assert unset() == []


def test_an_option_set_nowhere_is_found() -> None:
    texts = ["routes:\n  # prefixes: [/v2]\n  - name: x\n", 'x = {"prefix": 1}\nf(max_length=2)\n']
    assert not _set_somewhere("prefixes", texts)
    assert _set_somewhere("prefix", texts) and _set_somewhere("max_length", texts)
    assert _set_somewhere("prefixes", ['route["prefixes"] = ["/v2"]'])
