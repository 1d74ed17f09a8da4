"""The canonical path: the one spelling of a request target that is classified and sent upstream, or a clear 400.

No spelling of a path can reach the upstream as something other than what the policies saw
(docs/proxying.md, "One canonical path").
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ("BadRequestTarget", "Target", "normalise_target")

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
        authority, raw = _absolute_form(raw)
    path, _, query = raw.partition("?")
    if "#" in path or (query and _QUERY_BAD_RE.search(query)):
        raise BadRequestTarget("BAD_REQUEST_TARGET", "the request target contains characters not allowed in a URI")
    if not _CLEAN_PATH_RE.fullmatch(path):
        path = _canonical_path(path)
    return Target(path, query, authority)


def _absolute_form(raw: str) -> tuple[str, str]:
    """An absolute-form target's authority and its path and query (the path at least "/")."""
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise BadRequestTarget("BAD_REQUEST_TARGET", "the request target must be an absolute path")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
    authority, raw = rest[:end], rest[end:]
    if not authority or "@" in authority:
        raise BadRequestTarget("BAD_REQUEST_TARGET", "the absolute-form request target has no valid authority")
    return authority, raw if raw.startswith("/") else "/" + raw


def _bad_characters(path: str) -> BadRequestTarget:
    """Why a path with characters outside a URI path's is refused."""
    if ";" in path:
        return BadRequestTarget("BAD_PATH", "path parameters (';') are not accepted")
    if "\\" in path:
        return BadRequestTarget("BAD_PATH", "a backslash is not accepted in the path")
    return BadRequestTarget("BAD_PATH", "the path contains characters not allowed in a URI path")


def _canonical_path(path: str) -> str:
    if not _PATH_CHARS_RE.fullmatch(path):
        raise _bad_characters(path)
    if "%" in path:
        path = _decode_unreserved(path)
    return "/" + "/".join(_segments(path))


def _segments(path: str) -> list[str]:
    """The path's segments with the empty and '.' ones dropped and each '..' applied."""
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
    return segments


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
        out.append(_escape(path[i + 1 : i + 3]))
        i += 3
    return "".join(out)


def _escape(hexdigits: str) -> str:
    """A percent-encoding's two digits: the character when it is unreserved, else the escape upper-cased."""
    if len(hexdigits) != 2 or not set(hexdigits) <= _HEX:
        raise BadRequestTarget("BAD_PATH", "the path contains an invalid percent-encoding")
    byte = int(hexdigits, 16)
    if byte in _FORBIDDEN_ESCAPES:
        raise BadRequestTarget("BAD_PATH", f"the path contains {_FORBIDDEN_ESCAPES[byte]}")
    if byte < 0x20 or byte == 0x7F:
        raise BadRequestTarget("BAD_PATH", "the path contains an encoded control character")
    return chr(byte) if byte in _UNRESERVED else "%" + hexdigits.upper()
