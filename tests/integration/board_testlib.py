"""The board_cards integration tests share these: the board route with its chain, and an upstream that answers a JSON
board with an ETag (and 304 to a matching If-None-Match)."""

from __future__ import annotations

import gzip
from typing import Any

from aiohttp import web

from tests.gateway_testlib import Received, Responder, make_config

BOARD_ROUTE = {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}", "/spaces/{space_id}/boards/{board_id}"]}


def board_config(upstream_url: str, *, options: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None,
                 tenant_rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    route = {**BOARD_ROUTE, "chain": [{"board_cards": options or {}}]}
    config = make_config(upstream_url, routes=[route], rollout=rollout or {})
    if tenant_rollout is not None:
        config["tenants"][0]["rollout"] = tenant_rollout
    return config


def json_responder(body: bytes, *, status: int = 200, headers: dict[str, str] | None = None,
                   etag: str | None = '"v1"', gzip_always: bool = False) -> Responder:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        out_headers = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
        if etag is not None:
            out_headers["ETag"] = etag
            if request.headers.get("If-None-Match") in (etag, f"W/{etag}", "*") and status == 200:
                return web.Response(status=304, headers=out_headers)
        payload = body
        if gzip_always:
            payload = gzip.compress(body)
            out_headers["Content-Encoding"] = "gzip"
        return web.Response(status=status, body=payload, headers=out_headers)

    return responder
