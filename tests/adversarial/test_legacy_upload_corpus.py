"""The legacy upload guard against raw requests: every spelling trick, blocked or refused, and the same tricks on
legitimate traffic, passed byte for byte.

Each case is sent through a real socket. Each asserts what the client was answered and what reached the recording
upstream: nothing at all (not even a connection) for a blocked or refused request, the exact bytes for the others.
Tenant ``acme`` (Host 127.0.0.1) has the forbid setting on; ``oldco`` (Host old.test) has it off.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

import pytest

from tests.adversarial.parser_disagreements import DISAGREEMENTS
from tests.gateway_testlib import CountingUpstream, RunningGateway, multipart_body, parse_responses, send_raw

DISABLED = "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
AMBIGUOUS = "LEGACY_UPLOAD_AMBIGUOUS"
DEPRECATION = "@1779321600"  # 2026-05-21T00:00:00Z

B = "adv-B0undary.7"
MP = f"multipart/form-data; boundary={B}"
TEXT = (['Content-Disposition: form-data; name="text"'], b"hello, world")
FILE = (['Content-Disposition: form-data; name="files[]"; filename="report.pdf"', "Content-Type: application/pdf"],
        b"%PDF-1.4 not really")  # fmt: skip
TEXT_BODY = multipart_body([TEXT], B)
FILE_BODY = multipart_body([TEXT, FILE], B)
JSON_BODY = b'{"text": "edited comment"}'
# The uids of the restricted file routes (an earlier, numeric id in their place is a legacy upload).
U = "0d6c1a5e-3b7f-4c2a-9e8d-1f2a3b4c5d6e"
C = "5a0b9c8d-7e6f-4a1b-8c2d-3e4f5a6b7c8d"
P = "9f8e7d6c-5b4a-4392-8180-7a6b5c4d3e2f"


def with_part(*headers: str, content: bytes = b"data") -> bytes:
    """A text part, then one part with the given header lines."""
    return multipart_body([TEXT, (list(headers), content)], B)


def http(
    method: str,
    target: str,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    *,
    host: str = "127.0.0.1",
    version: str = "HTTP/1.1",
    length: bool = True,
    close: bool = True,
) -> bytes:
    lines = [f"{method} {target} {version}", f"Host: {host}"]
    headers = headers or []
    lines += [f"{name}: {value}" for name, value in headers]
    framed = any(name.lower() in ("content-length", "transfer-encoding") for name, _ in headers)
    if length and not framed and (body or method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(body: bytes, size: int, *, ext: str = "", trailers: str = "") -> bytes:
    """``body`` in chunks of ``size`` bytes, each size line with ``ext`` and the last chunk followed by trailers."""
    out = bytearray()
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += f"{len(piece):x}{ext}\r\n".encode() + piece + b"\r\n"
    out += f"0{ext}\r\n{trailers}\r\n".encode()
    return bytes(out)


@dataclass(frozen=True)
class Sent:
    """One request as it must reach the upstream."""

    method: str
    path: str
    body: bytes = b""
    # Content-Length the upstream must see: the body's length (True), none (None), or not checked (False).
    length: bool | None = True
    encoding: str | None = None


@dataclass(frozen=True)
class Case:
    id: str
    data: bytes
    statuses: tuple[int, ...]
    code: str | None = None  # the JSON "code" of the last answer; None: not a gateway JSON answer
    rule: str | None = None
    forwarded: tuple[Sent, ...] = ()
    wait_for_continue: bool = False  # send the head, then the body only after 100 Continue
    continue_expected: bool = False
    deprecated: Literal["yes", "no", "any"] = "any"


def put_files(target: str = "/api/v1/cards/1/files", headers: list[tuple[str, str]] | None = None, **kw: object) -> bytes:
    return http("PUT", target, [("Content-Type", MP), *(headers or [])], FILE_BODY, **kw)  # type: ignore[arg-type]


def comment(body: bytes, ct: str = MP, *, target: str = "/api/v1/cards/1/comments", method: str = "POST",
            headers: list[tuple[str, str]] | None = None, **kw: object) -> bytes:  # fmt: skip
    return http(method, target, [("Content-Type", ct), *(headers or [])], body, **kw)  # type: ignore[arg-type]


def blocked(id: str, data: bytes, **kw: object) -> Case:
    return Case(id, data, (403,), DISABLED, deprecated="yes", **kw)  # type: ignore[arg-type]


def refused(id: str, data: bytes, rule: str, status: int = 400, code: str = AMBIGUOUS) -> Case:
    return Case(id, data, (status,), code, rule, deprecated="no")


def framing(id: str, data: bytes) -> Case:
    """Refused by the HTTP parser itself, before any route or policy."""
    return Case(id, data, (400,))


def passed(id: str, data: bytes, *sent: Sent, deprecated: Literal["yes", "no", "any"] = "no", **kw: object) -> Case:
    return Case(id, data, (200,) * len(sent), forwarded=sent, deprecated=deprecated, **kw)  # type: ignore[arg-type]


BIG_TEXT = multipart_body([(['Content-Disposition: form-data; name="text"'], b"t" * (2 << 20)), FILE[:2]], B)
SOME_TEXT_THEN_FILE = multipart_body(
    [(['Content-Disposition: form-data; name="text"'], b"t" * (200 << 10)), (FILE[0], b"x" * 1000)], B
)
CHUNKED_FILE = chunked(FILE_BODY, 7, ext=';ext="v"', trailers="X-Trailer: 1\r\n")
CHUNKED_TEXT = chunked(TEXT_BODY, 5, ext=";a=b;c", trailers="X-Checksum: abc\r\nX-Other: 2\r\n")

FORM = "application/x-www-form-urlencoded"
OVERRIDE_PUT = (['Content-Disposition: form-data; name="_method"'], b"PUT")
OVERRIDE_POST = (['Content-Disposition: form-data; name="_method"'], b"POST")
BIG_FORM = b"note=" + b"n" * (1 << 20) + b"&_method=PUT"


def post_files(body: bytes, ct: str | None = MP, *, target: str = "/api/v1/cards/1/files",
               headers: list[tuple[str, str]] | None = None, **kw: object) -> bytes:  # fmt: skip
    """A POST to the card files path: the restricted upload route, or the legacy one if a ``_method`` says PUT."""
    head = ([("Content-Type", ct)] if ct is not None else []) + (headers or [])
    return http("POST", target, head, body, **kw)  # type: ignore[arg-type]


def post_to(target: str, body: bytes = FILE_BODY, ct: str = MP, **kw: object) -> bytes:
    return http("POST", target, [("Content-Type", ct)], body, **kw)  # type: ignore[arg-type]


EMPTY_FORM = f"--{B}--\r\n".encode()
# The restricted upload routes' paths with an earlier id (anything but a UUID) where a uid belongs: the service takes
# such an upload as a legacy one (docs/policies/legacy_upload_guard.md, "Where it runs").
LEGACY_IDS: list[Case] = [
    blocked("legacy-id-card-post", post_to("/api/v1/cards/1/files")),
    blocked("legacy-id-card-post-latest", post_to("/api/latest/cards/42/files")),
    blocked("legacy-id-card-post-file-field", post_to("/api/v1/cards/42/files", multipart_body([(
            ['Content-Disposition: form-data; name="file"; filename="a.png"', "Content-Type: image/png"], b"png")], B))),
    blocked("legacy-id-card-post-zero-padded", post_to("/api/v1/cards/0042/files")),
    blocked("legacy-id-card-post-percent-encoded", post_to("/api/v1/cards/%34%32/files")),
    blocked("legacy-id-card-post-upper-case-path", post_to("/API/V1/CARDS/42/FILES")),
    blocked("legacy-id-card-post-trailing-slash", post_to("/api/v1/cards/42/files/")),
    blocked("legacy-id-card-post-dot-segments", post_to("/api/v1/x/../cards/./42/files")),
    blocked("legacy-id-card-post-name-not-a-number", post_to("/api/v1/cards/my-card/files")),
    blocked("legacy-id-card-post-uuid-without-dashes", post_to("/api/v1/cards/" + U.replace("-", "") + "/files")),
    blocked("legacy-id-card-post-uuid-and-more", post_to(f"/api/v1/cards/{U}0/files")),
    blocked("legacy-id-card-post-chunked", http("POST", "/api/v1/cards/42/files", [
            ("Content-Type", MP), ("Transfer-Encoding", "chunked")]) + chunked(FILE_BODY, 9)),  # fmt: skip
    blocked("legacy-id-card-post-typed-part", post_to("/api/v1/cards/42/files", multipart_body([(
            ['Content-Disposition: form-data; name="attachment"', "Content-Type: application/octet-stream"], b"x")], B))),
    blocked("legacy-id-put-override-to-post", http("PUT", "/api/v1/cards/1/files", [
            ("Content-Type", MP), ("X-HTTP-Method-Override", "POST")], FILE_BODY)),  # fmt: skip
    blocked("legacy-id-comment-both-numbers", post_to("/api/v1/cards/1/comments/2/files")),
    blocked("legacy-id-comment-card-number", post_to(f"/api/v1/cards/1/comments/{C}/files")),
    blocked("legacy-id-comment-comment-number", post_to(f"/api/latest/cards/{U}/comments/2/files")),
    blocked("legacy-id-property-both-numbers", post_to("/api/v1/cards/1/custom-properties/3/files")),
    blocked("legacy-id-property-card-number", post_to(f"/api/v1/cards/1/custom-properties/{P}/files")),
    blocked("legacy-id-property-property-number", post_to(f"/api/v1/cards/{U}/custom-properties/3/files")),
    refused("legacy-id-comment-ambiguous-body", post_to("/api/v1/cards/1/comments/2/files",
            FILE_BODY.replace(b"\r\n", b"\n")), "line_endings"),  # fmt: skip
    # What is not an upload passes, as before: JSON with a URL, a form without a file part, the UUID paths.
    passed("legacy-id-card-post-json-url", post_to("/api/v1/cards/42/files", j := b'{"url": "https://e.test/a.pdf"}',
                                                   "application/json"),
           Sent("POST", "/api/v1/cards/42/files", j)),  # fmt: skip
    passed("legacy-id-card-post-text-only", post_to("/api/v1/cards/42/files", TEXT_BODY),
           Sent("POST", "/api/v1/cards/42/files", TEXT_BODY)),
    passed("legacy-id-card-post-empty-form", post_to("/api/v1/cards/42/files", EMPTY_FORM),
           Sent("POST", "/api/v1/cards/42/files", EMPTY_FORM)),
    passed("legacy-id-comment-text-only", post_to("/api/v1/cards/1/comments/2/files", TEXT_BODY),
           Sent("POST", "/api/v1/cards/1/comments/2/files", TEXT_BODY)),
    passed("restricted-card-upload-upper-case-uuid", post_to(f"/api/v1/cards/{U.upper()}/files"),
           Sent("POST", f"/api/v1/cards/{U.upper()}/files", FILE_BODY)),
    passed("restricted-comment-upload-both-uuids", post_to(f"/api/v1/cards/{U}/comments/{C}/files"),
           Sent("POST", f"/api/v1/cards/{U}/comments/{C}/files", FILE_BODY)),
    passed("legacy-id-file-rename-by-number", http("PATCH", "/api/v1/cards/1/files/7", [
           ("Content-Type", "application/json")], r := b'{"name": "b.pdf"}'), Sent("PATCH", "/api/v1/cards/1/files/7", r)),
    passed("forbid-off-legacy-id-card-post", post_to("/api/v1/cards/42/files", host="old.test"),
           Sent("POST", "/api/v1/cards/42/files", FILE_BODY), deprecated="yes"),
    passed("forbid-off-legacy-id-comment-post", post_to("/api/v1/cards/1/comments/2/files", host="old.test"),
           Sent("POST", "/api/v1/cards/1/comments/2/files", FILE_BODY), deprecated="yes"),
]


BODY_OVERRIDES: list[Case] = [
    # --- a form body's _method (docs/policies/legacy_upload_guard.md, "Method overrides") --------------------------
    blocked("put-via-body-method-urlencoded", post_files(b"_method=PUT&note=x", FORM)),
    blocked("put-via-body-method-urlencoded-charset", post_files(b"note=x&_method=put", f"{FORM}; charset=utf-8")),
    blocked("put-via-body-method-no-content-type", post_files(b"_method=PUT", None)),
    blocked("put-via-body-method-semicolon-separator", post_files(b"a=1;_method=PUT", FORM)),
    blocked("put-via-body-method-percent-encoded", post_files(b"%5Fmethod=PU%54", FORM)),
    blocked("put-via-body-method-key-case", post_files(b"_METHOD=PUT", FORM)),
    blocked("put-via-body-method-chunked", post_files(b"", FORM, headers=[("Transfer-Encoding", "chunked")])
            + chunked(b"note=x&_method=PUT", 3)),  # fmt: skip
    blocked("put-via-body-method-multipart-first", post_files(multipart_body([OVERRIDE_PUT, FILE], B))),
    blocked("put-via-body-method-multipart-after-text", post_files(multipart_body([TEXT, OVERRIDE_PUT, FILE], B))),
    blocked("put-via-body-method-multipart-padded-value",
            post_files(multipart_body([(OVERRIDE_PUT[0], b" put "), FILE], B))),
    blocked("put-via-body-method-multipart-chunked", post_files(b"", headers=[("Transfer-Encoding", "chunked")])
            + chunked(multipart_body([OVERRIDE_PUT, FILE], B), 5)),  # fmt: skip
    blocked("put-via-body-method-agreeing-with-header",
            post_files(b"_method=PUT", FORM, headers=[("X-HTTP-Method-Override", "PUT")])),
    blocked("put-via-body-method-agreeing-with-query", post_files(b"_method=PUT", FORM, target="/api/v1/cards/1/files?_method=put")),
    blocked("comment-patch-via-body-method", post_files(multipart_body([(OVERRIDE_PUT[0], b"PATCH"), TEXT, FILE], B),
                                                        target="/api/v1/cards/1/comments/2")),  # fmt: skip
    Case("body-method-disagrees-with-header", post_files(b"_method=PUT", FORM, headers=[("X-HTTP-Method-Override",
         "PATCH")]), (400,), "AMBIGUOUS_METHOD", "disagreeing_overrides"),  # fmt: skip
    Case("body-methods-disagree", post_files(b"_method=PUT&_method=POST", FORM), (400,), "AMBIGUOUS_METHOD",
         "disagreeing_overrides"),
    Case("body-method-after-file-part", post_files(multipart_body([TEXT, FILE, OVERRIDE_PUT], B)), (400,),
         "AMBIGUOUS_METHOD", "late_override"),
    Case("body-method-part-with-filename", post_files(multipart_body([(
         ['Content-Disposition: form-data; name="_method"; filename="m.txt"'], b"PUT"), FILE], B)), (400,),
         "AMBIGUOUS_METHOD", "override_file_part"),  # fmt: skip
    Case("body-method-value-too-long", post_files(multipart_body([(OVERRIDE_PUT[0], b"P" * 200), FILE], B)), (400,),
         "AMBIGUOUS_METHOD", "override_value_too_long"),
    Case("body-method-to-head", post_files(b"_method=HEAD", FORM), (400,), "AMBIGUOUS_METHOD", "invalid_override"),
    Case("body-method-not-a-token", post_files(b"_method=P%20T", FORM), (400,), "AMBIGUOUS_METHOD", "invalid_override"),
    Case("body-method-encoded-urlencoded", post_files(b"\x1f\x8bgz", FORM, headers=[("Content-Encoding", "gzip")]),
         (400,), "AMBIGUOUS_METHOD", "content_encoding"),
    Case("body-method-form-content-type-list", post_files(b"_method=PUT", f"application/json, {FORM}"), (400,),
         "AMBIGUOUS_METHOD", "malformed_content_type"),
    Case("body-method-ambiguous-multipart", post_files(multipart_body([OVERRIDE_PUT, FILE], B).replace(b"\r\n", b"\n")),
         (400,), "AMBIGUOUS_METHOD", "line_endings"),
    Case("body-method-multipart-mixed", post_files(multipart_body([OVERRIDE_PUT, FILE], B), f"multipart/mixed; boundary={B}"),
         (400,), "AMBIGUOUS_METHOD", "multipart_subtype"),
    Case("body-method-undecided-multipart", post_files(BIG_TEXT), (413,), "METHOD_OVERRIDE_UNDECIDED",
         "look_ahead_exceeded"),
    Case("body-method-undecided-urlencoded", post_files(BIG_FORM, FORM), (413,), "METHOD_OVERRIDE_UNDECIDED",
         "look_ahead_exceeded"),
    passed("restricted-upload-body-method-post", post_files(r1 := multipart_body([OVERRIDE_POST, FILE], B),
                                                             target=f"/api/v1/cards/{U}/files"),
           Sent("POST", f"/api/v1/cards/{U}/files", r1)),  # fmt: skip
    passed("restricted-upload-body-method-post-after-file",
           post_files(r2 := multipart_body([FILE, OVERRIDE_POST], B), target=f"/api/v1/cards/{U}/files"),
           Sent("POST", f"/api/v1/cards/{U}/files", r2)),  # fmt: skip
    passed("restricted-upload-file-first-chunked", post_files(b"", target=f"/api/v1/cards/{U}/files",
           headers=[("Transfer-Encoding", "chunked")]) + chunked(r3 := multipart_body([FILE, TEXT], B), 4),
           Sent("POST", f"/api/v1/cards/{U}/files", r3, length=None)),  # fmt: skip
    passed("restricted-text-only-multipart", post_files(TEXT_BODY, target=f"/api/v1/cards/{U}/files"),
           Sent("POST", f"/api/v1/cards/{U}/files", TEXT_BODY)),
    passed("restricted-urlencoded-without-override", post_files(b"url=https%3A%2F%2Fexample.test%2Fa.pdf", FORM,
                                                                target=f"/api/v1/cards/{U}/files"),
           Sent("POST", f"/api/v1/cards/{U}/files", b"url=https%3A%2F%2Fexample.test%2Fa.pdf")),  # fmt: skip
    passed("restricted-upload-body-method-expect-100-continue",
           post_files(r4 := multipart_body([OVERRIDE_POST, FILE], B), target=f"/api/v1/cards/{U}/files",
                      headers=[("Expect", "100-continue")]),
           Sent("POST", f"/api/v1/cards/{U}/files", r4), wait_for_continue=True, continue_expected=True),  # fmt: skip
    passed("forbid-off-put-via-body-method", post_files(f1 := multipart_body([OVERRIDE_PUT, FILE], B), host="old.test"),
           Sent("PUT", "/api/v1/cards/1/files", f1), deprecated="yes"),
    passed("comment-create-body-method-post", comment(c1 := multipart_body([OVERRIDE_POST, TEXT], B)),
           Sent("POST", "/api/v1/cards/1/comments", c1)),
]

CASES: list[Case] = [
    # --- the card file route: every PUT with a body is an upload, decided from the head -------------------------
    blocked("put-multipart", put_files()),
    blocked("put-api-latest", put_files("/api/latest/cards/1/files")),
    blocked("put-percent-encoded-path", put_files("/api/v1/%63ards/1/%66iles")),
    blocked("put-repeated-slashes", put_files("//api//v1///cards//1/files")),
    blocked("put-dot-segments", put_files("/api/v1/boards/../cards/./1/files")),
    blocked("put-trailing-slash", put_files("/api/v1/cards/1/files/")),
    blocked("put-upper-case-path", put_files("/API/V1/CARDS/1/FILES")),
    blocked("put-absolute-form", put_files("http://127.0.0.1/api/v1/cards/1/files")),
    blocked("put-via-x-http-method-override", http("POST", "/api/v1/cards/1/files",
            [("Content-Type", MP), ("X-HTTP-Method-Override", "PUT")], FILE_BODY)),  # fmt: skip
    blocked("put-via-x-method-override-lower", http("POST", "/api/v1/cards/1/files",
            [("Content-Type", MP), ("X-Method-Override", "put")], FILE_BODY)),  # fmt: skip
    blocked("put-via-x-http-method", http("POST", "/api/v1/cards/1/files",
            [("Content-Type", MP), ("X-HTTP-Method", "PUT")], FILE_BODY)),  # fmt: skip
    blocked("put-via-method-query", http("POST", "/api/v1/cards/1/files?_method=PUT", [("Content-Type", MP)], FILE_BODY)),
    blocked("put-via-encoded-method-query", http("POST", "/api/v1/cards/1/files?%5Fmethod=put",
            [("Content-Type", MP)], FILE_BODY)),  # fmt: skip
    blocked("put-octet-stream-body", http("PUT", "/api/v1/cards/1/files",
            [("Content-Type", "application/octet-stream")], b"raw file bytes")),  # fmt: skip
    blocked("put-no-content-type", http("PUT", "/api/v1/cards/1/files", [], b"raw file bytes")),
    blocked("put-chunked-extensions-trailers", put_files(headers=[("Transfer-Encoding", "chunked")])[:-len(FILE_BODY)]
            + CHUNKED_FILE),  # fmt: skip
    blocked("put-http-1.0", put_files(version="HTTP/1.0", close=False)),
    blocked("put-expect-100-continue-gets-no-continue",
            http("PUT", "/api/v1/cards/1/files", [("Content-Type", MP), ("Content-Length", "1073741824"),
                                                   ("Expect", "100-continue")])),  # fmt: skip
    blocked("put-content-type-case", http("PUT", "/api/v1/cards/1/files",
            [("Content-Type", f"MULTIPART/Form-Data; BOUNDARY={B}")], FILE_BODY)),  # fmt: skip
    # --- comment routes: a multipart body with a file part ------------------------------------------------------
    blocked("comment-filename-quoted", comment(FILE_BODY)),
    blocked("comment-filename-unquoted", comment(with_part("Content-Disposition: form-data; name=a; filename=a.txt"))),
    blocked("comment-filename-upper-case-param",
            comment(with_part('content-disposition: FORM-DATA; NAME="a"; FILENAME="a.txt"'))),
    blocked("comment-filename-star", comment(with_part("Content-Disposition: form-data; name=\"a\"; "
                                                       "filename*=UTF-8''%C3%A9t%C3%A9.txt"))),  # fmt: skip
    blocked("comment-filename-rfc2231-continuation",
            comment(with_part('Content-Disposition: form-data; name="a"; filename*0="a"; filename*1=".txt"'))),
    blocked("comment-filename-empty", comment(with_part('Content-Disposition: form-data; name="a"; filename=""',
                                                        "Content-Type: application/octet-stream", content=b""))),
    blocked("comment-octet-stream-part-without-filename",
            comment(with_part('Content-Disposition: form-data; name="attachment"', "Content-Type: application/octet-stream"))),
    blocked("comment-image-part-without-filename",
            comment(with_part('Content-Disposition: form-data; name="picture"', "Content-Type: image/png"))),
    blocked("comment-files-field-without-filename", comment(with_part('Content-Disposition: form-data; name="files[]"'))),
    blocked("comment-indexed-files-field", comment(with_part('Content-Disposition: form-data; name="files[0]"'))),
    blocked("comment-file-part-first", comment(multipart_body([FILE, TEXT], B))),
    blocked("comment-file-after-200k-of-text", comment(SOME_TEXT_THEN_FILE)),
    blocked("comment-content-type-case-and-params",
            comment(FILE_BODY, f'Multipart/Form-Data; charset=utf-8; Boundary="{B}"')),
    blocked("comment-chunked-tiny-chunks-extensions-trailers",
            comment(b"", headers=[("Transfer-Encoding", "chunked")]) + CHUNKED_FILE),
    blocked("comment-patch", comment(FILE_BODY, method="PATCH", target="/api/v1/cards/1/comments/2")),
    blocked("comment-patch-via-override", comment(FILE_BODY, target="/api/v1/cards/1/comments/2",
                                                  headers=[("X-HTTP-Method-Override", "PATCH")])),
    blocked("comment-latest-upper-case-trailing-slash", comment(FILE_BODY, target="/API/LATEST/Cards/1/Comments/")),
    blocked("comment-http-1.0", comment(FILE_BODY, version="HTTP/1.0", close=False)),
    blocked("comment-expect-100-continue", comment(FILE_BODY, headers=[("Expect", "100-continue")]),
            wait_for_continue=True, continue_expected=True),
    Case("pipelined-get-then-put", http("GET", "/api/v1/cards/1", close=False) + put_files(), (200, 403), DISABLED,
         forwarded=(Sent("GET", "/api/v1/cards/1", length=None),), deprecated="yes"),
    Case("pipelined-text-comment-then-file-comment", comment(TEXT_BODY, close=False) + comment(FILE_BODY), (200, 403),
         DISABLED, forwarded=(Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY),), deprecated="yes"),
    Case("pipelined-blocked-put-then-get", put_files(close=False) + http("GET", "/api/v1/cards/7"), (403, 200),
         forwarded=(Sent("GET", "/api/v1/cards/7", length=None),)),
    Case("pipelined-chunked-json-then-put", comment(b"", "application/json", close=False,
         headers=[("Transfer-Encoding", "chunked")]) + chunked(JSON_BODY, 8) + put_files(), (200, 403), DISABLED,
         forwarded=(Sent("POST", "/api/v1/cards/1/comments", JSON_BODY, length=None),)),  # fmt: skip
    Case("override-to-head-is-refused", http("POST", "/api/v1/cards/1/comments",
         [("Content-Type", MP), ("X-HTTP-Method-Override", "HEAD")], FILE_BODY), (400,), "AMBIGUOUS_METHOD"),
    Case("disagreeing-overrides-are-refused", http("POST", "/api/v1/cards/1/files?_method=POST",
         [("Content-Type", MP), ("X-HTTP-Method-Override", "PUT")], FILE_BODY), (400,), "AMBIGUOUS_METHOD"),
    # --- refused: a multipart body that parsers could read differently ------------------------------------------
    framing("duplicate-content-type-header",
            http("POST", "/api/v1/cards/1/comments", [("Content-Type", "application/json"), ("Content-Type", MP)],
                 FILE_BODY)),  # fmt: skip
    refused("duplicate-boundary-parameter", comment(FILE_BODY, f"{MP}; boundary=other"), "duplicate_boundary"),
    refused("extended-boundary-parameter", comment(FILE_BODY, f"{MP}; boundary*=utf-8''other"), "boundary_parameter"),
    refused("missing-boundary", comment(FILE_BODY, "multipart/form-data"), "missing_boundary"),
    refused("boundary-with-semicolon", comment(FILE_BODY, 'multipart/form-data; boundary="a;b"'), "boundary_characters"),
    blocked("quoted-boundary-with-comma", comment(FILE_BODY.replace(f"--{B}".encode(), b"--a,b"),
                                                  'multipart/form-data; boundary="a,b"')),
    refused("boundary-too-long", comment(TEXT_BODY, f"multipart/form-data; boundary={'b' * 71}"), "boundary_characters"),
    refused("multipart-mixed", comment(FILE_BODY, f"multipart/mixed; boundary={B}"), "multipart_subtype"),
    blocked("nested-multipart", comment(with_part('Content-Disposition: form-data; name="inner"',
                                                  "Content-Type: multipart/mixed; boundary=inner"))),
    refused("lf-line-endings", comment(TEXT_BODY.replace(b"\r\n", b"\n")), "line_endings"),
    refused("lf-in-part-headers", comment(with_part('Content-Disposition: form-data; name="a"\nX-A: 1')),
            "line_endings"),
    refused("folded-part-header", comment(with_part('Content-Disposition: form-data;', ' name="a"')), "folded_header"),
    # A part whose headers break a rule but that is a file part to the guard anyway gets the spec's 403.
    blocked("duplicate-disposition-one-with-filename",
            comment(with_part('Content-Disposition: form-data; name="a"',
                              'Content-Disposition: form-data; name="b"; filename="b"'))),  # fmt: skip
    refused("duplicate-disposition", comment(with_part('Content-Disposition: form-data; name="a"',
                                                       'Content-Disposition: form-data; name="b"')),
            "duplicate_part_content_disposition"),  # fmt: skip
    blocked("duplicate-part-content-type-one-not-text",
            comment(with_part('Content-Disposition: form-data; name="a"', "Content-Type: text/plain",
                              "Content-Type: image/png"))),  # fmt: skip
    refused("duplicate-part-content-type", comment(with_part('Content-Disposition: form-data; name="a"',
                                                             "Content-Type: text/plain",
                                                             "Content-Type: text/plain; charset=utf-8")),
            "duplicate_part_content_type"),  # fmt: skip
    blocked("duplicate-filename-parameter", comment(with_part('Content-Disposition: form-data; name="a"; '
                                                              'filename="a.txt"; filename="b.txt"'))),  # fmt: skip
    refused("duplicate-name-parameter", comment(with_part('Content-Disposition: form-data; name="a"; name="b"')),
            "duplicate_disposition_parameter"),
    refused("ambiguous-part-then-text", comment(multipart_body([(['Content-Disposition: form-data; name="a"; name="b"'],
                                                                 b"x"), TEXT], B)), "duplicate_disposition_parameter"),
    refused("backslash-escape-hiding-filename",
            comment(with_part('Content-Disposition: form-data; name="a\\"; filename=\\"x.txt"')), "filename_outside_parameter"),
    refused("filename-inside-a-quoted-name", comment(with_part('Content-Disposition: form-data; name="a; filename=x"')),
            "filename_outside_parameter"),
    refused("part-without-disposition", comment(with_part("Content-Type: text/plain")), "missing_disposition"),
    refused("disposition-type-attachment", comment(with_part('Content-Disposition: attachment; name="a"')),
            "disposition_type"),
    refused("continued-name-parameter", comment(with_part("Content-Disposition: form-data; name*0=fi; name*1=les")),
            "extended_name"),
    refused("unterminated-body", comment(TEXT_BODY[: -len(f"--{B}--\r\n")]), "unterminated_body"),
    refused("empty-multipart-body", comment(b""), "unterminated_body"),
    blocked("preamble-then-file-part", comment(b"preamble text\r\n" + FILE_BODY)),
    refused("boundary-mid-line-in-preamble", comment(b"preamble --" + B.encode() + b"\r\n" + FILE_BODY), "preamble"),
    refused("boundary-mid-line", comment(TEXT_BODY.replace(b"hello, world\r\n", b"hello, world")),
            "delimiter_not_on_own_line"),
    refused("transport-padding-after-delimiter", comment(TEXT_BODY.replace(f"--{B}\r\n".encode(), f"--{B} \r\n".encode())),
            "delimiter_suffix"),
    refused("data-after-close-delimiter", comment(TEXT_BODY + multipart_body([FILE], B)), "epilogue"),
    refused("boundary-inside-part-headers", comment(with_part('Content-Disposition: form-data; name="a"', f"X-Note: --{B}")),
            "delimiter_in_headers"),
    refused("quoted-boundary-with-quoted-delimiter",
            comment(TEXT_BODY[: -len(f"--{B}--\r\n")] + f'--"{B}"\r\n'.encode()
                    + b'Content-Disposition: form-data; name="a"; filename="a"\r\n\r\nx\r\n' + f"--{B}--\r\n".encode(),
                    f'multipart/form-data; boundary="{B}"'),
            "alternate_delimiter"),  # fmt: skip
    refused("part-headers-too-large", comment(with_part('Content-Disposition: form-data; name="a"', "X-Pad: " + "p" * 20000)),
            "part_headers_too_large"),
    refused("content-type-mentions-multipart", comment(FILE_BODY, f'text/plain; x="multipart/form-data"; boundary={B}'),
            "content_type_mentions_multipart"),
    refused("content-type-list", comment(FILE_BODY, f"application/json, {MP}"), "malformed_content_type"),
    refused("content-encoding-gzip", comment(FILE_BODY, headers=[("Content-Encoding", "gzip")]), "content_encoding",
            415, "LEGACY_UPLOAD_ENCODED"),
    refused("content-encoding-identity", comment(TEXT_BODY, headers=[("Content-Encoding", "identity")]),
            "content_encoding", 415, "LEGACY_UPLOAD_ENCODED"),
    # Refused at the edge on every route (400 BAD_TRANSFER_ENCODING), before the guard's own transfer_coding rule.
    Case("transfer-coding-gzip-chunked",
         comment(b"", headers=[("Transfer-Encoding", "gzip, chunked")]) + chunked(FILE_BODY, 100), (400,),
         "BAD_TRANSFER_ENCODING"),
    # An empty list element is no coding (RFC 9110 5.6.1): ", chunked" is chunked, for the edge and the guard alike.
    blocked("transfer-coding-empty-element-file", comment(b"", headers=[("Transfer-Encoding", ", chunked")])
            + chunked(FILE_BODY, 100)),  # fmt: skip
    passed("transfer-coding-empty-element-text", comment(b"", headers=[("Transfer-Encoding", " ,chunked")])
           + chunked(TEXT_BODY, 100), Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY, length=None)),
    refused("look-ahead-exceeded", comment(BIG_TEXT), "look_ahead_exceeded", 413, "LEGACY_UPLOAD_UNDECIDED"),
    # --- refused by the HTTP parser: malformed framing never reaches any upstream --------------------------------
    framing("content-length-and-transfer-encoding", comment(b"", headers=[("Content-Length", "10"),
                                                                         ("Transfer-Encoding", "chunked")])
            + chunked(FILE_BODY, 50)),  # fmt: skip
    framing("transfer-encoding-and-content-length", comment(b"", headers=[("Transfer-Encoding", "chunked"),
                                                                         ("Content-Length", "10")])
            + chunked(FILE_BODY, 50)),  # fmt: skip
    framing("obs-fold-in-content-type", comment(FILE_BODY, "text/plain\r\n multipart/form-data; boundary=" + B)),
    framing("bare-lf-in-head", comment(FILE_BODY).replace(b"\r\n", b"\n", 2)),
    framing("duplicate-content-length", comment(FILE_BODY, headers=[("Content-Length", str(len(FILE_BODY)))] * 2)),
    framing("transfer-encoding-chunked-identity", comment(b"", headers=[("Transfer-Encoding", "chunked, identity")])
            + chunked(FILE_BODY, 50)),  # fmt: skip
    framing("space-before-colon", comment(FILE_BODY).replace(b"Content-Type:", b"Content-Type :")),
    # --- passed, byte for byte ------------------------------------------------------------------------------------
    passed("comment-json", comment(JSON_BODY, "application/json"), Sent("POST", "/api/v1/cards/1/comments", JSON_BODY)),
    passed("comment-urlencoded", comment(b"text=hello+world&files=none", "application/x-www-form-urlencoded"),
           Sent("POST", "/api/v1/cards/1/comments", b"text=hello+world&files=none")),
    passed("comment-text-multipart", comment(TEXT_BODY), Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY)),
    passed("comment-text-plain-part", comment(t := with_part('Content-Disposition: form-data; name="note"',
                                                             "Content-Type: text/plain; charset=utf-8")),
           Sent("POST", "/api/v1/cards/1/comments", t)),  # fmt: skip
    passed("comment-text-mentions-filename-in-content",
           comment(t2 := with_part('Content-Disposition: form-data; name="note"',
                                   content=b'Content-Disposition: form-data; name="x"; filename="evil.exe"')),
           Sent("POST", "/api/v1/cards/1/comments", t2)),  # fmt: skip
    passed("comment-patch-text-chunked-extensions-trailers",
           comment(b"", method="PATCH", target="/api/v1/cards/1/comments/2", headers=[("Transfer-Encoding", "chunked")])
           + CHUNKED_TEXT, Sent("PATCH", "/api/v1/cards/1/comments/2", TEXT_BODY, length=None)),  # fmt: skip
    passed("comment-content-type-case", comment(TEXT_BODY, f"Multipart/Form-Data; Boundary={B}"),
           Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY)),
    passed("comment-text-without-final-crlf", comment(t3 := TEXT_BODY[:-2]), Sent("POST", "/api/v1/cards/1/comments", t3)),
    passed("comment-text-upper-case-path", comment(TEXT_BODY, target="/API/V1/CARDS/1/COMMENTS"),
           Sent("POST", "/API/V1/CARDS/1/COMMENTS", TEXT_BODY)),
    passed("comment-text-percent-encoded-dot-path", comment(TEXT_BODY, target="/api/v1/x/../%63ards/1/comments/"),
           Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY)),
    passed("comment-text-expect-100-continue", comment(TEXT_BODY, headers=[("Expect", "100-continue")]),
           Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY), wait_for_continue=True, continue_expected=True),
    passed("comment-json-http-1.0", comment(JSON_BODY, "application/json", version="HTTP/1.0", close=False),
           Sent("POST", "/api/v1/cards/1/comments", JSON_BODY)),
    passed("comment-text-via-override", comment(TEXT_BODY, target="/api/v1/cards/1/comments/2",
                                                headers=[("X-HTTP-Method-Override", "PATCH")]),
           Sent("PATCH", "/api/v1/cards/1/comments/2", TEXT_BODY)),  # fmt: skip
    passed("comment-gzip-json-stays-encoded", comment(b"\x1f\x8bfake-gzip", "application/json",
                                                      headers=[("Content-Encoding", "gzip")]),
           Sent("POST", "/api/v1/cards/1/comments", b"\x1f\x8bfake-gzip", encoding="gzip")),  # fmt: skip
    passed("pipelined-two-text-comments", comment(TEXT_BODY, close=False) + comment(JSON_BODY, "application/json"),
           Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY), Sent("POST", "/api/v1/cards/1/comments", JSON_BODY)),
    passed("legacy-file-rename", http("PATCH", "/api/v1/cards/1/files/123", [("Content-Type", "application/json")],
                                      b'{"name": "renamed.pdf"}'),
           Sent("PATCH", "/api/v1/cards/1/files/123", b'{"name": "renamed.pdf"}')),  # fmt: skip
    passed("attach-file-by-url", http("POST", "/api/v1/cards/1/files", [("Content-Type", "application/json")],
                                      b'{"url": "https://example.test/a.pdf", "name": "a.pdf"}'),
           Sent("POST", "/api/v1/cards/1/files", b'{"url": "https://example.test/a.pdf", "name": "a.pdf"}')),
    passed("restricted-card-upload", http("POST", "/api/v1/cards/6f1c0de4-7a7e-4d4e-9a52-0c1f2a3b4c5d/files",
                                          [("Content-Type", MP)], FILE_BODY),
           Sent("POST", "/api/v1/cards/6f1c0de4-7a7e-4d4e-9a52-0c1f2a3b4c5d/files", FILE_BODY)),  # fmt: skip
    passed("restricted-comment-upload", http("POST", f"/api/latest/cards/{U}/comments/{C}/files", [("Content-Type", MP)],
                                             FILE_BODY),
           Sent("POST", f"/api/latest/cards/{U}/comments/{C}/files", FILE_BODY)),  # fmt: skip
    passed("restricted-property-upload", http("POST", f"/api/v1/cards/{U}/custom-properties/{P}/files",
                                              [("Content-Type", MP)], FILE_BODY),
           Sent("POST", f"/api/v1/cards/{U}/custom-properties/{P}/files", FILE_BODY)),  # fmt: skip
    passed("restricted-upload-gzip-stays-encoded", http("POST", f"/api/v1/cards/{U}/files",
                                                        [("Content-Type", MP), ("Content-Encoding", "gzip")],
                                                        b"\x1f\x8b\x08\x00gz"),
           Sent("POST", f"/api/v1/cards/{U}/files", b"\x1f\x8b\x08\x00gz", encoding="gzip")),  # fmt: skip
    passed("restricted-file-metadata", http("GET", f"/api/v1/cards/{U}/files/f1?redirect=true"),
           Sent("GET", f"/api/v1/cards/{U}/files/f1?redirect=true", length=None)),
    passed("restricted-file-delete", http("DELETE", f"/api/v1/cards/{U}/files/f1"),
           Sent("DELETE", f"/api/v1/cards/{U}/files/f1", length=False)),
    passed("get-on-deprecated-path", http("GET", "/api/v1/cards/1/files"), Sent("GET", "/api/v1/cards/1/files", length=None)),
    passed("options-on-deprecated-path", http("OPTIONS", "/api/v1/cards/1/files"),
           Sent("OPTIONS", "/api/v1/cards/1/files", length=False)),
    passed("put-override-to-post-is-the-restricted-upload", http("PUT", f"/api/v1/cards/{U}/files",
                                                                 [("Content-Type", MP), ("X-HTTP-Method-Override", "POST")],
                                                                 FILE_BODY),
           Sent("POST", f"/api/v1/cards/{U}/files", FILE_BODY)),  # fmt: skip
    passed("put-without-body", http("PUT", "/api/v1/cards/1/files"), Sent("PUT", "/api/v1/cards/1/files", length=False)),
    # --- the forbid setting off: uploads pass unchanged and say the route is deprecated ------------------------
    passed("forbid-off-put-upload", put_files(host="old.test"), Sent("PUT", "/api/v1/cards/1/files", FILE_BODY),
           deprecated="yes"),
    passed("forbid-off-comment-upload", comment(FILE_BODY, host="old.test"),
           Sent("POST", "/api/v1/cards/1/comments", FILE_BODY), deprecated="yes"),
    passed("forbid-off-ambiguous-body-passes", comment(lf := FILE_BODY.replace(b"\r\n", b"\n"), host="old.test"),
           Sent("POST", "/api/v1/cards/1/comments", lf), deprecated="yes"),
    # --- found by the differential harness (tests/adversarial/parser_disagreements.py) -----------------------------
    *(passed(f"differential-{d.id}", comment(d.body, d.ct), Sent("POST", "/api/v1/cards/1/comments", d.body))
      if d.expect == "passed" else blocked(f"differential-{d.id}", comment(d.body, d.ct)) if d.expect == "blocked"
      else refused(f"differential-{d.id}", comment(d.body, d.ct), d.rule or "") for d in DISAGREEMENTS),
    passed("forbid-off-text-comment-not-marked", comment(TEXT_BODY, host="old.test"),
           Sent("POST", "/api/v1/cards/1/comments", TEXT_BODY), deprecated="no"),
    *BODY_OVERRIDES,
    *LEGACY_IDS,
]


def test_the_corpus_is_large_enough() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    kept_out = [c for c in CASES if not c.forwarded or c.statuses[-1] != 200]
    let_through = [c for c in CASES if c.forwarded and c.statuses[-1] == 200]
    assert len(CASES) >= 40 and len(kept_out) >= 20 and len(let_through) >= 20


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_raw_request(case: Case, guarded_gw: RunningGateway, counting_upstream: CountingUpstream) -> None:
    data = await send_raw(guarded_gw.port, case.data, wait_for_continue=case.wait_for_continue)
    responses = parse_responses(data)
    assert tuple(status for status, _, _ in responses) == case.statuses, data[:600]
    assert (b" 100 Continue\r\n" in data) == case.continue_expected
    _, headers, body = responses[-1]
    if case.code is not None:
        assert headers["content-type"].startswith("application/json")
        answer = json.loads(body)
        assert answer["code"] == case.code
        assert answer.get("rule") == case.rule
        # Refused before routing (core answers) there is no request-id policy, hence no header: the body has one.
        assert answer["request_id"] == headers.get("x-request-id", answer["request_id"])
    if case.deprecated != "any":
        assert ("deprecation" in headers) == (case.deprecated == "yes"), headers
    if case.deprecated == "yes":
        assert headers["deprecation"] == DEPRECATION
        # A Link, where there is one, is a URL a client can follow: every placeholder of the successor filled.
        assert "%7B" not in headers.get("link", "") and "{" not in headers.get("link", "")

    got = counting_upstream.received
    assert [(r.method, r.raw_path) for r in got] == [(s.method, s.path) for s in case.forwarded]
    for received, sent in zip(got, case.forwarded, strict=True):
        assert received.body_complete
        assert received.body_size == len(sent.body)
        assert received.body_sha256 == hashlib.sha256(sent.body).hexdigest()
        if sent.length is not False:
            assert received.header("Content-Length") == (str(len(sent.body)) if sent.length else None)
        assert received.header("Content-Encoding") == sent.encoding
    if not case.forwarded:
        assert counting_upstream.connections == 0
