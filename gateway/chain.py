"""Folding a route's policies around the terminal handler, once, when the route is built.

Order rule: the first policy listed is the outermost. It sees the request first and the response last.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from .typedefs import Handler, Middleware

__all__ = ("fold",)


def fold(middlewares: Sequence[Middleware], terminal: Handler) -> Handler:
    handler = terminal
    for middleware in reversed(middlewares):
        handler = partial(middleware, handler=handler)
    return handler
