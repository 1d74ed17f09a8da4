"""Bearer-token checks for everything under /api."""

from __future__ import annotations

from aiohttp import web

from sandbox.errors import ApiError, Handler
from sandbox.state import SETTINGS

__all__ = ["API_PREFIX", "auth_middleware", "bearer_token"]

API_PREFIX = "/api/"
_READ_METHODS = frozenset({"GET", "HEAD"})


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not (request.path + "/").startswith(API_PREFIX):
        return await handler(request)
    settings = request.app[SETTINGS]
    token = bearer_token(request.headers.get("Authorization"))
    if token is None or not settings.is_valid_token(token):
        raise ApiError.unauthorized()
    if settings.is_readonly_token(token) and request.method not in _READ_METHODS:
        raise ApiError.forbidden()
    return await handler(request)
