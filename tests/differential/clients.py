"""Multipart bodies as real clients write them, for seeded random forms.

The writers are the real libraries where the machine has them: requests, httpx and aiohttp (in-process), curl (a
child process posting to a recorder on 127.0.0.1), Node's own FormData (undici), the form-data package, axios with
its own serializer and axios with form-data (tests/differential/node/write.mjs), and Python's email package (a MIME
writer that writes a preamble and an epilogue, as mail-derived MIME libraries in Java and elsewhere do). Two shapes
have no library here and are written by rule, and named so: ``browser`` (the HTML standard's encoding, which undici
implements, with WebKit's or Gecko's boundary and the empty file input a browser sends) and ``go-style`` (Go's
mime/multipart.Writer: backslash-escaped quotes, octet-stream file parts, a 60-hex-digit boundary).

Clients choose their boundaries at random; each is replaced by a seeded one of the same shape, so that a seed
gives the same bytes on every run.
"""

from __future__ import annotations

import base64
import email.generator
import email.policy
import io
import json
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from pathlib import Path

import aiohttp
import httpx
import requests

from tests.differential.parsers import NODE_DIR, node_problem

__all__ = ("Field", "Sample", "WRITERS", "random_form", "write_forms")

URL = "http://127.0.0.1/api/v1/cards/7/comments/9"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    value: str = ""  # a text field's value
    filename: str | None = None  # a file field (with data, even empty)
    content_type: str | None = None
    data: bytes | None = None

    @property
    def is_file(self) -> bool:
        return self.data is not None


Form = tuple[Field, ...]


def _data(field: Field) -> bytes:
    """A file field's bytes (a file field is one with data)."""
    assert field.data is not None
    return field.data


@dataclass(frozen=True, slots=True)
class Sample:
    family: str  # the writer, then "+mutations" for a mutated body
    ct: str
    body: bytes
    chunks: tuple[int, ...] = ()  # how it reaches the guard (all at once when empty)


# --- seeded forms ---------------------------------------------------------------------------------------------

TEXT_NAMES = ("text", "comment", "title", "description", "filename", "file_name", "filesize", "profile", "name",
              "mentions[]", "meta[author]", "text-1", "élan", "with space", 'say "hi"', "a;b", "files_count")
FILE_NAMES = ("files[]", "files", "file", "files[0]", "attachment", "upload", "document")
FILENAMES = ("report.pdf", "a.txt", "photo.JPG", "été à la plage.png", "with space.txt", 'quote".txt',
             "semi;colon.txt", "back\\slash.txt", "C:\\Users\\me\\notes.txt", "no-extension", "--dashes--.bin",
             "filename.txt", "name=files[].txt", "")
FILE_TYPES = (None, "application/octet-stream", "image/png", "text/plain", "application/pdf", "application/json")
TEXT_VALUES = (
    "hello", "", "edited comment", "two\nlines", "crlf\r\nline", "ünïcödé ✓", "-- not a delimiter",
    'Content-Disposition: form-data; name="files[]"; filename="evil.exe"', "filename=evil.exe; name=files[]",
    "\r\n--\r\n", "x" * 300,
)


def random_form(rng: random.Random, *, files: bool | None = None) -> Form:
    """1 to 4 text fields and, when ``files`` (by default half of the time), 1 or 2 file fields."""
    fields = [Field(rng.choice(TEXT_NAMES), rng.choice(TEXT_VALUES)) for _ in range(rng.randint(1, 4))]
    if files if files is not None else rng.random() < 0.5:
        for _ in range(rng.randint(1, 2)):
            data = bytes(rng.randrange(256) for _ in range(rng.choice((0, 3, 40, 200))))
            if rng.random() < 0.3:
                data += b"\r\n--" + data[:5] + b"\r\n\r\n"
            fields.insert(rng.randint(0, len(fields)),
                          Field(rng.choice(FILE_NAMES), filename=rng.choice(FILENAMES),
                                content_type=rng.choice(FILE_TYPES), data=data))
    return tuple(fields)


# --- boundaries -----------------------------------------------------------------------------------------------

_BOUNDARY_IN_CT = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_HEX = "0123456789abcdef"
_ALNUM = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Each writer's boundary: its fixed prefix and the alphabet of its random rest.
_BOUNDARY_SHAPES = {
    "requests": ("", _HEX), "httpx": ("", _HEX), "aiohttp": ("", _HEX), "curl": ("-" * 24, _HEX),
    "form-data": ("-" * 26, _HEX), "axios-form-data": ("-" * 26, _HEX),
    "undici": ("----formdata-undici-0", "0123456789"),
    "axios": ("axios-1.21.1-boundary-", _ALNUM + "-_"),
}


def _reseed(rng: random.Random, writer: str, ct: str, body: bytes) -> tuple[str, bytes]:
    """The same body with the random rest of its boundary drawn from ``rng``."""
    m = _BOUNDARY_IN_CT.search(ct)
    assert m is not None, ct
    old = m.group(1) or m.group(2)
    prefix, alphabet = _BOUNDARY_SHAPES[writer]
    assert old.startswith(prefix), f"{writer} writes another boundary now: {old!r}"
    while True:
        new = prefix + _boundary(rng, alphabet, len(old) - len(prefix))
        if new.encode() not in body:
            return ct.replace(old, new), body.replace(old.encode(), new.encode())


def _boundary(rng: random.Random, alphabet: str, size: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(size))


# --- writers --------------------------------------------------------------------------------------------------


def _requests(forms: Sequence[Form]) -> Iterator[tuple[str, bytes]]:
    for form in forms:
        data = [(f.name, f.value) for f in form if not f.is_file]
        files = [(f.name, (f.filename, _data(f), f.content_type) if f.content_type else (f.filename, _data(f)))
                 for f in form if f.is_file]
        prepared = requests.Request("POST", URL, data=data, files=files or None).prepare()
        if not files:  # requests writes text-only forms urlencoded; a multipart one needs a file tuple
            prepared = requests.Request("POST", URL, files=[(f.name, (None, f.value)) for f in form]).prepare()
        yield prepared.headers["Content-Type"], prepared.body  # type: ignore[misc]


def _httpx(forms: Sequence[Form]) -> Iterator[tuple[str, bytes]]:
    for form in forms:
        data: dict[str, list[str]] = {}
        for f in form:
            if not f.is_file:
                data.setdefault(f.name, []).append(f.value)
        files = [(f.name, (f.filename, _data(f), f.content_type) if f.content_type else (f.filename, _data(f)))
                 for f in form if f.is_file]
        if not files:  # httpx writes text-only forms urlencoded; a multipart one needs a file tuple
            data, files = {}, [(f.name, (None, f.value.encode())) for f in form]
        request = httpx.Request("POST", URL, data=data, files=files)
        yield request.headers["Content-Type"], request.read()


class _Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    async def write(self, chunk: bytes) -> None:
        self.data += chunk


async def _aiohttp(forms: Sequence[Form]) -> list[tuple[str, bytes]]:
    out = []
    for form in forms:
        fd = aiohttp.FormData(default_to_multipart=True)
        for f in form:
            if f.is_file:
                fd.add_field(f.name, io.BytesIO(f.data or b""), filename=f.filename, content_type=f.content_type)
            else:
                fd.add_field(f.name, f.value)
        sink = _Sink()
        try:
            payload = fd()
            await payload.write(sink)  # type: ignore[arg-type]
        except AssertionError:  # aiohttp cannot write a non-ASCII field name (it asserts "name=")
            continue
        out.append((str(payload.content_type), bytes(sink.data)))
    return out


def _email(forms: Sequence[Form], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """Python's email package: a preamble, an epilogue, quoted boundaries, backslash-escaped quotes."""
    preambles = ("This is a multi-part message in MIME format.", "", "Preamble: ignore me\nsecond line", None)
    for form in forms:
        boundary = rng.choice((
            "=" * 15 + _boundary(rng, "0123456789", 19) + "==",  # the package's own shape
            _boundary(rng, _HEX, 60),  # Go's mime/multipart
            _boundary(rng, "-_123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", 36),  # Apache, Spring
        ))
        msg = MIMEMultipart("form-data", boundary=boundary)
        msg.preamble = rng.choice(preambles)
        msg.epilogue = rng.choice(("", "This is the epilogue.", None))
        for f in form:
            maintype, _, subtype = (f.content_type or "text/plain").partition("/")
            part = MIMENonMultipart(maintype, subtype)
            del part["MIME-Version"]
            if not f.is_file:
                del part["Content-Type"]
            part.set_payload(_data(f) if f.is_file else f.value.encode())
            params = {"name": f.name} if not f.is_file else {"name": f.name, "filename": f.filename or ""}
            part.add_header("Content-Disposition", "form-data", **params)
            msg.attach(part)
        out = io.BytesIO()
        # typeshed ties the HTTP policy to EmailMessage; the generator writes any Message alike.
        email.generator.BytesGenerator(out, policy=email.policy.HTTP).flatten(msg)  # type: ignore[arg-type]
        head, _, body = out.getvalue().partition(b"\r\n\r\n")
        yield str(msg["Content-Type"]), body


def _go_style(forms: Sequence[Form], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """Go's mime/multipart.Writer, by rule (no Go toolchain here)."""
    def escape(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"')

    for form in forms:
        boundary = _boundary(rng, _HEX, 60)
        out = bytearray()
        for i, f in enumerate(form):
            out += (b"\r\n" if i else b"") + f"--{boundary}\r\n".encode()
            if f.is_file:
                out += (f'Content-Disposition: form-data; name="{escape(f.name)}"; '
                        f'filename="{escape(f.filename or "")}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                        ).encode() + (f.data or b"")
            else:
                out += f'Content-Disposition: form-data; name="{escape(f.name)}"\r\n\r\n{f.value}'.encode()
        out += f"\r\n--{boundary}--\r\n".encode()
        yield f"multipart/form-data; boundary={boundary}", bytes(out)


def _node(forms: Sequence[Form], timeout: float) -> dict[str, list[tuple[str, bytes]]]:
    problem = node_problem()
    if problem is not None:
        raise RuntimeError(problem)
    spec = [[{"name": f.name, "value": f.value} if not f.is_file else
             {"name": f.name, "filename": f.filename, "type": f.content_type,
              "data": base64.b64encode(f.data or b"").decode()} for f in form] for form in forms]
    done = subprocess.run(["node", str(NODE_DIR / "write.mjs")], input=json.dumps(spec).encode(), cwd=NODE_DIR,
                          capture_output=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"write.mjs failed: {done.stderr.decode()[-2000:]}")
    out: dict[str, list[tuple[str, bytes]]] = {}
    for line in done.stdout.decode().splitlines():
        row = json.loads(line)
        out.setdefault(row["writer"], []).append((row["ct"], base64.b64decode(row["body"])))
    return out


def _browser(undici: Sequence[tuple[str, bytes]], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """undici's bodies (the HTML standard's algorithm) with a browser's boundary."""
    for ct, body in undici:
        old = _BOUNDARY_IN_CT.search(ct)
        assert old is not None
        new = rng.choice(("----WebKitFormBoundary" + _boundary(rng, _ALNUM, 16),
                          "----geckoformboundary" + _boundary(rng, _HEX, 32)))
        yield ct.replace(old.group(2), new), body.replace(old.group(2).encode(), new.encode())


class _Recorder:
    """Records one HTTP request's body on 127.0.0.1 (for curl)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(10)
        self.port = self._sock.getsockname()[1]
        self.got: tuple[str, bytes] | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536) or b"\r\n\r\n"
            head, _, body = data.partition(b"\r\n\r\n")
            headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:])
            while len(body) < int(headers.get("Content-Length", 0)):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            self.got = (headers["Content-Type"], body)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def result(self) -> tuple[str, bytes]:
        self._thread.join(15)
        self._sock.close()
        assert self.got is not None, "curl sent nothing"
        return self.got


def _curl(forms: Sequence[Form]) -> Iterator[tuple[str, bytes]]:
    if shutil.which("curl") is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for n, form in enumerate(forms):
            base = ["curl", "-s", "-m", "10", "-o", "/dev/null", "-H", "Expect:"]
            args = list(base)
            for i, f in enumerate(form):
                # curl's -F syntax cannot carry every name: those it would misread are left out of its forms.
                if "=" in f.name or ";" in f.name or '"' in f.name:
                    continue
                if f.is_file:
                    path = Path(tmp, f"{n}-{i}")
                    path.write_bytes(f.data or b"")
                    # curl's -F syntax: a quoted filename, with backslash escapes.
                    quoted = (f.filename or "").replace("\\", "\\\\").replace('"', '\\"')
                    spec = f'{f.name}=@{path};filename="{quoted}"'
                    args += ["-F", spec + (f";type={f.content_type}" if f.content_type else "")]
                else:
                    args += ["--form-string", f"{f.name}={f.value}"]
            if args == base:
                continue
            recorder = _Recorder()
            subprocess.run([*args, f"http://127.0.0.1:{recorder.port}/"], timeout=15, check=False)
            yield recorder.result()


async def write_forms(forms: Sequence[Form], seed: int, *, timeout: float = 60) -> list[Sample]:
    """Every writer's body for every form, with seeded boundaries."""
    rng = random.Random(seed)
    node = _node(forms, timeout)
    written_by_aiohttp = await _aiohttp(forms)
    families: list[tuple[str, Callable[[], Iterator[tuple[str, bytes]]]]] = [
        ("requests", lambda: _requests(forms)),
        ("httpx", lambda: _httpx(forms)),
        ("aiohttp", lambda: iter(written_by_aiohttp)),
        ("curl", lambda: _curl(forms)),
        ("email-package", lambda: _email(forms, rng)),
        ("go-style", lambda: _go_style(forms, rng)),
        *((writer, (lambda w=writer: iter(node[w]))) for writer in ("undici", "form-data", "axios", "axios-form-data")),
        ("browser", lambda: _browser(node["undici"], rng)),
    ]
    samples = []
    for family, make in families:
        for ct, body in make():
            if family in _BOUNDARY_SHAPES:  # the others are seeded when written
                ct, body = _reseed(rng, family, ct, body)
            samples.append(Sample(family, ct, body))
    return samples


WRITERS = ("requests", "httpx", "aiohttp", "curl", "email-package", "go-style", "undici", "form-data", "axios",
           "axios-form-data", "browser")
