"""request_id: keep the client's request id or make one, forward it upstream and echo it on every answer.

Every request the gateway sends upstream for the exchange carries it under ``header``: the client's own and each
request of a policy's own (the proxy core adds it, ``Exchange.request_id_header``)."""

from __future__ import annotations

import re

from multidict import istr
from pydantic import BaseModel, ConfigDict, Field

from ..core.exchange import Exchange, Next, Policy, Reply
from ..core.http import new_request_id
from .base import BuildContext, PolicySpec

__all__ = ("NAME", "Options", "SPEC", "build")

NAME = "request_id"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    header: str = Field(default="X-Request-Id", pattern=r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
    # An incoming id is kept only if it looks like an id: it ends up in logs and upstream requests.
    trust_incoming: bool = True
    max_length: int = Field(default=128, ge=8, le=1024)


_SAFE_ID = re.compile(r"[A-Za-z0-9._:@/+=\-]+")


def build(options: Options, ctx: BuildContext) -> Policy:
    header = istr(options.header)  # found without folding its case on every request
    trust = options.trust_incoming
    max_length = options.max_length

    async def request_id(exchange: Exchange, next: Next) -> Reply:
        incoming = exchange.headers.get(header) if trust else None
        if incoming and len(incoming) <= max_length and _SAFE_ID.fullmatch(incoming):
            rid = incoming
        else:
            rid = new_request_id()
        exchange.request_id = rid
        exchange.request_id_header = header
        reply = await next(exchange)
        reply.headers[header] = rid
        return reply

    return request_id


SPEC = PolicySpec(NAME, Options, build)
