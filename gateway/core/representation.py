"""A representation a policy derives from the upstream's (a body it rewrites, or assembles): the HTTP around the
policy's decision. What the upstream is asked for (its bytes unencoded, whole, with only the conditions that can be
translated), how the answer is labelled (the headers that describe the upstream's bytes dropped, a weak ``ETag``
naming the transformation, ``Vary``), conditional requests (RFC 9110 13.1.2: ``If-None-Match`` by weak comparison,
a reply turned into a 304), and content coding (``Accept-Encoding`` q-values, gzip/deflate decoded within a bound,
gzip encoded on a worker thread for a large body). docs/policies/board_cards.md ("Compression", "Validators and
conditional requests") says what a client sees."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import re
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor

from multidict import CIMultiDict

from .reply import Reply

__all__ = (
    "CONDITIONAL_DROP",
    "OFF_LOOP_BYTES",
    "REENCODE_DROP",
    "REWRITE_DROP",
    "Coding",
    "Derived",
    "NotDecoded",
    "accepts_gzip",
    "add_vary",
    "ask_whole",
    "content_etag",
    "decode",
    "is_json",
    "not_modified",
    "parse_etags",
    "to_304",
)

# Response headers that describe the upstream's bytes and are wrong for a rewritten body.
REWRITE_DROP = frozenset(
    {"content-length", "content-encoding", "etag", "last-modified", "content-md5", "digest", "content-digest",
     "repr-digest", "accept-ranges", "content-range"}
)
# The same for the upstream's bytes sent again (re-encoded at most): their Last-Modified still dates them.
REENCODE_DROP = REWRITE_DROP - {"last-modified"}
# Request headers that would let the upstream answer for a representation the policy then derives differently: a
# date or a range says nothing about which derivation a copy was made by, and a partial body cannot be rewritten.
CONDITIONAL_DROP = ("If-Modified-Since", "If-Unmodified-Since", "If-Range", "Range", "If-Match")
# A body at least this large is compressed on a worker thread, off the event loop.
OFF_LOOP_BYTES = 1 << 20

_JSON_TYPE = re.compile(r"^\s*application/(?:[\w.+-]+\+)?json\s*(?:;|$)", re.IGNORECASE)
_ETAG = re.compile(r'\s*(?:(W/)?"([^"]*)"|(\*))\s*(?:,|$)')
_GZIP_NAMES = frozenset({"gzip", "x-gzip"})
_IDENTITY = ("", "identity")
_DECODABLE = ("gzip", "x-gzip", "deflate")
_GZIP_WBITS = 31  # zlib's gzip container, as gzip.compress writes it
_ANY_WBITS = 47  # gzip or zlib, by the header


# --- content coding -----------------------------------------------------------------------------------------------


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value takes gzip: its own q-value (``x-gzip`` too; the last one listed), else
    ``*``'s; a q-value that is not a number counts as 0."""
    if not header:
        return False
    star = gzip_q = None
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        if coding in _GZIP_NAMES:
            gzip_q = _quality(params)
        elif coding == "*":
            star = _quality(params)
    chosen = gzip_q if gzip_q is not None else star
    return chosen is not None and chosen > 0


def _quality(params: str) -> float:
    quality = 1.0
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "q":
            quality = _number(value)
    return quality


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


def is_json(content_type: str) -> bool:
    """A JSON media type: ``application/json`` or ``application/<anything>+json``, parameters allowed."""
    return _JSON_TYPE.match(content_type) is not None


class NotDecoded(Exception):
    """A body that cannot be decoded: an unknown coding, corrupt or truncated data, or over the bound once decoded
    (``too_large``)."""

    def __init__(self, reason: str, *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.too_large = too_large


def decode(raw: bytes, coding: str, limit: int) -> bytes:
    """``raw`` in ``Content-Encoding`` ``coding`` (lower case), decoded whole: at most ``limit`` bytes of output are
    made (a compression bomb stops there), and the data must end where the compressed stream does."""
    if coding in _IDENTITY:
        return raw
    if coding not in _DECODABLE:
        raise NotDecoded(f"content coding {coding!r}")
    inflater = zlib.decompressobj(_ANY_WBITS)
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error:
        raise NotDecoded("the compressed body is corrupt") from None
    if len(out) > limit:
        raise NotDecoded("larger than max_body_bytes once decoded", too_large=True)
    if not inflater.eof or inflater.unused_data:
        raise NotDecoded("the compressed body is truncated or has trailing data")
    return out


class Coding:
    """How a derived body is encoded for its client: gzip for a client that takes it, from ``min_bytes`` on, at
    ``level``; a large body on ``workers`` (zlib lets the event loop run meanwhile)."""

    __slots__ = ("min_bytes", "level", "workers")

    def __init__(self, min_bytes: int, level: int, workers: Executor) -> None:
        self.min_bytes = min_bytes
        self.level = level
        self.workers = workers

    def encode(self, out: bytes, gzip_ok: bool) -> tuple[bytes, bool]:
        """The body the client gets, and whether it is gzipped."""
        if gzip_ok and len(out) >= self.min_bytes:
            return gzip.compress(out, compresslevel=self.level, mtime=0), True
        return out, False

    async def encoded(self, out: bytes, gzip_ok: bool) -> tuple[bytes, bool]:
        """``encode``, on a worker thread for a large body."""
        if len(out) < OFF_LOOP_BYTES or not gzip_ok:
            return self.encode(out, gzip_ok)
        return await asyncio.get_running_loop().run_in_executor(self.workers, self.encode, out, gzip_ok)

    def encode_pieces(self, pieces: Sequence[bytes | memoryview], length: int, gzip_ok: bool) -> bytes | None:
        """(On a worker thread.) A body of ``length`` bytes in ``pieces``, gzipped in runs of about 1 MiB (never
        joined whole); None when it goes as it is."""
        if not gzip_ok or length < self.min_bytes:
            return None
        compressor = zlib.compressobj(self.level, zlib.DEFLATED, _GZIP_WBITS)
        runs = [compressor.compress(b"".join(batch)) for batch in _batches(pieces, 1 << 20)]
        runs.append(compressor.flush())
        return b"".join(runs)


def _batches(pieces: Sequence[bytes | memoryview], size: int) -> list[list[bytes | memoryview]]:
    """Consecutive pieces gathered into runs of about ``size`` bytes (a large piece is a run of its own)."""
    runs: list[list[bytes | memoryview]] = [[]]
    held = 0
    for piece in pieces:
        if held >= size:
            runs.append([])
            held = 0
        runs[-1].append(piece)
        held += len(piece)
    return runs


# --- validators and conditional requests --------------------------------------------------------------------------


def parse_etags(value: str) -> list[tuple[bool, str]] | None:
    """An ``ETag`` or ``If-None-Match`` value as (weak, opaque) pairs; ``(True, "*")`` for a star; None when
    malformed."""
    tags: list[tuple[bool, str]] = []
    pos = 0
    while pos < len(value):
        m = _ETAG.match(value, pos)
        if m is None or m.end() == pos:
            return None
        tags.append((True, "*") if m.group(3) else (bool(m.group(1)), m.group(2)))
        pos = m.end()
    return tags


def not_modified(if_none_match: str | None, etag: str | None) -> bool:
    """RFC 9110 13.1.2: whether ``If-None-Match`` matches the answer's one ``ETag`` by weak comparison (``*``
    matches any); a malformed value matches nothing."""
    if not if_none_match or not etag:
        return False
    tags = parse_etags(if_none_match)
    mine = parse_etags(etag)
    if not tags or not mine or len(mine) != 1:
        return False
    return any(opaque == "*" or opaque == mine[0][1] for _, opaque in tags)


def to_304(reply: Reply) -> None:
    """The reply becomes a ``304 Not Modified``: no body, no content coding; its validators and ``Vary`` stay."""
    reply.status = 304
    reply.reason = None
    reply.set_body(b"")
    reply.headers.popall("Content-Encoding", None)


def content_etag(pieces: Iterable[bytes | memoryview], prefix: str) -> str:
    """The gateway's own weak validator for a body it assembled: a hash of its bytes."""
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return f'W/"{prefix}-{digest.hexdigest()[:20]}"'


def add_vary(headers: CIMultiDict[str], names: Iterable[str]) -> None:
    """``Vary`` gets the ``names`` it does not list yet (compared case-insensitively, each once), in one field;
    ``Vary: *`` stays as it is."""
    present = {v.strip().lower() for value in headers.getall("Vary", ()) for v in value.split(",")}
    if "*" in present:
        return
    extra = []
    for name in names:
        if name.lower() not in present:
            present.add(name.lower())
            extra.append(name)
    if extra:
        headers.add("Vary", ", ".join(extra))


def _ask_identity(upstream_headers: dict[str, str | None]) -> None:
    upstream_headers["Accept-Encoding"] = "identity"
    for name in CONDITIONAL_DROP:
        upstream_headers[name] = None


def ask_whole(upstream_headers: dict[str, str | None]) -> None:
    """Ask the upstream for its bytes unencoded and unconditionally: for an answer whose validator is the gateway's
    own (assembled from several answers), whose conditions the gateway judges itself (``not_modified``)."""
    _ask_identity(upstream_headers)
    upstream_headers["If-None-Match"] = None


class Derived:
    """A representation derived from the upstream's by one transformation, named by ``suffix`` (it changes whenever
    what the transformation does to a body changes): what to ask the upstream for, and how to label its answer. The
    derived ``ETag`` is the upstream's tag with the suffix, weak; a client's ``If-None-Match`` is translated back,
    so the upstream answers ``304`` exactly when its representation has not changed, and a tag of another
    transformation can never match."""

    __slots__ = ("suffix",)

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def ask(self, upstream_headers: dict[str, str | None], if_none_match: str | None) -> None:
        """The upstream's bytes unencoded, with the client's ``If-None-Match`` (translated) the one condition."""
        _ask_identity(upstream_headers)
        if if_none_match is not None:
            upstream_headers["If-None-Match"] = self.translate(if_none_match)

    def etag(self, upstream_etag: str | None) -> str | None:
        """The derived tag of an upstream's ``ETag`` (None without one tag)."""
        if not upstream_etag:
            return None
        tags = parse_etags(upstream_etag)
        if not tags or len(tags) != 1 or tags[0][1] == "*":
            return None
        return f'W/"{tags[0][1]}{self.suffix}"'

    def translate(self, if_none_match: str) -> str | None:
        """Only the tags this derivation issued, as the upstream's own (and ``*``); None when none is left."""
        tags = parse_etags(if_none_match)
        if tags is None:
            return None
        suffix = self.suffix
        kept = []
        for weak, opaque in tags:
            if opaque == "*" and weak:
                kept.append("*")
            elif opaque.endswith(suffix):
                kept.append(f'"{opaque[: -len(suffix)]}"')
        return ", ".join(kept) or None

    def label(self, headers: CIMultiDict[str], *, rewritten: bool, gzipped: bool) -> None:
        """The upstream's 200 headers made this derivation's: what described the upstream's bytes dropped (its
        ``Last-Modified`` kept when the bytes are its own, ``rewritten`` False), the coding, the derived tag."""
        upstream_etag = headers.get("ETag")
        for name in REWRITE_DROP if rewritten else REENCODE_DROP:
            headers.popall(name, None)
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        self._tag(headers, upstream_etag)

    def revalidated(self, headers: CIMultiDict[str]) -> None:
        """The upstream's 304 headers made this derivation's: the derived tag, no ``Last-Modified``."""
        upstream_etag = headers.get("ETag")
        headers.popall("ETag", None)
        headers.popall("Last-Modified", None)
        self._tag(headers, upstream_etag)

    def _tag(self, headers: CIMultiDict[str], upstream_etag: str | None) -> None:
        etag = self.etag(upstream_etag)
        if etag is not None:
            headers["ETag"] = etag
