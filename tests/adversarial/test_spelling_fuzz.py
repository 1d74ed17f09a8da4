"""A seeded fuzz family: thousands of spellings of the guarded upload requests (paths, method overrides, framing)
sent as raw bytes through a real gateway process, in front of a raw recording upstream.

The invariant: no spelling reaches the upstream as a request that a lenient upstream would route to a guarded
upload route. "Lenient" is the union of what real stacks do: the path percent-decoded, backslashes read as slashes,
empty and dot segments resolved, trailing dots and spaces trimmed from segments (IIS, .NET), compared without case;
the method upper-cased, and any override honoured (the three override headers, ``_method`` in the query split on
``&`` or ``;``, and a ``_method`` field in a POST's form body, urlencoded or multipart). Every body carries a file part and the tenant forbids uploads, so the guard must have blocked or
refused each such request: any arrival is a bypass.

Every answer is also checked: a 403 with the spec's code, a 4xx with a JSON code, or the upstream's own answer;
never a 5xx, never silence.

Budget: ``FUZZ_SPELLINGS`` (default 3000) spellings from ``FUZZ_SEED`` (default 16). The long run is documented in
``docs/policies/legacy_upload_guard.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.gateway_testlib import guarded_routes, make_config, multipart_body, parse_responses
from tests.process_testlib import Proc, start

SEED = int(os.environ.get("FUZZ_SEED", "16"))
COUNT = int(os.environ.get("FUZZ_SPELLINGS", "3000"))
B = "fuzz-boundary"
FILE_BODY = multipart_body([(['Content-Disposition: form-data; name="text"'], b"hi"),
                            (['Content-Disposition: form-data; name="files[]"; filename="a.pdf"'], b"%PDF")], B)
OVERRIDE_HEADERS = ("X-HTTP-Method-Override", "X-Method-Override", "X-HTTP-Method")
# The guarded routes as a lenient upstream reads them: (method, path regex on the normalised path).
# The card files route takes any body as an upload; the comment routes only a body with a file part in it.
# The restricted upload routes with an earlier id (anything but a UUID) in a uid's place take a file as a legacy upload.
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_NOT_UUID = rf"(?!{_UUID}/)[^/]+"
GUARDED = [("PUT", re.compile(r"/api/(v1|latest)/cards/[^/]+/files"), False),
           ("POST", re.compile(r"/api/(v1|latest)/cards/[^/]+/comments"), True),
           ("PATCH", re.compile(r"/api/(v1|latest)/cards/[^/]+/comments/[^/]+"), True),
           ("POST", re.compile(rf"/api/(v1|latest)/cards/{_NOT_UUID}/files"), True),
           ("POST", re.compile(rf"/api/(v1|latest)/cards/({_NOT_UUID}/comments/[^/]+|[^/]+/comments/{_NOT_UUID})/files"),
            True),
           ("POST", re.compile(rf"/api/(v1|latest)/cards/({_NOT_UUID}/custom-properties/[^/]+|[^/]+/custom-properties/"
                               rf"{_NOT_UUID})/files"), True)]


# --- The lenient reading -----------------------------------------------------------------------------------------


def lenient_path(target: str) -> str:
    path = target.split("?", 1)[0]
    if "://" in path:
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    path = unquote(path, errors="replace").replace("\\", "/")
    out: list[str] = []
    for segment in path.split("/"):
        segment = segment.split(";", 1)[0]
        if segment == "..":
            if out:
                out.pop()
            continue
        segment = segment.rstrip(". ")
        if segment:
            out.append(segment)
    return "/" + "/".join(out).lower()


def lenient_methods(method: str, target: str, headers: list[tuple[str, str]]) -> set[str]:
    methods = {method.upper()}
    methods |= {v.strip().upper() for k, v in headers if k.lower() in {h.lower() for h in OVERRIDE_HEADERS}}
    query = target.partition("?")[2]
    for pair in re.split("[&;]", query):
        key, _, value = pair.partition("=")
        if unquote(key.replace("+", " ")).strip().lower() == "_method":
            methods.add(unquote(value.replace("+", " ")).strip().upper())
    return methods


_MULTIPART_METHOD_RE = re.compile(rb'name="?_method"?[^\r\n]*\r?\n(?:[^\r\n]+\r?\n)*\r?\n([^\r\n]*)', re.I)


def body_methods(method: str, headers: list[tuple[str, str]], body: bytes) -> set[str]:
    """``_method`` in a POST's body, read as leniently as any framework: every form-looking body, both separators."""
    if method.upper() != "POST" or not body:
        return set()
    found = {m.group(1).decode("latin-1").strip().upper() for m in _MULTIPART_METHOD_RE.finditer(body)}
    for pair in re.split("[&;]", body.decode("latin-1")):
        key, _, value = pair.partition("=")
        if unquote(key.replace("+", " ")).strip().lower() == "_method":
            found.add(unquote(value.replace("+", " ")).strip().upper())
    return found


def lands_on_guarded_route(method: str, target: str, headers: list[tuple[str, str]], body: bytes = b"") -> bool:
    path = lenient_path(target)
    methods = lenient_methods(method, target, headers) | body_methods(method, headers, body)
    has_file = b"filename" in body.lower()
    return any(m in methods and rx.fullmatch(path) and (has_file or not file_only) for m, rx, file_only in GUARDED)


# --- A raw recording upstream --------------------------------------------------------------------------------------


@dataclass
class Arrival:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes = b""


@dataclass
class RawUpstream:
    """Reads requests as bytes (no HTTP library in the way: nothing it would reject is hidden), records them and
    answers 200."""

    arrivals: list[Arrival] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                line, *rest = head[:-4].split("\r\n")
                method, target, _ = line.split(" ", 2)
                headers = [(k.strip(), v.strip()) for k, _, v in (h.partition(":") for h in rest)]
                arrival = Arrival(method, target, headers)
                self.arrivals.append(arrival)
                names = {k.lower(): v for k, v in headers}
                body = bytearray()
                if "chunked" in names.get("transfer-encoding", "").lower():
                    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                        body += (await reader.readexactly(size + 2))[:-2]
                        arrival.body = bytes(body)
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                elif "content-length" in names:
                    arrival.body = await reader.readexactly(int(names["content-length"]))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nupstream")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    yield upstream
    server.close()


# --- Spellings ----------------------------------------------------------------------------------------------------


def _encode(rng: random.Random, ch: str) -> str:
    spelled = f"%{ord(ch):02X}" if ord(ch) < 128 else ch
    return spelled.lower() if rng.random() < 0.5 else spelled


def spell_segment(rng: random.Random, segment: str) -> str:
    out = "".join(c.upper() if rng.random() < 0.15 else c for c in segment)
    if rng.random() < 0.3:
        out = "".join(_encode(rng, c) if rng.random() < 0.3 else c for c in out)
    roll = rng.random()
    if roll < 0.08:
        out += rng.choice([".", "..", "%2e", "%2E", "%20", ".%20", "%20.", "%2e%2e"])
    elif roll < 0.11:
        out += rng.choice([";x=1", "%3b", "%00", "%09", "%2f", "\\", "%5c"])
    elif roll < 0.13:
        out = rng.choice(["%252e", "%25", "\u00a0"]) + out
    return out


def spell_path(rng: random.Random, segments: list[str]) -> str:
    out: list[str] = []
    for segment in segments:
        roll = rng.random()
        if roll < 0.05:
            out += [rng.choice(["x", "cards", "%2e%2e"]), ".."]
        elif roll < 0.10:
            out.append(rng.choice([".", "%2e", ""]))
        out.append(spell_segment(rng, segment))
    path = "/" + "/".join(out)
    roll = rng.random()
    if roll < 0.08:
        path += "/"
    elif roll < 0.11:
        path = "/" + path
    elif roll < 0.14:
        path = "http://127.0.0.1" + path
    return path


# Body framings ("{n}" is the body's length): the plain ones, and the ones the edge refuses.
FRAMINGS: list[list[tuple[str, str]]] = [
    [("Content-Length", "{n}")]] * 6 + [[("Transfer-Encoding", "chunked")]] * 3 + [
    [("Content-Length", "0{n}")], [("Transfer-Encoding", "Chunked")], [("Transfer-Encoding", "gzip, chunked")],
    [("Transfer-Encoding", "chunked"), ("Content-Length", "{n}")], [("Content-Length", "{n}"), ("Content-Length", "{n}")],
    [("Transfer-Encoding", "identity")], [("Content-Length", "{n}, {n}")],
]


@dataclass(frozen=True)
class Spelling:
    id: int
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    data: bytes


def spelling(rng: random.Random, n: int) -> Spelling:
    prefix = rng.choice([["api", "v1"], ["api", "latest"]])
    kind = rng.choice(["put_files", "post_comment", "patch_comment", "post_files", "post_comment_files"])
    segments = prefix + ["cards", str(rng.randint(1, 999)), "files" if kind.endswith("files") else "comments"]
    if kind == "patch_comment":
        segments.append(str(rng.randint(1, 999)))
    elif kind == "post_comment_files":
        segments[-1:] = ["comments", rng.choice([str(rng.randint(1, 999)), "5a0b9c8d-7e6f-4a1b-8c2d-3e4f5a6b7c8d"]),
                         "files"]
    wanted = {"put_files": "PUT", "patch_comment": "PATCH"}.get(kind, "POST")
    headers: list[tuple[str, str]] = [("Host", "127.0.0.1"), ("X-Fuzz-Id", str(n))]
    query: list[str] = []
    method = wanted
    body = FILE_BODY
    content_type: str | None = f"multipart/form-data; boundary={B}"
    roll = rng.random()
    if roll < 0.12 and wanted != "POST":  # the override in a POST's form body
        method = "POST"
        body, content_type = body_override(rng, wanted)
    elif roll < 0.35:  # arrive as an override on another method
        method = rng.choice(["POST", "GET", "PUT", "PATCH", "DELETE"])
        if rng.random() < 0.5:
            name = rng.choice(OVERRIDE_HEADERS)
            name = name.lower() if rng.random() < 0.3 else name
            headers.append((name, rng.choice([wanted, wanted.lower(), f" {wanted} "])))
        else:
            key = rng.choice(["_method", "_METHOD", "%5Fmethod", "%5fmethod", "_%6Dethod"])
            query.append(f"{key}={rng.choice([wanted, wanted.lower(), wanted + '+'])}")
        if rng.random() < 0.3:
            query.insert(0, "a=1")
    elif roll < 0.40:
        method = wanted.lower()
    target = spell_path(rng, segments)
    if query:
        target += "?" + rng.choice(["&", ";"]).join(query)
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    cut = rng.randint(1, len(body) - 1)
    chunks = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in (body[:cut], body[cut:])) + b"0\r\n\r\n"
    framing = rng.choice(FRAMINGS)
    headers += [(k, v.replace("{n}", str(len(body)))) for k, v in framing]
    body = chunks if any(k == "Transfer-Encoding" for k, _ in framing) else body
    if rng.random() < 0.1:
        headers.append(("Expect", rng.choice(["100-continue", "100-Continue"])))
    headers.append(("Connection", "close"))
    version = "HTTP/1.0" if rng.random() < 0.05 else "HTTP/1.1"
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return Spelling(n, method, target, tuple(headers), head.encode("utf-8") + body)


TEXT_PART = (['Content-Disposition: form-data; name="text"'], b"hi")
FILE_PART = (['Content-Disposition: form-data; name="files[]"; filename="a.pdf"'], b"%PDF")


def body_override(rng: random.Random, wanted: str) -> tuple[bytes, str | None]:
    """A form body whose ``_method`` field says ``wanted``: multipart (the field anywhere among a text and a file
    part) or urlencoded (both separators, encoded keys, with or without a Content-Type)."""
    value = rng.choice([wanted, wanted.lower(), f" {wanted} "])
    if rng.random() < 0.6:
        name = rng.choice(["_method", "_METHOD", "_Method"])
        field = ([f'Content-Disposition: form-data; name="{name}"'], value.encode())
        parts = [TEXT_PART, FILE_PART]
        parts.insert(rng.randint(0, 2), field)
        ct = rng.choice([f"multipart/form-data; boundary={B}", f'Multipart/Form-Data; boundary="{B}"',
                         f"multipart/form-data; charset=utf-8; boundary={B}"])
        return multipart_body(parts, B), ct
    key = rng.choice(["_method", "_METHOD", "%5Fmethod", "%5fmethod", "_%6Dethod"])
    pairs = [f"{key}={value.replace(' ', '+')}", "note=hello", "file=%25PDF"]
    rng.shuffle(pairs)
    body = rng.choice(["&", ";"]).join(pairs).encode()
    ct = rng.choice(["application/x-www-form-urlencoded", "application/x-www-form-urlencoded; charset=UTF-8", None])
    return body, ct


def spellings(seed: int, count: int) -> list[Spelling]:
    rng = random.Random(seed)
    return [spelling(rng, n) for n in range(count)]


# --- The family ---------------------------------------------------------------------------------------------------


async def _send(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read(-1)
    finally:
        writer.close()


def test_the_lenient_reading_sees_the_tricks() -> None:
    """The oracle itself: it must read every known trick as the guarded route, or the fuzz proves nothing."""
    h = [("X-HTTP-Method-Override", "put")]
    assert lands_on_guarded_route("PUT", "/api/v1/cards/1/files.", [])
    assert lands_on_guarded_route("PUT", "/API/v1/%63ards/1/files%20", [])
    assert lands_on_guarded_route("POST", "/api/v1/cards/1/files", h)
    assert lands_on_guarded_route("POST", "/api/v1/cards/1/files?a=1;_method=PUT", [])
    assert lands_on_guarded_route("put", "/api/v1/x/..\\cards/1/files/", [])
    assert lands_on_guarded_route("POST", "http://h/api/v1/cards/1/comments", [], FILE_BODY)
    assert lands_on_guarded_route("POST", "/api/v1/cards/1/files", [], b"note=1;%5Fmethod=put")
    assert lands_on_guarded_route("POST", "/api/v1/cards/1/comments/2", [],
                                  b'--b\r\nContent-Disposition: form-data; name="_METHOD"\r\n\r\nPATCH\r\n' + FILE_BODY)
    # A comment's text, whatever the method: not an upload.
    assert not lands_on_guarded_route("POST", "/api/v1/cards/1/comments/2", [], b"text=hi&_method=PATCH")
    assert not lands_on_guarded_route("POST", "/api/v1/cards/1/comments", [])
    assert not lands_on_guarded_route("PUT", "/api/v1/cards/1/comments/2", [], b"_method=PATCH")
    assert not lands_on_guarded_route("POST", "/api/v1/cards/1/files", [])
    # The restricted upload routes' paths with an earlier id: a file part is a legacy upload; a UUID path is not.
    assert lands_on_guarded_route("POST", "/api/v1/cards/1/files", [], FILE_BODY)
    assert lands_on_guarded_route("POST", "/api/v1/cards/1/comments/5a0b9c8d-7e6f-4a1b-8c2d-3e4f5a6b7c8d/files", [],
                                  FILE_BODY)
    assert lands_on_guarded_route("POST", "/api/v1/cards/%30/custom-properties/2/files", [], FILE_BODY)
    assert not lands_on_guarded_route("POST", "/api/v1/cards/0D6C1A5E-3b7f-4c2a-9e8d-1f2a3b4c5d6e/files", [], FILE_BODY)
    assert not lands_on_guarded_route("GET", "/api/v1/cards/1/comments", [])


def test_spellings_are_reproducible_from_the_seed() -> None:
    assert spellings(SEED, 50) == spellings(SEED, 50)
    assert spellings(SEED, 50) != spellings(SEED + 1, 50)


async def test_no_spelling_reaches_the_upstream_on_a_guarded_route(raw_upstream: RawUpstream, tmp_path: Path) -> None:
    cases = spellings(SEED, COUNT)
    gw: Proc = await start(make_config(f"http://127.0.0.1:{raw_upstream.port}", routes=guarded_routes()), tmp_path)
    outcomes: Counter[str] = Counter()
    answers: dict[int, tuple[int, str]] = {}
    try:
        limit = asyncio.Semaphore(8)

        async def one(case: Spelling) -> None:
            async with limit:
                raw = await _send(gw.port, case.data)
            responses = parse_responses(raw)
            assert len(responses) == 1, f"spelling {case.id}: no single answer to {case.data[:300]!r}: {raw[:300]!r}"
            status, headers, payload = responses[0]
            assert status < 500, f"spelling {case.id}: {status} {payload[:200]!r}"
            label = payload.decode() if payload == b"upstream" else json.loads(payload)["code"]
            answers[case.id] = (status, label)
            outcomes[f"{status} {label}"] += 1

        await asyncio.gather(*(one(case) for case in cases))
    finally:
        gw.stop()
    by_id = {c.id: c for c in cases}
    bypasses = []
    for arrival in raw_upstream.arrivals:
        fuzz_id = int(dict((k.lower(), v) for k, v in arrival.headers)["x-fuzz-id"])
        assert answers[fuzz_id] == (200, "upstream")
        if lands_on_guarded_route(arrival.method, arrival.target, arrival.headers, arrival.body):
            bypasses.append((by_id[fuzz_id].data[:200], arrival))
    assert bypasses == [], bypasses[:5]
    # Forwarded spellings are exactly those answered by the upstream: none went missing, none arrived twice.
    assert sorted(int(dict((k.lower(), v) for k, v in a.headers)["x-fuzz-id"]) for a in raw_upstream.arrivals) == \
        sorted(i for i, answer in answers.items() if answer == (200, "upstream"))
    # The family exercises every road: blocked, refused by the path or override checks, and passed.
    assert outcomes["403 PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"] > COUNT // 4
    assert outcomes["400 BAD_PATH"] > 0 and outcomes["400 AMBIGUOUS_METHOD"] + outcomes["200 upstream"] > 0
    print(f"\nseed {SEED}, {COUNT} spellings:", dict(sorted(outcomes.items())))
