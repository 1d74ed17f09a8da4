"""Request logging and the bounded journal of what the sandbox received."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from aiohttp import web

from sandbox.errors import Handler
from sandbox.journal_types import BodyTap
from sandbox.responses import json_response
from sandbox.state import BODY_TAP, JOURNAL, SETTINGS

__all__ = ["CONTROL_PREFIX", "JOURNAL_PATH", "journal_middleware", "journal_routes"]

log = logging.getLogger("sandbox")

# Test controls live here: no token, never journaled.
CONTROL_PREFIX = "/_sandbox/"
JOURNAL_PATH = CONTROL_PREFIX + "journal"
_REDACTED_HEADERS = frozenset({"authorization", "proxy-authorization"})
_DRAIN_CHUNK = 64 * 1024


def _headers(request: web.Request) -> list[list[str]]:
    """Headers as received (order, case, repeats), secrets replaced."""
    pairs: list[list[str]] = []
    for raw_name, raw_value in request.raw_headers:
        name = raw_name.decode("latin-1")
        value = raw_value.decode("utf-8", "backslashreplace")
        pairs.append([name, "<redacted>" if name.lower() in _REDACTED_HEADERS else value])
    return pairs


async def _drain(request: web.Request, tap: BodyTap, cap: int) -> None:
    """Hash whatever body the handler left unread, up to ``cap`` bytes in all."""
    content = request.content
    try:
        while tap.length < cap:
            chunk = await content.read(min(_DRAIN_CHUNK, cap - tap.length))
            if not chunk:
                return
            tap.feed(chunk)
        if await content.read(1):
            tap.truncated = True
    except Exception:
        # A broken or abandoned body must not turn the answer into an error.
        tap.truncated = True


@web.middleware
async def journal_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    tap = BodyTap()
    request[BODY_TAP] = tap
    started = time.perf_counter()
    received_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    raw_path, _, raw_query = request.raw_path.partition("?")
    status = 500
    sent = 0
    try:
        response = await handler(request)
        status = response.status
        sent = response.content_length if response.content_length is not None else response.body_length
        await _drain(request, tap, request.app[SETTINGS].journal_body_cap)
        return response
    finally:
        # Path only: signed-link query strings are credentials.
        log.info(
            "%s %s %d in=%d out=%d %.1fms",
            request.method, raw_path, status, tap.length, sent, (time.perf_counter() - started) * 1000,
        )
        if not raw_path.startswith(CONTROL_PREFIX):
            request.app[JOURNAL].record(
                {
                    "received_at": received_at,
                    "method": request.method,
                    "path": raw_path,
                    "query_string": raw_query,
                    "headers": _headers(request),
                    "body_length": tap.length,
                    "body_sha256": tap.sha256,
                    "body_truncated": tap.truncated,
                    "uploads": tap.uploads,
                    "status": status,
                }
            )


async def _get_journal(request: web.Request) -> web.Response:
    return json_response(request, request.app[JOURNAL].entries(), conditional=False)


async def _clear_journal(request: web.Request) -> web.Response:
    request.app[JOURNAL].clear()
    return web.Response(status=204)


def journal_routes() -> list[web.RouteDef]:
    return [web.get(JOURNAL_PATH, _get_journal), web.delete(JOURNAL_PATH, _clear_journal)]
