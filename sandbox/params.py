"""Reading request parameters and the address clients reach the sandbox at."""

from __future__ import annotations

import re

from aiohttp import web

from sandbox.errors import ApiError
from sandbox.state import SETTINGS

__all__ = ["MAX_LIMIT", "base_url", "query_bool", "query_int"]

# Largest page the card list serves (its ``limit`` maximum).
MAX_LIMIT = 100

_INTEGER = re.compile(r"-?[0-9]{1,18}")
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})


def base_url(request: web.Request) -> str:
    """Configured public address, else the one the client used, as told by a
    proxy in X-Forwarded-Proto / X-Forwarded-Host when present."""
    configured = request.app[SETTINGS].public_base_url
    if configured:
        return configured.rstrip("/")
    proto = request.headers.get("X-Forwarded-Proto", "").split(",", 1)[0].strip()
    host = request.headers.get("X-Forwarded-Host", "").split(",", 1)[0].strip()
    return f"{proto or request.scheme}://{host or request.host}"


def query_int(request: web.Request, name: str, default: int | None, *, minimum: int = 0,
              maximum: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        raise ApiError.bad_request(f"Query parameter {name} must be an integer")
    value = int(text)
    if value < minimum:
        raise ApiError.bad_request(f"Query parameter {name} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ApiError.bad_request(f"Query parameter {name} must be at most {maximum}")
    return value


def query_bool(request: web.Request, name: str) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ApiError.bad_request(f"Query parameter {name} must be true or false")
