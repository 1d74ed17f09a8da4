"""Applies the faults registered through ``/_sandbox/faults``."""

from __future__ import annotations

import asyncio

from aiohttp import web

from sandbox.errors import Handler
from sandbox.journal import CONTROL_PREFIX
from sandbox.responses import json_response
from sandbox.state import FAULTS

__all__ = ["INJECTED_FAULT_BODY", "fault_middleware"]

INJECTED_FAULT_BODY = {"message": "injected fault"}


@web.middleware
async def fault_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Runs inside the journal (which records the injected answer) and before
    the token check: a faulted request answers the fault whatever its token.
    Test controls under ``/_sandbox/`` are never faulted."""
    if request.path.startswith(CONTROL_PREFIX):
        return await handler(request)
    fault = request.app[FAULTS].take(request.method, request.path, request.query)
    if fault is not None:
        if fault.delay > 0:
            await asyncio.sleep(fault.delay)
        if fault.status is not None:
            return json_response(request, INJECTED_FAULT_BODY, status=fault.status, conditional=False)
    return await handler(request)
