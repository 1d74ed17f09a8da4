"""Temporary signed links for restricted access files and how files are
presented when downloaded."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Literal
from urllib.parse import quote, urlencode

__all__ = [
    "Disposition",
    "LinkRejected",
    "SIGNED_FILES_PATH",
    "content_disposition",
    "default_disposition",
    "link_signature",
    "signed_path",
    "verify_link",
]

Disposition = Literal["inline", "attachment"]
SIGNED_FILES_PATH = "/signed-files"
_INLINE_PREFIXES = ("image/", "video/")
_INLINE_TYPES = frozenset({"application/pdf"})


class LinkRejected(Exception):
    """The link is malformed, forged or expired; the reason is for logs only."""


def link_signature(secret: bytes, file_id: str, expires: int, disposition: Disposition) -> str:
    message = f"{file_id}\n{expires}\n{disposition}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def signed_path(secret: bytes, file_id: str, *, expires: int, disposition: Disposition) -> str:
    query = urlencode(
        {
            "expires": str(expires),
            "disposition": disposition,
            "signature": link_signature(secret, file_id, expires, disposition),
        }
    )
    return f"{SIGNED_FILES_PATH}/{quote(file_id, safe='')}?{query}"


def verify_link(secret: bytes, file_id: str, query: Mapping[str, str], now: float) -> Disposition:
    """Return the disposition the link was issued with, or raise LinkRejected."""
    expires_raw = query.get("expires", "")
    disposition = query.get("disposition", "")
    signature = query.get("signature", "")
    if not expires_raw.isdigit():
        raise LinkRejected("malformed expires")
    if disposition not in ("inline", "attachment"):
        raise LinkRejected("malformed disposition")
    expires = int(expires_raw)
    expected = link_signature(secret, file_id, expires, disposition)  # type: ignore[arg-type]
    given = signature.lower().encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(expected.encode(), given):
        raise LinkRejected("bad signature")
    if now > expires:
        raise LinkRejected("expired")
    return disposition  # type: ignore[return-value]


def default_disposition(mime_type: str, *, download: bool) -> Disposition:
    """Images, videos and PDFs open in the browser unless a download is asked for."""
    if download:
        return "attachment"
    base = mime_type.split(";", 1)[0].strip().lower()
    if base.startswith(_INLINE_PREFIXES) or base in _INLINE_TYPES:
        return "inline"
    return "attachment"


def content_disposition(disposition: Disposition, filename: str) -> str:
    """RFC 6266 header with an ASCII fallback and the exact UTF-8 name."""
    fallback = "".join(
        ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\' else "_" for ch in filename
    ) or "file"
    encoded = quote(filename, safe="")
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
