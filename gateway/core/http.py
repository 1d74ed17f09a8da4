"""Small HTTP helpers shared by every part: hop-by-hop headers, transfer codings, request ids, and the client's token
fingerprint."""

from __future__ import annotations

import hashlib
import os
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multidict import CIMultiDictProxy

__all__ = ("HOP_BY_HOP", "connection_tokens", "new_request_id", "random_bits", "random_hex", "token_fingerprint",
           "transfer_codings")

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


def transfer_codings(headers: CIMultiDictProxy[str]) -> list[str]:
    """The transfer codings a message's Transfer-Encoding lines name, in order, lower-cased: every line, split on
    commas, empty list elements ignored (RFC 9110 5.6.1: ", chunked" is "chunked"). The edge refuses a request whose
    codings are anything but ``["chunked"]``; the legacy upload guard reads the same list."""
    return [c for v in headers.getall("Transfer-Encoding", ()) for t in v.split(",") if (c := t.strip().lower())]


# Request, trace and span ids: random, not secret (a client may send its own request id and trace). A Mersenne Twister
# of the gateway's own, seeded from os.urandom: faster than a system call per id, and another module's random.seed()
# does not repeat its ids. A forked child seeds it again, as the random module does its own.
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)
random_bits = _random.getrandbits


def random_hex(digits: int = 32) -> str:
    """``digits`` (even) random hex digits: 32 by default, a request id's 128 bits."""
    return random_bits(digits * 4).to_bytes(digits // 2).hex()


def new_request_id() -> str:
    """128 random bits as 32 hex digits."""
    return random_bits(128).to_bytes(16).hex()


def token_fingerprint(authorization: str | None) -> str | None:
    """A short, stable, non-reversible name for the client's credentials; never the token itself.

    The first 12 hex digits of the SHA-256 of the whole ``Authorization`` value: what the access log shows as
    ``client``, what the usage report counts, and what rollout exemptions name.
    """
    if not authorization:
        return None
    return hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).hexdigest()[:12]
