"""JSON answers with exact lengths, strong ETags, conditional GET and
optional gzip."""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

from aiohttp import web

__all__ = ["accepts_gzip", "etag_for", "json_body", "json_response"]

_READ_METHODS = frozenset({"GET", "HEAD"})


def json_body(payload: Any) -> bytes:
    # ensure_ascii=False keeps non-ASCII text as UTF-8, which the gateway must
    # pass through byte for byte.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def etag_for(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def accepts_gzip(request: web.Request) -> bool:
    """RFC 9110 12.5.3: a ``gzip`` entry decides (``gzip;q=0`` refuses it);
    ``*`` only speaks for codings not named."""
    qualities: dict[str, float] = {}
    for item in request.headers.get("Accept-Encoding", "").split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        if coding not in ("gzip", "*"):
            continue
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        qualities[coding] = quality
    return qualities.get("gzip", qualities.get("*", 0.0)) > 0


def _matches(if_none_match: str, etag: str) -> bool:
    """Weak comparison, as If-None-Match requires."""
    opaque = etag.removeprefix("W/")
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == opaque:
            return True
    return False


def json_response(
    request: web.Request,
    payload: Any,
    *,
    status: int = 200,
    conditional: bool = True,
    gzip_allowed: bool = False,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """Serialize ``payload``; each representation (plain or gzip) gets its own
    strong ETag because the tag hashes the bytes actually sent."""
    body = json_body(payload)
    headers = dict(headers or {})
    if gzip_allowed:
        headers["Vary"] = "Accept-Encoding"
        if accepts_gzip(request):
            body = gzip.compress(body, compresslevel=6, mtime=0)
            headers["Content-Encoding"] = "gzip"
    if conditional and status == 200 and request.method in _READ_METHODS:
        etag = etag_for(body)
        headers["ETag"] = etag
        if_none_match = request.headers.get("If-None-Match")
        if if_none_match is not None and _matches(if_none_match, etag):
            headers.pop("Content-Encoding", None)
            return web.Response(status=304, headers=headers)
    return web.Response(
        status=status, body=body, headers=headers, content_type="application/json", charset="utf-8"
    )
