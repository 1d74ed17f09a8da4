"""One canonical path normaliser, method-override detection, and the route table.

Requests are classified on the canonical path and the upstream receives that same path, so no spelling of a
path can reach the upstream as something other than what the policies saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import parse_qsl

from multidict import CIMultiDictProxy, istr

from .spec import TEMPLATE_PARAM_RE

__all__ = (
    "BadRequestTarget",
    "METHOD_OVERRIDE_HEADERS",
    "OVERRIDE_FIELD",
    "Route",
    "RouteTable",
    "Target",
    "compile_template",
    "effective_method",
    "method_overrides",
    "normalise_target",
    "override_fields",
    "valid_override",
)

# RFC 3986: unreserved characters are decoded when percent-encoded; every other escape is kept (upper-cased).
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Escapes that would change how a path splits into segments, or that upstreams treat specially.
_FORBIDDEN_ESCAPES = {0x2F: "an encoded '/'", 0x5C: "an encoded '\\'", 0x00: "an encoded NUL", 0x3B: "an encoded ';'"}
# pchar without ';' (matrix parameters are refused), plus '/' and '%' (escapes are checked one by one).
_PATH_CHARS_RE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=:@/%]*")
# A path that needs no rewriting: no escapes, no empty, '.' or '..' segments, no segment ending in a dot, no trailing
# slash.
_CLEAN_PATH_RE = re.compile(r"/|(?:/(?!\.{1,2}(?:/|$))[A-Za-z0-9\-._~!$&'()*+,=:@]*[A-Za-z0-9\-_~!$&'()*+,=:@])+")
_QUERY_BAD_RE = re.compile(r"[\x00-\x20\x7f#]")
_HEX = frozenset("0123456789abcdefABCDEF")
_TOKEN_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

METHOD_OVERRIDE_HEADERS = (istr("X-HTTP-Method-Override"), istr("X-Method-Override"), istr("X-HTTP-Method"))
# The form field (in the query, or in a form body: ``proxy.body_override``) that Rack, Symfony, Laravel and Express's
# method-override read as the method.
OVERRIDE_FIELD = "_method"


class BadRequestTarget(Exception):
    """A request that cannot be classified safely; answered with 400 and never forwarded."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Target(NamedTuple):
    path: str
    query: str
    authority: str | None  # set for an absolute-form target


def normalise_target(raw: str) -> Target:
    """Split a raw request-target into its canonical path and its raw query, or raise BadRequestTarget."""
    authority = None
    if not raw.startswith("/"):
        scheme, sep, rest = raw.partition("://")
        if not sep or scheme.lower() not in ("http", "https"):
            raise BadRequestTarget("BAD_REQUEST_TARGET", "the request target must be an absolute path")
        end = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
        authority, raw = rest[:end], rest[end:]
        if not authority or "@" in authority:
            raise BadRequestTarget("BAD_REQUEST_TARGET", "the absolute-form request target has no valid authority")
        if not raw.startswith("/"):
            raw = "/" + raw
    path, _, query = raw.partition("?")
    if "#" in path or (query and _QUERY_BAD_RE.search(query)):
        raise BadRequestTarget("BAD_REQUEST_TARGET", "the request target contains characters not allowed in a URI")
    if not _CLEAN_PATH_RE.fullmatch(path):
        path = _canonical_path(path)
    return Target(path, query, authority)


def _canonical_path(path: str) -> str:
    if not _PATH_CHARS_RE.fullmatch(path):
        if ";" in path:
            raise BadRequestTarget("BAD_PATH", "path parameters (';') are not accepted")
        if "\\" in path:
            raise BadRequestTarget("BAD_PATH", "a backslash is not accepted in the path")
        raise BadRequestTarget("BAD_PATH", "the path contains characters not allowed in a URI path")
    if "%" in path:
        path = _decode_unreserved(path)
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        if segment.endswith((".", "%20")):
            # Upstreams on IIS and .NET-style stacks (and some static servers) trim trailing dots and spaces from a
            # segment: "files." would reach them as "files", a route this spelling did not match here.
            raise BadRequestTarget("BAD_PATH", "a path segment ends with a dot or a space")
        segments.append(segment)
    return "/" + "/".join(segments)


def _decode_unreserved(path: str) -> str:
    out: list[str] = []
    i = 0
    n = len(path)
    while i < n:
        ch = path[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        hexdigits = path[i + 1 : i + 3]
        if len(hexdigits) != 2 or not set(hexdigits) <= _HEX:
            raise BadRequestTarget("BAD_PATH", "the path contains an invalid percent-encoding")
        byte = int(hexdigits, 16)
        if byte in _FORBIDDEN_ESCAPES:
            raise BadRequestTarget("BAD_PATH", f"the path contains {_FORBIDDEN_ESCAPES[byte]}")
        if byte < 0x20 or byte == 0x7F:
            raise BadRequestTarget("BAD_PATH", "the path contains an encoded control character")
        out.append(chr(byte) if byte in _UNRESERVED else "%" + hexdigits.upper())
        i += 3
    return "".join(out)


def method_overrides(headers: CIMultiDictProxy[str], query: str) -> set[str]:
    """The methods the override headers and the query's ``_method`` name (upper-cased; empty: no override)."""
    overrides: set[str] = set()
    for name in METHOD_OVERRIDE_HEADERS:
        if name in headers:
            overrides.update(v.strip().upper() for v in headers.getall(name))
    if query:
        overrides.update(override_fields(query))
    return overrides


def override_fields(form: str, encoding: str = "utf-8") -> list[str]:
    """The values of the ``_method`` fields of a query or of a urlencoded form body (upper-cased, in order)."""
    if OVERRIDE_FIELD not in (lowered := form.lower()) and "%" not in lowered:
        return []  # no field can be named _method
    # Some frameworks split a form on ';' as well as '&' (HTML 4's recommendation, older Python, Perl's CGI):
    # "?a=1;_method=PUT" is an override there.
    pairs = parse_qsl(form.replace(";", "&"), keep_blank_values=True, encoding=encoding)
    return [v.strip().upper() for k, v in pairs if k.lower() == OVERRIDE_FIELD]


def valid_override(method: str, overrides: set[str]) -> str:
    """The one method ``overrides`` agree on, for a request sent with ``method``; BadRequestTarget otherwise."""
    if len(overrides) > 1:
        raise BadRequestTarget("AMBIGUOUS_METHOD", "the request carries method overrides that disagree")
    (override,) = overrides
    if not _TOKEN_RE.fullmatch(override):
        raise BadRequestTarget("AMBIGUOUS_METHOD", "the method override is not a valid method name")
    if override in ("HEAD", "CONNECT") and override != method:
        # The upstream receives the effective method: a HEAD answer has no body for the client's non-HEAD request.
        raise BadRequestTarget("AMBIGUOUS_METHOD", f"a method override to {override} is not accepted")
    return override


def effective_method(method: str, headers: CIMultiDictProxy[str], query: str) -> str:
    """The method an upstream may act on: the request line's, unless an override header or ``_method`` says otherwise.

    Several overrides that disagree are refused: the gateway cannot know which one the upstream honours. (A form
    body's ``_method`` is read later, where it matters: ``proxy.body_override``.)
    """
    overrides = method_overrides(headers, query)
    return valid_override(method, overrides) if overrides else method


def compile_template(template: str) -> str:
    """Turn ``/cards/{card_id}/files`` into a regex fragment; each parameter matches one path segment."""
    pos = 0
    parts: list[str] = []
    for m in TEMPLATE_PARAM_RE.finditer(template):
        parts.append(re.escape(template[pos : m.start()]))
        parts.append(f"(?P<{m.group(1)}>[^/]+)")
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return "".join(parts)


@dataclass(slots=True, eq=False)
class Route:
    """A named route: the methods and paths it matches, and the policies of its chain (the folded handler is kept by
    name in ``GatewayState.handlers``)."""

    name: str
    methods: frozenset[str] | None  # None: any method
    templates: tuple[str, ...]
    policies: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    # A policy of its chain enforces a security behaviour (legacy_upload_guard): an override must not route around it.
    guarded: bool = False

    @classmethod
    def build(
        cls, name: str, methods: Iterable[str] | None, paths: Sequence[str], prefixes: Sequence[str]
    ) -> Route:
        templates = tuple(prefix.rstrip("/") + path for path in paths for prefix in (prefixes or ("",)))
        # Upstreams often route case-insensitively: so does the classifier (the path is forwarded as written).
        patterns = tuple(re.compile(compile_template(t), re.IGNORECASE) for t in templates)
        return cls(name, frozenset(m.upper() for m in methods) if methods else None, templates, patterns=patterns)

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if self.methods is not None and method not in self.methods:
            return None
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

    def matches_path(self, path: str) -> bool:
        """Whether one of its paths matches ``path``, whatever the method."""
        return not self.patterns or any(pattern.fullmatch(path) for pattern in self.patterns)


class RouteTable:
    """Routes in declaration order; the first match wins, and the catch-all answers the rest."""

    def __init__(self, routes: Sequence[Route], catch_all: Route) -> None:
        self.routes = tuple(routes)
        self.catch_all = catch_all
        # The guarded routes, each with the methods an override would need to reach it (any method: PUT stands for
        # them), worked out once: their ``guarded`` flags are set before the table is built (``app.build_state``).
        self._guarded = tuple((r, tuple(r.methods) if r.methods is not None else ("PUT",)) for r in self.routes
                              if r.guarded)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        for route in self.routes:
            params = route.match(method, path)
            if params is not None:
                return route, params
        return self.catch_all, {}

    def override_reaches_guard(self, route: Route, path: str) -> bool:
        """Whether a method override could take a request for ``path``, classified on ``route``, to another route
        whose chain is guarded."""
        for other, methods in self._guarded:
            # Its own paths first (a regex or two): most requests are for paths no guarded route has.
            if other is route or not other.matches_path(path):
                continue
            if any(self.match(method, path)[0] is other for method in methods):
                return True
        return False
