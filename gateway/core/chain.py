"""Folding a route's policies around the terminal handler, once, when the route is built.

Order rule: the first policy listed is the outermost. It sees the request first and the response last.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from aiohttp import web

from .exchange import Handler, Middleware

__all__ = ("fold",)


def fold(middlewares: Sequence[Middleware], terminal: Handler) -> Handler:
    handler = terminal
    for middleware in reversed(middlewares):
        handler = _bind(middleware, handler)
    return handler


def _bind(middleware: Middleware, handler: Handler) -> Handler:
    # A closure rather than functools.partial(middleware, handler=handler): a keyword partial builds a dict per call.
    def bound(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        return middleware(request, handler)

    return bound
