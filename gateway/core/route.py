"""A route: a name, the methods and path templates it matches, and what its chain holds (built whole, once)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .template import PathTemplate

__all__ = ("Route",)


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """A named route: the methods and paths it matches, and the policies of its chain (its folded handler is kept by
    name in ``GatewayState.handlers``)."""

    name: str
    methods: frozenset[str] | None  # None: any method
    templates: tuple[str, ...]
    policies: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    # A policy of its chain enforces a security behaviour (legacy_upload_guard): an override must not route around it.
    guarded: bool = False
    params: frozenset[str] = frozenset()  # the parameters its templates name

    @classmethod
    def build(cls, name: str, methods: Iterable[str] | None, paths: Sequence[str], prefixes: Sequence[str], *,
              policies: Sequence[str] = (), guarded: bool = False) -> Route:
        templates = _templates(paths, prefixes)
        # Upstreams often route case-insensitively: so does the classifier (the path is forwarded as written).
        return cls(name, frozenset(m.upper() for m in methods) if methods else None, tuple(t.text for t in templates),
                   tuple(policies), tuple(t.pattern() for t in templates), guarded,
                   frozenset(p for t in templates for p in t.params))

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if self.methods is not None and method not in self.methods:
            return None
        return self.path_params(path)

    def path_params(self, path: str) -> dict[str, str] | None:
        """The parameters of the first of its paths that matches ``path`` (whatever the method); None: none does."""
        if not self.patterns:
            return {}
        for pattern in self.patterns:
            m = pattern.fullmatch(path)
            if m is not None:
                return m.groupdict()
        return None

    def template(self, path: str) -> str | None:
        """The template ``path`` matches (a trace's ``http.route``); None for a route that matches any path."""
        for template, pattern in zip(self.templates, self.patterns, strict=True):
            if pattern.fullmatch(path):
                return template
        return None


def _templates(paths: Sequence[str], prefixes: Sequence[str]) -> tuple[PathTemplate, ...]:
    """Each path under each prefix (or alone, with none), in that order."""
    return tuple(PathTemplate.of(prefix.rstrip("/") + path) for path in paths for prefix in (prefixes or ("",)))
