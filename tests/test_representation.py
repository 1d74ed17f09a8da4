"""core.representation alone: content coding, validators and conditional requests, Vary, and a derived
representation's request and labels, table-driven."""

from __future__ import annotations

import gzip
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from multidict import CIMultiDict

from gateway.core.reply import Reply
from gateway.core.representation import (
    Coding,
    Derived,
    NotDecoded,
    accepts_gzip,
    add_vary,
    ask_whole,
    content_etag,
    decode,
    is_json,
    not_modified,
    parse_etags,
    to_304,
)

SUFFIX = ".cards-capped-0123abcd"


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, False), ("", False), ("gzip", True), ("br, gzip;q=0.5", True), ("gzip;q=0", False), ("*", True),
     ("*;q=0", False), ("identity", False), ("x-gzip", True), ("br;q=1, *;q=0.1, gzip;q=0", False),
     # a star counts only when gzip is not named; gzip named with q=0 is refused whatever the star says
     ("*;q=0.5", True), ("br, *;q=0.5", True), ("*;q=0.5, gzip;q=0", False), ("gzip;q=0, *", False),
     ("*;q=0, gzip;q=0.001", True),
     # the last of gzip and x-gzip listed decides
     ("gzip;q=0, x-gzip", True), ("x-gzip;q=0.3, gzip;q=0", False),
     # names and parameters are case-insensitive, spaces allowed
     ("GZIP;Q=0.5", True), ("gzip ; q = 0.5", True), ("  gzip  ", True),
     # a q-value that is not a number counts as 0; the last q of an item decides
     ("gzip;q=abc", False), ("gzip;q=", False), ("gzip;q=nan", False), ("gzip;q=0;q=1", True),
     ("gzip;level=1", True), ("deflate, br", False), (",,", False)],
)
def test_accepts_gzip(header: str | None, expected: bool) -> None:
    assert accepts_gzip(header) is expected


@pytest.mark.parametrize(
    ("value", "tags"),
    [('"a"', [(False, "a")]), ('W/"a", "b,c"', [(True, "a"), (False, "b,c")]), ("*", [(True, "*")]),
     ('"a" "b"', None), ("a", None), ('"a",', [(False, "a")]),
     ("", []), ('W/"a"', [(True, "a")]), ('""', [(False, "")]), ('"a", *', [(False, "a"), (True, "*")]),
     ('  "a"  ,  W/"b"  ', [(False, "a"), (True, "b")]),
     # malformed: a lower-case w/, a space after W/, an empty list element, an unclosed quote
     ('w/"a"', None), ('W/ "a"', None), ('"a",,"b"', None), ('"a', None), ("**", None)],
)
def test_parse_etags(value: str, tags: Any) -> None:
    assert parse_etags(value) == tags


@pytest.mark.parametrize(
    ("if_none_match", "etag", "expected"),
    [(None, '"a"', False), ('"a"', None, False), ("", '"a"', False),
     ('"a"', '"a"', True), ('W/"a"', '"a"', True), ('"a"', 'W/"a"', True),  # weak comparison
     ('"b", W/"a"', '"a"', True), ('"b"', '"a"', False), ("*", '"a"', True), ("*", 'W/"x"', True),
     ('"a"', '"a", "b"', False), ('"a"', "*", False),  # the answer's ETag must be one tag
     ('"a', '"a"', False), ('"a"', '"a', False), ('"a" "b"', '"a"', False)],  # malformed: nothing matches
)
def test_not_modified(if_none_match: str | None, etag: str | None, expected: bool) -> None:
    assert not_modified(if_none_match, etag) is expected


@pytest.mark.parametrize(
    ("vary", "names", "expected"),
    [([], ("Accept-Encoding",), ["Accept-Encoding"]),
     (["accept-encoding"], ("Accept-Encoding",), ["accept-encoding"]),
     (["Origin"], ("Accept-Encoding", "X-Tenant"), ["Origin", "Accept-Encoding, X-Tenant"]),
     ([" Accept-Encoding , Origin", "Cookie"], ("origin", "Authorization", "cookie"),
      [" Accept-Encoding , Origin", "Cookie", "Authorization"]),
     (["*"], ("Accept-Encoding",), ["*"]), (["Origin, *"], ("Accept-Encoding",), ["Origin, *"]),
     (["Origin", " * "], ("Accept-Encoding",), ["Origin", " * "]),
     ([], ("Accept-Encoding", "accept-encoding", "Authorization"), ["Accept-Encoding, Authorization"]),
     (["Origin"], (), ["Origin"])],
)
def test_add_vary(vary: list[str], names: tuple[str, ...], expected: list[str]) -> None:
    headers: CIMultiDict[str] = CIMultiDict(("Vary", v) for v in vary)
    add_vary(headers, names)
    assert headers.getall("Vary", []) == expected


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [("application/json", True), ("Application/JSON; charset=utf-8", True), ("application/vnd.api+json", True),
     (" application/json ;", True), ("application/jsonx", False), ("text/json", False), ("", False),
     ("application/json-seq", False)],
)
def test_is_json(content_type: str, expected: bool) -> None:
    assert is_json(content_type) is expected


BODY = b'{"cards":[' + b",".join(b'{"id":%d}' % i for i in range(500)) + b"]}"


@pytest.mark.parametrize(
    ("raw", "coding", "limit", "problem"),
    [(BODY, "", 10, None), (BODY, "identity", 10, None),  # not decoded: bounded by the reader, not here
     (gzip.compress(BODY), "gzip", len(BODY), None), (gzip.compress(BODY), "x-gzip", len(BODY), None),
     (zlib.compress(BODY), "deflate", len(BODY), None),
     (gzip.compress(BODY), "gzip", len(BODY) - 1, "larger than max_body_bytes once decoded"),
     (gzip.compress(BODY), "br", len(BODY), "content coding 'br'"),
     (b"not gzip at all", "gzip", len(BODY), "the compressed body is corrupt"),
     (gzip.compress(BODY)[:-12], "gzip", len(BODY), "the compressed body is truncated or has trailing data"),
     (gzip.compress(BODY) + b"more", "gzip", len(BODY), "the compressed body is truncated or has trailing data")],
)
def test_decode(raw: bytes, coding: str, limit: int, problem: str | None) -> None:
    if problem is None:
        assert decode(raw, coding, limit) == BODY
        return
    with pytest.raises(NotDecoded) as err:
        decode(raw, coding, limit)
    assert err.value.reason == problem
    assert err.value.too_large is problem.startswith("larger")


async def test_coding_gzips_for_a_client_that_takes_it_from_its_threshold() -> None:
    with ThreadPoolExecutor(1) as workers:
        coding = Coding(1024, 6, workers)
        assert coding.encode(b"x" * 1023, True) == (b"x" * 1023, False)
        assert coding.encode(b"x" * 2048, False) == (b"x" * 2048, False)
        out, gzipped = coding.encode(b"x" * 2048, True)
        assert gzipped and gzip.decompress(out) == b"x" * 2048
        big = BODY * 200  # over 1 MiB: compressed on the worker, the same bytes
        assert len(big) > 1 << 20
        assert await coding.encoded(big, True) == coding.encode(big, True)
        assert await coding.encoded(big, False) == (big, False)
        pieces: list[bytes | memoryview] = [BODY[:10], memoryview(big), BODY[10:]]
        joined = b"".join(pieces)
        gzipped_pieces = coding.encode_pieces(pieces, len(joined), True)
        assert gzipped_pieces is not None and gzip.decompress(gzipped_pieces) == joined
        assert coding.encode_pieces(pieces, len(joined), False) is None
        assert coding.encode_pieces([b"x" * 100], 100, True) is None


def test_content_etag_hashes_the_bytes_however_they_are_cut() -> None:
    tag = content_etag([BODY], "bf")
    assert tag.startswith('W/"bf-') and len(tag) == len('W/"bf-"') + 20
    assert content_etag([BODY[:7], memoryview(BODY)[7:]], "bf") == tag != content_etag([BODY + b" "], "bf")


def test_to_304_keeps_the_validators_and_drops_the_body() -> None:
    reply = Reply(200, CIMultiDict({"ETag": 'W/"a"', "Content-Encoding": "gzip", "Vary": "Accept-Encoding"}),
                  b"body", reason="OK")
    to_304(reply)
    assert (reply.status, reply.reason, reply.length) == (304, None, 0)
    assert dict(reply.headers) == {"ETag": 'W/"a"', "Vary": "Accept-Encoding"}


@pytest.mark.parametrize(
    ("upstream", "derived"),
    [(None, None), ("", None), ('"a"', f'W/"a{SUFFIX}"'), ('W/"a"', f'W/"a{SUFFIX}"'), ("*", None),
     ('"a", "b"', None), ('"a', None)],
)
def test_a_derived_tag_names_the_transformation(upstream: str | None, derived: str | None) -> None:
    assert Derived(SUFFIX).etag(upstream) == derived


@pytest.mark.parametrize(
    ("if_none_match", "sent"),
    [(f'W/"a{SUFFIX}"', '"a"'), (f'"a{SUFFIX}", W/"b{SUFFIX}"', '"a", "b"'), ("*", "*"),
     (f'"zzz", W/"a{SUFFIX}"', '"a"'),
     ('"a"', None), ('W/"a.cards-removed-0123abcd"', None),  # the upstream's own tag, another phase's: never match
     (f'"a{SUFFIX}" "b"', None)],  # malformed
)
def test_a_derived_representation_translates_if_none_match(if_none_match: str, sent: str | None) -> None:
    upstream: dict[str, str | None] = {}
    Derived(SUFFIX).ask(upstream, if_none_match)
    assert upstream == {"Accept-Encoding": "identity", "If-Modified-Since": None, "If-Unmodified-Since": None,
                        "If-Range": None, "Range": None, "If-Match": None, "If-None-Match": sent}


def test_what_the_upstream_is_asked_for() -> None:
    upstream: dict[str, str | None] = {}
    Derived(SUFFIX).ask(upstream, None)
    assert "If-None-Match" not in upstream and upstream["Accept-Encoding"] == "identity" and upstream["Range"] is None
    whole: dict[str, str | None] = {"If-None-Match": '"a"'}
    ask_whole(whole)
    assert whole["If-None-Match"] is None and whole["If-Match"] is None and whole["Accept-Encoding"] == "identity"


UPSTREAM_HEADERS = {"Content-Type": "application/json", "Content-Length": "99", "ETag": '"a"',
                    "Last-Modified": "Tue, 01 Sep 2026 00:00:00 GMT", "Accept-Ranges": "bytes", "Digest": "x",
                    "Content-Encoding": "gzip", "Cache-Control": "max-age=5"}


@pytest.mark.parametrize(
    ("rewritten", "gzipped", "expected"),
    [(True, False, {"Content-Type": "application/json", "Cache-Control": "max-age=5", "ETag": f'W/"a{SUFFIX}"'}),
     (True, True, {"Content-Type": "application/json", "Cache-Control": "max-age=5", "Content-Encoding": "gzip",
                   "ETag": f'W/"a{SUFFIX}"'}),
     (False, False, {"Content-Type": "application/json", "Last-Modified": "Tue, 01 Sep 2026 00:00:00 GMT",
                     "Cache-Control": "max-age=5", "ETag": f'W/"a{SUFFIX}"'})],
)
def test_a_derived_answer_is_labelled(rewritten: bool, gzipped: bool, expected: dict[str, str]) -> None:
    headers = CIMultiDict(UPSTREAM_HEADERS)
    Derived(SUFFIX).label(headers, rewritten=rewritten, gzipped=gzipped)
    assert list(headers.items()) == list(expected.items())


def test_a_derived_304_carries_the_derived_tag() -> None:
    headers = CIMultiDict({"ETag": '"a"', "Last-Modified": "x", "Cache-Control": "no-cache"})
    Derived(SUFFIX).revalidated(headers)
    assert dict(headers) == {"Cache-Control": "no-cache", "ETag": f'W/"a{SUFFIX}"'}
    no_tag = CIMultiDict({"ETag": '"a", "b"', "Last-Modified": "x"})
    Derived(SUFFIX).revalidated(no_tag)
    assert dict(no_tag) == {}
