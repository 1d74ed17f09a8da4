"""A token's request rate limit, as SaaS services of this kind have one (the ``rate_limit`` setting, ``--rate-limit``):
at most N requests a second per token (windows of one second of the sandbox's monotonic clock). Every answer under
/api says ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (seconds until the window resets); a request over the
limit gets ``429`` with ``Retry-After`` (whole seconds) and a JSON message, and reaches no handler. The journal
records the 429s like any answer."""

from __future__ import annotations

import math
import time

from aiohttp import web

from sandbox.auth import API_PREFIX
from sandbox.errors import Handler
from sandbox.state import RATE_WINDOWS, SETTINGS

__all__ = ["rate_limit_middleware"]


@web.middleware
async def rate_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    limit = request.app[SETTINGS].rate_limit
    if limit is None or not (request.path + "/").startswith(API_PREFIX):
        return await handler(request)
    token = request.headers.get("Authorization", "")
    taken, left, reset = request.app[RATE_WINDOWS].take(token, limit, time.monotonic())
    headers = {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": str(left), "X-RateLimit-Reset": f"{reset:.3f}"}
    if not taken:
        headers["Retry-After"] = str(max(1, math.ceil(reset)))
        return web.json_response({"message": f"Rate limit of {limit} requests a second exceeded"}, status=429,
                                 headers=headers)
    response = await handler(request)
    response.headers.update(headers)
    return response
