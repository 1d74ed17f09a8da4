"""request_id: keep the client's request id or make one, forward it upstream and echo it on the response."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from aiohttp import web
from multidict import istr
from pydantic import BaseModel, ConfigDict, Field

from ..core.http import new_request_id
from ..core.exchange import CTX, Handler, Middleware

if TYPE_CHECKING:
    from . import BuildContext

__all__ = ("NAME", "Options", "build")

NAME = "request_id"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    header: str = Field(default="X-Request-Id", pattern=r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
    # An incoming id is kept only if it looks like an id: it ends up in logs and upstream requests.
    trust_incoming: bool = True
    max_length: int = Field(default=128, ge=8, le=1024)


_SAFE_ID = re.compile(r"[A-Za-z0-9._:@/+=\-]+")


def build(options: Options, ctx: BuildContext) -> Middleware:
    header = istr(options.header)  # found without folding its case on every request
    trust = options.trust_incoming
    max_length = options.max_length

    async def request_id(request: web.BaseRequest, handler: Handler) -> web.StreamResponse:
        incoming = request.headers.get(header) if trust else None
        if incoming and len(incoming) <= max_length and _SAFE_ID.fullmatch(incoming):
            rid = incoming
        else:
            rid = new_request_id()
        state = request[CTX]
        state.request_id = rid
        state.upstream_headers[header] = rid
        response = await handler(request)
        response.headers[header] = rid
        return response

    return request_id
