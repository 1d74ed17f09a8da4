"""Error answers in the shapes the service uses: 401 with a string, 403 and
404 without a body, validation errors as JSON ``{"message": ...}``."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from aiohttp import web

__all__ = ["ApiError", "Handler", "error_middleware"]

log = logging.getLogger("sandbox")

_Shape = Literal["json", "text", "empty"]


class ApiError(Exception):
    def __init__(self, status: int, message: str | None = None, shape: _Shape = "empty") -> None:
        super().__init__(message or str(status))
        self.status = status
        self.message = message
        self.shape = shape

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message, "json")

    @classmethod
    def unauthorized(cls) -> ApiError:
        return cls(401, "Invalid token", "text")

    @classmethod
    def forbidden(cls) -> ApiError:
        return cls(403)

    @classmethod
    def not_found(cls) -> ApiError:
        return cls(404)

    def response(self) -> web.Response:
        if self.shape == "json":
            body = json.dumps({"message": self.message}, ensure_ascii=False).encode()
            return web.Response(status=self.status, body=body, content_type="application/json", charset="utf-8")
        if self.shape == "text":
            headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
            return web.Response(status=self.status, text=self.message or "", headers=headers)
        return web.Response(status=self.status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        # Unmatched paths and methods look alike to clients: 404, no body.
        return web.Response(status=404)
    except web.HTTPRequestEntityTooLarge:
        return ApiError(413, "Request body too large", "json").response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return ApiError(exc.status, exc.reason, "json").response()
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return ApiError(500, "Internal sandbox error", "json").response()
