"""Path templates, in one type: ``/cards/{card_id}/files``, each ``{name}`` one path segment (spec, "Endpoints").
Routes match requests with them, the upload guard names its replacement route with one, the upload bridge sends
its requests with them, and the config checks them; each is split once, when it is built. A route's parameter may
name the shape its segment must have (``{card_id:not_uuid}``, ``{card_uid:uuid}``): the restricted file routes take
UUIDs, and the same path with an earlier (numeric) id is another route."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ("PARAM", "ROUTE_PARAM", "SHAPES", "PathTemplate")

# One path parameter in a template: ``{card_id}``.
PARAM = r"\{[A-Za-z_][A-Za-z0-9_]*\}"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# What a route's parameter may require of its segment (the patterns are matched case-insensitively).
SHAPES = {
    "uuid": _UUID,
    # Anything but a UUID: an earlier numeric id, or whatever else a client put in a uid's place.
    "not_uuid": rf"(?!{_UUID}(?![^/]))[^/]+",
}
# One path parameter of a route's path, with its shape if it names one: ``{card_id:not_uuid}``.
ROUTE_PARAM = rf"\{{[A-Za-z_][A-Za-z0-9_]*(?::(?:{'|'.join(SHAPES)}))?\}}"
_PARAM_RE = re.compile(rf"\{{([A-Za-z_][A-Za-z0-9_]*)(?::({'|'.join(SHAPES)}))?\}}")
# A parameter's segment, by its shape (None: any segment).
_SEGMENTS: dict[str | None, str] = {None: "[^/]+"}
_SEGMENTS.update(SHAPES)


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """A template split into its pieces: (text, False) for literal text, (name, True) for a parameter; ``shapes``:
    (name, shape) for each parameter (None: it names none)."""

    text: str
    pieces: tuple[tuple[str, bool], ...]
    shapes: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def of(cls, text: str) -> PathTemplate:
        pieces: list[tuple[str, bool]] = []
        shapes: list[tuple[str, str | None]] = []
        pos = 0
        for m in _PARAM_RE.finditer(text):
            pieces += [(text[pos : m.start()], False), (m.group(1), True)]
            shapes.append((m.group(1), m.group(2)))
            pos = m.end()
        pieces.append((text[pos:], False))
        return cls(text, tuple(p for p in pieces if p[0]), tuple(shapes))

    @property
    def params(self) -> tuple[str, ...]:
        """The parameters' names, in order."""
        return tuple(text for text, param in self.pieces if param)

    def pattern(self) -> re.Pattern[str]:
        """A regex matching a path the template names (case-insensitively: upstreams often route so), each
        parameter one segment of its shape, captured under its name."""
        shapes = dict(self.shapes)
        return re.compile("".join(f"(?P<{text}>{_SEGMENTS[shapes[text]]})" if param else re.escape(text)
                                  for text, param in self.pieces), re.IGNORECASE)

    def render(self, values: Mapping[str, str], *, encode: bool = False) -> str:
        """The path with each parameter filled in (``encode``: percent-encoded, for a request of the gateway's own);
        a parameter ``values`` lacks stays as written (``{name}``)."""
        out = []
        for text, param in self.pieces:
            if not param:
                out.append(text)
            elif text in values:
                out.append(quote(values[text], safe="") if encode else values[text])
            else:
                out.append("{" + text + "}")
        return "".join(out)

    def fills(self, names: frozenset[str] | Mapping[str, str]) -> bool:
        """Whether every parameter is among ``names``."""
        return all(text in names for text, param in self.pieces if param)
