"""Reading request bodies while the journal tap sees every byte once.

Uploads are parsed with aiohttp's multipart reader over a stream wrapper
that hashes what it pulls from the connection, so large files are never
held whole unless small enough to retain.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import BodyPartReader, MultipartReader, StreamReader, web
from aiohttp.http_exceptions import HttpProcessingError

from sandbox.errors import ApiError
from sandbox.journal_types import BodyTap
from sandbox.state import SETTINGS, body_tap
from sandbox.store import StoredContent

__all__ = [
    "MALFORMED_MULTIPART",
    "HashingStream",
    "ReceivedFile",
    "is_multipart",
    "open_multipart",
    "part_name",
    "read_json_object",
    "read_text_part",
    "receive_file",
]

_CHUNK = 256 * 1024
# Exceptions aiohttp's multipart parser raises for malformed input.
MALFORMED_MULTIPART = (ValueError, AssertionError, HttpProcessingError, RuntimeError)


class HashingStream:
    """The part of StreamReader the multipart reader uses, feeding the tap.

    Data the parser pushes back is kept here rather than in the inner stream,
    so each byte from the connection is hashed exactly once, in order.
    """

    def __init__(self, inner: StreamReader, tap: BodyTap) -> None:
        self._inner = inner
        self._tap = tap
        self._pushback = bytearray()

    def at_eof(self) -> bool:
        return not self._pushback and self._inner.at_eof()

    def unread_data(self, data: bytes) -> None:
        self._pushback[:0] = data

    async def read(self, n: int = -1) -> bytes:
        if self._pushback:
            size = len(self._pushback) if n < 0 else n
            chunk = bytes(self._pushback[:size])
            del self._pushback[:size]
            return chunk
        chunk = await self._inner.read(n)
        self._tap.feed(chunk)
        return chunk

    async def readline(self, *, max_line_length: int | None = None) -> bytes:
        head = b""
        if self._pushback:
            end = self._pushback.find(b"\n")
            if end >= 0:
                line = bytes(self._pushback[: end + 1])
                del self._pushback[: end + 1]
                return line
            head = bytes(self._pushback)
            self._pushback.clear()
        line = await self._inner.readline(max_line_length=max_line_length)
        self._tap.feed(line)
        return head + line


@dataclass(slots=True)
class ReceivedFile:
    field: str
    name: str
    mime_type: str
    content: StoredContent


def is_multipart(request: web.Request) -> bool:
    return request.content_type.startswith("multipart/")


def open_multipart(request: web.Request) -> MultipartReader:
    if not is_multipart(request):
        raise ApiError.bad_request("Content-Type must be multipart/form-data")
    stream = HashingStream(request.content, body_tap(request))
    try:
        return MultipartReader(request.headers, cast(StreamReader, stream))
    except (ValueError, AssertionError) as exc:
        raise ApiError.bad_request(f"Malformed multipart body: {exc}") from None


def part_name(part: BodyPartReader | MultipartReader) -> str | None:
    return part.name if isinstance(part, BodyPartReader) else None


def _mime_type(part: BodyPartReader, filename: str) -> str:
    declared = part.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if declared and declared != "application/octet-stream":
        return declared
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    return guessed or declared or "application/octet-stream"


async def receive_file(request: web.Request, part: BodyPartReader) -> ReceivedFile:
    """Stream one part to a hash, keeping the bytes only up to the retention cap."""
    cap = request.app[SETTINGS].max_retained_file_bytes
    digest = hashlib.sha256()
    size = 0
    kept: bytearray | None = bytearray()
    while chunk := await part.read_chunk(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if kept is not None:
            if size > cap:
                kept = None
            else:
                kept.extend(chunk)
    name = part.filename or part.name or "file"
    received = ReceivedFile(
        field=part.name or "",
        name=name,
        mime_type=_mime_type(part, name),
        content=StoredContent(size=size, sha256=digest.hexdigest(), data=None if kept is None else bytes(kept)),
    )
    body_tap(request).uploads.append(
        {
            "field": received.field,
            "name": received.name,
            "size": size,
            "sha256": received.content.sha256,
            "retained": kept is not None,
        }
    )
    return received


async def read_text_part(request: web.Request, part: BodyPartReader) -> str:
    limit = request.app[SETTINGS].max_json_body_bytes
    data = bytearray()
    while chunk := await part.read_chunk(_CHUNK):
        data.extend(chunk)
        if len(data) > limit:
            raise ApiError(413, "Form field too large", "json")
    try:
        return data.decode(part.get_charset("utf-8"))
    except (UnicodeDecodeError, LookupError):
        raise ApiError.bad_request(f"Form field {part.name} is not valid text") from None


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """Read a small JSON object body through the tap."""
    limit = request.app[SETTINGS].max_json_body_bytes
    tap = body_tap(request)
    data = bytearray()
    while chunk := await request.content.read(_CHUNK):
        tap.feed(chunk)
        data.extend(chunk)
        if len(data) > limit:
            raise ApiError(413, "Request body too large", "json")
    try:
        payload = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ApiError.bad_request("Request body must be valid JSON") from None
    if not isinstance(payload, dict):
        raise ApiError.bad_request("Request body must be a JSON object")
    return payload
