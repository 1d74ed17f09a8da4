"""What real multipart parsers see in a body: busboy and formidable (Node, tests/differential/node), python-multipart,
Werkzeug's form parser and aiohttp's MultipartReader (in-process).

Each parser gives a ``View``: the parts it reported (field name, filename, whether it hands the part over as a file)
before it finished, and its error if it rejected the body. Whether it *sees a file part* is decided in one place,
``View.sees_file``, by the issue's definition: a filename or filename* parameter as that parser reads it, or a field
name the service stores as a file (the guard's ``file_fields``, as the sandbox does). A parser's own notion of a file
(busboy: also ``application/octet-stream`` parts; formidable: any part with a Content-Type, text/plain included) is
kept as ``native_file`` and reported beside it, not counted: the service stores by field name.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import shutil
import subprocess
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import python_multipart
from aiohttp import BodyPartReader, MultipartReader, StreamReader
from aiohttp.base_protocol import BaseProtocol
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam
from multidict import CIMultiDict
from werkzeug.formparser import FormDataParser
from werkzeug.http import parse_options_header

__all__ = ("FILE_FIELDS", "NODE_DIR", "PARSERS", "NodeParsers", "Protocol", "View", "node_problem", "python_views")

# python-multipart logs every parse error as a warning before raising it.
logging.getLogger("python_multipart").setLevel(logging.CRITICAL)

NODE_DIR = Path(__file__).with_name("node")
NODE_PARSERS = ("busboy", "formidable")
PYTHON_PARSERS = ("python-multipart", "werkzeug", "aiohttp")
PARSERS = NODE_PARSERS + PYTHON_PARSERS
# The service's file fields (sandbox/comments.py; the guard's default file_fields): "files" covers "files[]" and
# "files[0]".
FILE_FIELDS = frozenset({"files", "file"})


@dataclass(frozen=True, slots=True)
class View:
    """One parser's reading of one body."""

    parts: tuple[tuple[str | None, str | None, bool], ...]  # (field name, filename, handed over as a file)
    error: str | None = None

    @property
    def accepts(self) -> bool:
        return self.error is None

    @property
    def sees_file(self) -> bool:
        # Counted even when the parser fails later: a streaming service may have stored the file by then.
        return any(filename is not None or _is_file_field(name) for name, filename, _ in self.parts)

    @property
    def native_file(self) -> bool:
        return any(native for _, _, native in self.parts)

    @property
    def names(self) -> tuple[str | None, ...]:
        return tuple(sorted((name for name, _, _ in self.parts), key=lambda n: (n is None, n or "")))

    def summary(self) -> str:
        if self.error is not None:
            return f"rejects ({self.error[:60]})" + (f" after {list(self.parts)}" if self.parts else "")
        return repr(list(self.parts))


def _is_file_field(name: str | None) -> bool:
    return name is not None and name.lower().partition("[")[0] in FILE_FIELDS


# --- Python parsers, in-process ---------------------------------------------------------------------------------


def _python_multipart(ct: str, body: bytes) -> View:
    parts: list[tuple[str | None, str | None, bool]] = []

    def on_field(field: Any) -> None:
        parts.append((_text(field.field_name), None, False))

    def on_file(file: Any) -> None:
        parts.append((_text(file.field_name), _text(file.file_name), True))

    headers = {"Content-Type": ct.encode("latin-1"), "Content-Length": str(len(body)).encode()}
    try:
        python_multipart.parse_form(headers, io.BytesIO(body), on_field, on_file)
    except Exception as err:  # the library's error types vary (FormParserError, ValueError, ...)
        return View(tuple(parts), f"{type(err).__name__}: {err}")
    return View(tuple(parts))


def _werkzeug(ct: str, body: bytes) -> View:
    mimetype, options = parse_options_header(ct)
    try:
        _, form, files = FormDataParser(silent=False).parse(io.BytesIO(body), mimetype, len(body), options)
    except Exception as err:  # ValueError, RequestEntityTooLarge, ...
        return View((), f"{type(err).__name__}: {err}")
    parts: list[tuple[str, str | None, bool]] = [(name, None, False) for name, _ in form.items(multi=True)]
    parts += [(name, storage.filename, True) for name, storage in files.items(multi=True)]
    return View(tuple(parts))


class Protocol(BaseProtocol):
    """Enough of a connection for a StreamReader that is fed by hand."""

    _reading_paused = False

    @property
    def connected(self) -> bool:
        return True


async def _aiohttp(ct: str, body: bytes) -> View:
    parts: list[tuple[str | None, str | None, bool]] = []
    stream = StreamReader(Protocol(asyncio.get_running_loop()), 2**16, loop=asyncio.get_running_loop())
    stream.feed_data(body)
    stream.feed_eof()
    try:
        with warnings.catch_warnings():
            # A Content-Disposition it cannot parse is dropped with a warning: that part has no name for it then.
            warnings.simplefilter("ignore", BadContentDispositionHeader)
            warnings.simplefilter("ignore", BadContentDispositionParam)
            await _read_multipart(MultipartReader(CIMultiDict({"Content-Type": ct}), stream), parts)
    except Exception as err:  # ValueError, AssertionError, BadHttpMessage, ... (see sandbox/bodies.py)
        return View(tuple(parts), f"{type(err).__name__}: {err}")
    return View(tuple(parts))


async def _read_multipart(reader: MultipartReader, parts: list[tuple[str | None, str | None, bool]]) -> None:
    async for part in reader:
        if isinstance(part, BodyPartReader):
            parts.append((part.name, part.filename, part.filename is not None))
            await part.release()
        else:
            # A nested multipart: aiohttp hands it over as a reader of its own; a service can read its parts.
            assert part is not None  # the iteration ends where the reader would answer None
            await _read_multipart(part, parts)


def _text(value: bytes | str | None) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


async def python_views(ct: str, body: bytes) -> dict[str, View]:
    return {
        "python-multipart": _python_multipart(ct, body),
        "werkzeug": _werkzeug(ct, body),
        "aiohttp": await _aiohttp(ct, body),
    }


# --- Node parsers, in one child process per batch ----------------------------------------------------------------


def node_problem() -> str | None:
    """Why the Node parsers cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed: tests/differential needs Node.js 20 or newer and npm (tests/differential/README.md)"
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    if int(version.lstrip("v").partition(".")[0] or 0) < 20:
        return f"node {version.strip()} is too old: tests/differential needs Node.js 20 or newer"
    for package in ("busboy", "formidable", "form-data", "axios"):
        if not (NODE_DIR / "node_modules" / package / "package.json").exists():
            npm = "" if shutil.which("npm") else " (npm is not installed: it is needed too)"
            return (f"the Node packages are not installed ({NODE_DIR}/node_modules/{package} is missing){npm}: "
                    "./scripts/test.sh installs them with npm ci, or run `npm ci` in that folder")
    return None


class NodeParsers:
    """busboy and formidable over a batch of bodies, in a child process that runs while Python does other work."""

    def __init__(self, batch: Sequence[tuple[str, bytes]], timeout: float) -> None:
        problem = node_problem()
        if problem is not None:
            raise RuntimeError(problem)
        lines = "".join(
            json.dumps({"ct": ct, "body": base64.b64encode(body).decode()}) + "\n" for ct, body in batch
        )
        self._count = len(batch)
        self._timeout = timeout
        self._proc = subprocess.Popen(
            ["node", str(NODE_DIR / "parse.mjs")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=NODE_DIR, env={**os.environ, "NODE_OPTIONS": ""},
        )
        self._out: tuple[bytes, bytes] = (b"", b"")
        self._thread = threading.Thread(target=self._talk, args=(lines.encode(),), daemon=True)
        self._thread.start()

    def _talk(self, data: bytes) -> None:
        try:
            self._out = self._proc.communicate(data, timeout=self._timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._out = self._proc.communicate()

    def views(self) -> list[dict[str, View]]:
        self._thread.join()
        out, err = self._out
        rows = out.decode().split("\n")[:-1]  # not splitlines(): a field name may hold U+2028 or \x85
        if self._proc.returncode != 0 or len(rows) != self._count:
            raise RuntimeError(f"the Node parsers failed (exit {self._proc.returncode}): {err.decode()[-2000:]}")
        return [
            {name: View(tuple((n, f, bool(native)) for n, f, native in seen["parts"]), seen["error"])
             for name, seen in json.loads(row).items()}
            for row in rows
        ]
