"""Small HTTP helpers shared by the app, the policies and the proxy core."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from aiohttp import hdrs, web
from multidict import CIMultiDictProxy

__all__ = ("HOP_BY_HOP", "connection_tokens", "ensure_continue", "json_error", "new_request_id")

# RFC 9110 7.6.1 (and the de facto Keep-Alive and Proxy-Connection): never forwarded by a proxy.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

_PLAIN_CONNECTION = frozenset({"keep-alive", "close"})
_NO_TOKENS: frozenset[str] = frozenset()
_CONTINUE_SENT = web.RequestKey("gateway_continue_sent", bool)


def connection_tokens(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    """Header names listed in Connection: hop-by-hop for this message only."""
    values = headers.getall(hdrs.CONNECTION, ())
    if not values:
        return _NO_TOKENS
    if len(values) == 1 and values[0].strip().lower() in _PLAIN_CONNECTION:
        return _NO_TOKENS  # the common case: names no header
    return frozenset(t.strip().lower() for v in values for t in v.split(",") if t.strip())


async def ensure_continue(request: web.BaseRequest) -> None:
    """Send ``100 Continue`` once, just before the body is first read, if the client asked for it.

    The gateway never answers ``Expect`` up front: a request refused on its headers gets its final answer
    without the client having been invited to send the body.
    """
    if request.get(_CONTINUE_SENT) or request.version < (1, 1):
        return
    if request.headers.get("Expect", "").lower() != "100-continue":
        return
    request[_CONTINUE_SENT] = True
    writer = request.writer
    await writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


class _RequestIds:
    """128 random bits from os.urandom as 32 hex digits, drawn 4 KiB at a time: one getrandom(2) per 256 ids."""

    __slots__ = ("_hex", "_next")

    def __init__(self) -> None:
        self._hex = ""
        self._next = 0

    def __call__(self) -> str:
        start = self._next
        if start >= len(self._hex):
            self._hex = os.urandom(4096).hex()
            start = 0
        self._next = start + 32
        return self._hex[start : start + 32]

    def forget(self) -> None:
        self._hex = ""
        self._next = 0


new_request_id = _RequestIds()
# A forked child draws its own bits: it must not hand out the ids its parent has buffered.
os.register_at_fork(after_in_child=new_request_id.forget)


def json_error(
    status: int, code: str, message: str, request_id: str | None = None, extra: Iterable[tuple[str, str]] = ()
) -> web.Response:
    body: dict[str, str] = {"code": code, "message": message}
    if request_id:
        body["request_id"] = request_id
    body.update(extra)
    response = web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
    )
    return response
