"""Serving file content: permanent public links of earlier files and
temporary signed links of restricted access files. Neither needs a token."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from sandbox.signing import (
    SIGNED_FILES_PATH,
    Disposition,
    LinkRejected,
    content_disposition,
    default_disposition,
    verify_link,
)
from sandbox.state import SETTINGS, STORE
from sandbox.store import StoredContent
from sandbox.views import PUBLIC_FILES_PATH

__all__ = ["download_routes"]

log = logging.getLogger("sandbox")


def _content_response(content: StoredContent, mime_type: str, name: str, disposition: Disposition,
                      cache_control: str) -> web.Response:
    if content.data is None:
        # Only size and hash were kept for uploads over the retention cap.
        return web.Response(status=410, text="File content was not retained by the sandbox")
    return web.Response(
        body=content.data,
        headers={
            "Content-Type": mime_type,
            "Content-Disposition": content_disposition(disposition, name),
            "Cache-Control": cache_control,
            "X-Content-Type-Options": "nosniff",
        },
    )


async def public_file(request: web.Request) -> web.Response:
    """Earlier files: anyone with the link can open them. Only the id counts,
    so renaming keeps old links working."""
    record = request.app[STORE].legacy_files.get(int(request.match_info["file_id"]))
    if record is None or record.content is None:
        return web.Response(status=404)
    disposition = default_disposition(record.mime_type, download=False)
    return _content_response(record.content, record.mime_type, record.name, disposition, "public, max-age=300")


async def signed_file(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    try:
        disposition = verify_link(request.app[SETTINGS].signing_secret, file_id, request.query, time.time())
    except LinkRejected as exc:
        log.info("signed link rejected: %s", exc)
        return web.Response(status=403)
    record = request.app[STORE].restricted_files.get(file_id)
    if record is None:
        return web.Response(status=404)
    return _content_response(record.content, record.mime_type, record.name, disposition, "private, no-store")


def download_routes() -> list[web.RouteDef]:
    return [
        web.get(PUBLIC_FILES_PATH + r"/{file_id:\d{1,18}}/{name:.+}", public_file),
        web.get(SIGNED_FILES_PATH + "/{file_id}", signed_file),
    ]
