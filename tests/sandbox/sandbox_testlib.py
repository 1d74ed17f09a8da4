"""Constants and helpers shared by the sandbox tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient

__all__ = ["AUTH", "BOUNDARY", "READONLY", "SECRET", "TOKEN", "ClientFactory", "raw_multipart"]

TOKEN = "sandbox-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READONLY = {"Authorization": "Bearer sandbox-readonly"}
SECRET = b"sandbox-test-secret"
BOUNDARY = "sandbox-test-boundary-7d1f"

ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


def raw_multipart(parts: list[tuple[str, str | None, str | None, bytes]]) -> tuple[bytes, dict[str, str]]:
    """Exact multipart bytes, so tests can hash what went over the wire.

    Each part is (field name, filename or None, content type or None, data).
    """
    chunks: list[bytes] = []
    for name, filename, content_type, data in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        head = f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
        if content_type is not None:
            head += f"Content-Type: {content_type}\r\n"
        chunks += [head.encode(), b"\r\n", data, b"\r\n"]
    chunks.append(f"--{BOUNDARY}--\r\n".encode())
    return b"".join(chunks), {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
