"""The public listener: aiohttp's low-level server, with every request (parsed or not) handed to the gateway's edge.

A request the HTTP parser rejects goes through the same edge as every other (``Edge.serve_unparsed``), so it gets
a JSON answer whose text never quotes the request's bytes, and exactly one record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from . import aiohttp_private  # noqa: F401 - checks, at import, the private API used below

__all__ = ("Edge", "Listener")


class Edge(Protocol):
    async def serve(self, request: web.BaseRequest) -> web.StreamResponse: ...

    async def serve_unparsed(
        self, request: web.BaseRequest, status: int, exc: BaseException | None
    ) -> web.StreamResponse: ...


class _Connection(RequestHandler):
    def _make_error_handler(self, err_info: Any) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        manager = self._manager
        assert isinstance(manager, Listener)
        edge = manager.edge
        status: int = err_info.status
        exc: BaseException | None = err_info.exc

        def handler(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
            return edge.serve_unparsed(request, status, exc)

        return handler

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        # Reached only when the edge let a ConnectionError out: its response was cut part way on purpose (the client
        # or the upstream's body went away), and it has recorded the request. aiohttp then closes the connection.
        raise ConnectionError("the response was cut off part way")


class Listener(web.Server):
    """The low-level server, with the gateway's connection handler."""

    def __init__(self, edge: Edge, **kwargs: Any) -> None:
        super().__init__(edge.serve, **kwargs)
        self.edge = edge

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)
