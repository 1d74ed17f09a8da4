"""Shared fixtures: a recording upstream, an in-process gateway in front of it, and raw-socket helpers.

Everything goes through real sockets on 127.0.0.1: the gateway's public listener is a real aiohttp server and the
upstream is a real aiohttp server that records what reached it.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway.ops.admin import make_admin_app
from gateway.app import Gateway
from gateway.app import parse_config
from gateway.ops.metrics import Metrics
from gateway.rollout import Clock

@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_the_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The whole run uses a temporary directory of its own (TMPDIR, for this process and every process it starts:
    gateways, their workers, browsers), and must leave it empty: a supervisor's metrics and worker directories, a
    spool file, a test's own temporary files. (pytest's tmp_path directories stay where pytest keeps them.)"""
    tmp_path_factory.getbasetemp()
    private = tempfile.mkdtemp(prefix="gateway-tests-")
    os.chmod(private, 0o711)  # others may pass through, not list: PostgreSQL runs as its own user in a directory below
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = private
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        left = sorted(os.listdir(private))
        shutil.rmtree(private, ignore_errors=True)
    assert not left, f"the tests left these in the temporary directory: {left}"


# The admin token of the tests' gateways. Admin URLs handed to tests carry it as HTTP Basic credentials
# (``admin_url``), which aiohttp's client sends by itself.
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"


def admin_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://admin:{ADMIN_TOKEN}@{host}:{port}"


ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

BASE_CONFIG: dict[str, Any] = {
    "server": {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "admin_token": ADMIN_TOKEN},
    "upstream": {"connect_timeout": 2, "read_timeout": 5},
    "access_log": {"enabled": False},
    # The usage ledger in memory (a real SQLite database, gone with the gateway): a test that needs a file or
    # PostgreSQL says so.
    "usage": {"ledger": {"url": "sqlite://"}},
    "tenants": [
        {"name": "acme", "hosts": ["127.0.0.1", "localhost", "acme.test"], "upstream": "http://127.0.0.1:1",
         "created": "2026-06-01"},
        {"name": "oldco", "hosts": ["old.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01"},
    ],
    "routes": [
        {"name": "board", "methods": ["GET", "HEAD"], "paths": ["/boards/{board_id}", "/spaces/{space_id}/boards/{board_id}"]},
        {"name": "legacy_card_file_upload", "methods": ["PUT"], "paths": ["/cards/{card_id}/files"]},
        {"name": "legacy_comment_create", "methods": ["POST"], "paths": ["/cards/{card_id}/comments"]},
        {"name": "legacy_comment_update", "methods": ["PATCH"], "paths": ["/cards/{card_id}/comments/{comment_id}"]},
        {"name": "card_file_upload", "methods": ["POST"], "paths": ["/cards/{card_uid}/files"]},
    ],
}


class LineCollector:
    """An access-log sink for tests: keeps the lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)


@dataclass
class Received:
    """One request as the upstream saw it."""

    method: str
    raw_path: str
    version: tuple[int, int]
    raw_headers: list[tuple[bytes, bytes]]
    body_size: int
    body_sha256: str
    body_complete: bool
    body: bytes  # kept only up to 1 MiB

    def header(self, name: str) -> str | None:
        values = self.headers_all(name)
        return values[0] if values else None

    def headers_all(self, name: str) -> list[str]:
        lname = name.lower().encode()
        return [v.decode("latin-1") for k, v in self.raw_headers if k.lower() == lname]


Responder = Callable[[web.BaseRequest, "Received"], Awaitable[web.StreamResponse]]


async def _default_responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
    return web.json_response({"method": received.method, "path": received.raw_path, "size": received.body_size,
                              "sha256": received.body_sha256})


@dataclass
class RecordingUpstream:
    url: str = ""
    port: int = 0
    received: list[Received] = field(default_factory=list)
    responder: Responder = _default_responder
    started: asyncio.Event = field(default_factory=asyncio.Event)
    # Set by the upstream when it has begun reading a request's body.
    body_started: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.started.set()
        digest = hashlib.sha256()
        size = 0
        kept = bytearray()
        complete = True
        try:
            while chunk := await request.content.readany():
                self.body_started.set()
                digest.update(chunk)
                size += len(chunk)
                if len(kept) < 1 << 20:
                    kept += chunk[: (1 << 20) - len(kept)]
        except BaseException:
            # A broken or abandoned body (the handler may even be cancelled): record it, then let it end.
            complete = False
            raise
        finally:
            self.received.append(
                Received(request.method, request.raw_path, tuple(request.version),  # type: ignore[arg-type]
                         list(request.raw_headers), size, digest.hexdigest(), complete, bytes(kept))
            )
        received = self.received[-1]
        return await self.responder(request, received)


@pytest.fixture
async def upstream(aiohttp_raw_server: Any) -> RecordingUpstream:
    recorder = RecordingUpstream()
    server = await aiohttp_raw_server(recorder.handle, auto_decompress=False)
    recorder.port = server.port
    recorder.url = f"http://127.0.0.1:{server.port}"
    return recorder


@dataclass
class RunningGateway:
    gateway: Gateway
    url: str
    port: int
    runner: web.ServerRunner

    @property
    def metrics(self) -> Metrics:
        return self.gateway.metrics


def make_config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """BASE_CONFIG with every tenant pointed at ``upstream_url``; top-level keys replaced by ``overrides``."""
    data = copy.deepcopy(BASE_CONFIG)
    for tenant in data["tenants"]:
        tenant["upstream"] = upstream_url
    data.update(copy.deepcopy(overrides))
    return data


GatewayFactory = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def start_gateway() -> AsyncIterator[GatewayFactory]:
    """``await start_gateway(config_dict, clock=None)``: a gateway listening on a free port of 127.0.0.1."""
    running: list[RunningGateway] = []

    async def start(config: dict[str, Any], clock: Clock | None = None, access_log: Any = None) -> RunningGateway:
        gateway = Gateway(parse_config(config, "test"), clock=clock, access_log=access_log)
        await gateway.start()
        runner = web.ServerRunner(gateway.make_server(), shutdown_timeout=2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        item = RunningGateway(gateway, f"http://127.0.0.1:{port}", port, runner)
        running.append(item)
        return item

    yield start
    for item in running:
        await item.runner.cleanup()
        await item.gateway.close()


AdminFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def start_admin() -> AsyncIterator[AdminFactory]:
    """``await start_admin(gw, **runner_options)``: a started gateway's admin app on a free port; its base URL, with
    the admin token as Basic credentials (``admin_url``).

    Request it after ``start_gateway``, so that it is stopped first."""
    runners: list[web.AppRunner] = []

    async def start(gw: RunningGateway, **runner_options: Any) -> str:
        runner = web.AppRunner(make_admin_app(gw.gateway), **runner_options)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return admin_url(runner.addresses[0][1])

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def gw(upstream: RecordingUpstream, start_gateway: GatewayFactory) -> RunningGateway:
    """The default test gateway in front of the recording upstream."""
    return await start_gateway(make_config(upstream.url))


async def read_answer(reader: asyncio.StreamReader, timeout: float, *, read_until_close: bool = True) -> bytes:
    """Everything the server answers until it closes (or ``timeout`` passes, or, unless ``read_until_close``, a head
    has arrived)."""
    chunks: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (remaining := deadline - loop.time()) > 0:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), remaining)
        except (asyncio.TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        chunks.append(chunk)
        if not read_until_close and b"\r\n\r\n" in b"".join(chunks):
            break
    return b"".join(chunks)


async def raw_exchange(port: int, data: bytes, *, timeout: float = 5.0, read_until_close: bool = True) -> bytes:
    """Send raw bytes to 127.0.0.1:port and return everything the server answers until it closes (or times out)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_answer(reader, timeout, read_until_close=read_until_close)
    finally:
        writer.close()


def parse_responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a raw byte stream into (status, headers, body) responses (Content-Length or chunked bodies)."""
    out = []
    rest = data
    while rest:
        head, sep, rest = rest.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status < 200:
            continue
        if "content-length" in headers:
            n = int(headers["content-length"])
            body, rest = rest[:n], rest[n:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                body += rest[:size]
                rest = rest[size + 2 :]
                if size == 0:
                    rest = rest.partition(b"\r\n")[2] if rest.startswith(b"\r\n") else rest
                    break
        else:
            body, rest = rest, b""
        out.append((status, headers, body))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- Helpers for the legacy upload guard's tests (unit, integration and the adversarial corpus) ---------------------

GUARD_OPTIONS: dict[str, dict[str, Any]] = {
    "legacy_card_file_upload": {"detect": "route", "successor": "/api/v1/cards/{card_id}/files"},
    "legacy_comment_create": {
        "detect": "file_parts", "successor": "/api/v1/cards/{card_id}/comments/{comment_uid}/files",
    },
    "legacy_comment_update": {
        "detect": "file_parts", "successor": "/api/v1/cards/{card_id}/comments/{comment_id}/files",
    },
}


def guarded_routes(**options: Any) -> list[dict[str, Any]]:
    """BASE_CONFIG's routes with ``legacy_upload_guard`` on the deprecated ones, plus the restricted file routes."""
    routes: list[dict[str, Any]] = copy.deepcopy(BASE_CONFIG["routes"])
    for route in routes:
        if route["name"] in GUARD_OPTIONS:
            route["chain"] = [{"legacy_upload_guard": {**GUARD_OPTIONS[route["name"]], **options}}]
    routes += [
        {"name": "card_file", "methods": ["GET", "HEAD", "PATCH", "DELETE"], "paths": ["/cards/{card_uid}/files/{file_id}"]},
        {"name": "comment_file_upload", "methods": ["POST"], "paths": ["/cards/{card_uid}/comments/{comment_uid}/files"]},
        {"name": "property_file_upload", "methods": ["POST"],
         "paths": ["/cards/{card_uid}/custom-properties/{property_uid}/files"]},
    ]
    return routes


def bridged_routes() -> list[dict[str, Any]]:
    """``guarded_routes`` with a card route and ``board_cards`` on the board route: the bridges' roads (the upload
    upgrade's lookup and upload, the card backfill's board and pages) beside the plain one."""
    routes = guarded_routes()
    routes += [{"name": "card", "methods": ["GET"], "paths": ["/cards/{card_id}"]}]
    for route in routes:
        if route["name"] == "board":
            route["chain"] = [{"board_cards": {}}]
    return routes


def multipart_body(parts: list[tuple[list[str], bytes]], boundary: str, *, close: bytes = b"--\r\n") -> bytes:
    """A multipart body from (header lines, content) pairs, written exactly as given (CRLF line ends)."""
    out = bytearray()
    for headers, content in parts:
        out += f"--{boundary}\r\n".encode()
        for line in headers:
            out += line.encode("utf-8") + b"\r\n"
        out += b"\r\n" + content + b"\r\n"
    out += f"--{boundary}".encode() + close
    return bytes(out)


class _CountingServer(web.Server):
    """An aiohttp low-level server that counts the TCP connections it accepted."""

    accepted = 0

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        self.accepted += 1
        super().connection_made(handler, transport)


@dataclass
class CountingUpstream(RecordingUpstream):
    """A RecordingUpstream that also counts connections: a refused request must not even open one."""

    server: _CountingServer | None = None

    @property
    def connections(self) -> int:
        return self.server.accepted if self.server is not None else 0


@pytest.fixture
async def counting_upstream() -> AsyncIterator[CountingUpstream]:
    recorder = CountingUpstream()
    server = _CountingServer(recorder.handle, auto_decompress=False)
    recorder.server = server
    runner = web.ServerRunner(server, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    recorder.port = runner.addresses[0][1]
    recorder.url = f"http://127.0.0.1:{recorder.port}"
    yield recorder
    await runner.cleanup()


def chunked_responder(body: bytes, piece: int, headers: dict[str, str] | None = None) -> Responder:
    """An upstream answer that streams ``body`` chunked (no Content-Length), ``piece`` bytes per write."""

    async def respond(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(body), piece):
            await resp.write(body[i : i + piece])
        await resp.write_eof()
        return resp

    return respond


# --- The usage ledger's databases ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres() -> Any:
    """One PostgreSQL server for the session (tests/postgres_testlib.py); skipped, saying why, where it cannot run."""
    from tests import postgres_testlib

    try:
        server = postgres_testlib.start_postgres()
    except RuntimeError as err:
        pytest.skip(str(err))
    yield server
    postgres_testlib.remove(server)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A fresh, empty ledger database: a SQLite file, or a database of its own on the session's PostgreSQL server
    (``postgres_url``)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/usage.sqlite3"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def postgres_url(postgres: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new database on the session's PostgreSQL server; its URL has the password as ``${LEDGER_PASSWORD}`` (set in
    the environment, which gateway processes inherit), as an operator's config has it."""
    from tests import postgres_testlib

    if not postgres.running():
        postgres.start()  # a test that stopped it failed before starting it again
    monkeypatch.setenv("LEDGER_PASSWORD", postgres_testlib.PASSWORD)
    return str(postgres.url(postgres.create_database()))
