"""Small HTTP helpers shared by every part: hop-by-hop headers, request ids, and the client's token fingerprint."""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multidict import CIMultiDictProxy

__all__ = ("HOP_BY_HOP", "connection_tokens", "new_request_id", "random_hex", "token_fingerprint")

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


def connection_tokens(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    """Header names listed in Connection: hop-by-hop for this message only."""
    values = headers.getall("Connection", ())
    if not values:
        return _NO_TOKENS
    if len(values) == 1 and values[0].strip().lower() in _PLAIN_CONNECTION:
        return _NO_TOKENS  # the common case: names no header
    return frozenset(t.strip().lower() for v in values for t in v.split(",") if t.strip())


_hex = ""  # random hex digits not handed out yet, from _hex[_next:]
_next = 0


def random_hex(digits: int = 32) -> str:
    """Random bits from os.urandom as hex digits (32 by default: a request id, 128 bits), drawn 4 KiB at a time: one
    getrandom(2) per 256 request ids. Trace and span ids (``core.tracecontext``) are drawn from the same buffer."""
    global _hex, _next
    start = _next
    end = start + digits
    if end > len(_hex):
        _hex = os.urandom(4096).hex()
        start, end = 0, digits
    _next = end
    return _hex[start:end]


new_request_id = random_hex


def _forget() -> None:
    global _hex, _next
    _hex, _next = "", 0


# A forked child draws its own bits: it must not hand out the ids its parent has buffered.
os.register_at_fork(after_in_child=_forget)


def token_fingerprint(authorization: str | None) -> str | None:
    """A short, stable, non-reversible name for the client's credentials; never the token itself.

    The first 12 hex digits of the SHA-256 of the whole ``Authorization`` value: what the access log shows as
    ``client``, what the usage report counts, and what rollout exemptions name.
    """
    if not authorization:
        return None
    return hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).hexdigest()[:12]
