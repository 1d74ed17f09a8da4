"""What the tests share: the tests' base config, a recording upstream (and one that counts connections), the
handle of a started gateway, and helpers that speak raw HTTP/1.1 over a socket of 127.0.0.1. The fixtures that start
these are in conftest.py."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.app import Gateway, parse_config
from gateway.ops.metrics import Metrics
from gateway.rollout import Clock

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


@dataclass
class RunningGateway:
    gateway: Gateway
    url: str
    port: int
    runner: web.ServerRunner

    @property
    def metrics(self) -> Metrics:
        return self.gateway.metrics

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.gateway.close()


async def serve_gateway(config: dict[str, Any], clock: Clock | None = None, access_log: Any = None) -> RunningGateway:
    """A gateway on the running event loop, listening on a free port of 127.0.0.1 (``stop`` it after)."""
    gateway = Gateway(parse_config(config, "test"), clock=clock, access_log=access_log)
    await gateway.start()
    runner = web.ServerRunner(gateway.make_server(), shutdown_timeout=2)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return RunningGateway(gateway, f"http://127.0.0.1:{port}", port, runner)


def make_config(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """BASE_CONFIG with every tenant pointed at ``upstream_url``; top-level keys replaced by ``overrides``."""
    data = copy.deepcopy(BASE_CONFIG)
    for tenant in data["tenants"]:
        tenant["upstream"] = upstream_url
    data.update(copy.deepcopy(overrides))
    return data


GatewayFactory = Callable[..., Awaitable[RunningGateway]]
AdminFactory = Callable[..., Awaitable[str]]


async def read_answer(reader: asyncio.StreamReader, timeout: float, *, read_until_close: bool = True) -> bytes:
    """Everything the server answers until it closes (or ``timeout`` passes, or, unless ``read_until_close``, a head
    has arrived)."""
    chunks: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (remaining := deadline - loop.time()) > 0:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), remaining)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        chunks.append(chunk)
        if not read_until_close and b"\r\n\r\n" in b"".join(chunks):
            break
    return b"".join(chunks)


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes the connection within ``timeout`` (what it sends before is read and dropped)."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


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


# The restricted upload routes' paths with an earlier id where a uid belongs (config/gateway.yaml): legacy uploads.
LEGACY_ID_ROUTES: list[dict[str, Any]] = [
    {"name": "legacy_id_card_file_upload", "methods": ["POST"], "paths": ["/cards/{card_id:not_uuid}/files"],
     "guard": {"detect": "file_parts", "successor": "/api/v1/cards/{card_uid}/files", "upgrade": {"flow": "card_file"}}},
    {"name": "legacy_id_comment_file_upload", "methods": ["POST"],
     "paths": ["/cards/{card_id:not_uuid}/comments/{comment_uid:uuid}/files",
               "/cards/{card_id:not_uuid}/comments/{comment_id}/files",
               "/cards/{card_uid}/comments/{comment_id:not_uuid}/files"],
     "guard": {"detect": "file_parts", "successor": "/api/v1/cards/{card_uid}/comments/{comment_uid}/files",
               "upgrade": {"flow": "comment_file"}}},
    {"name": "legacy_id_property_file_upload", "methods": ["POST"],
     "paths": ["/cards/{card_id:not_uuid}/custom-properties/{property_uid:uuid}/files",
               "/cards/{card_id:not_uuid}/custom-properties/{property_id}/files",
               "/cards/{card_uid}/custom-properties/{property_id:not_uuid}/files"],
     "guard": {"detect": "file_parts", "successor": "/api/v1/cards/{card_uid}/custom-properties/{property_uid}/files",
               "upgrade": {"flow": "none"}}},
]


def legacy_id_routes(**options: Any) -> list[dict[str, Any]]:
    """``LEGACY_ID_ROUTES`` as route entries, their guards' options with ``options`` on top (an ``upgrade`` merged)."""
    out = []
    for entry in LEGACY_ID_ROUTES:
        guard = {**entry["guard"], **options}
        guard["upgrade"] = {**entry["guard"]["upgrade"], **options.get("upgrade", {})}
        out.append({"name": entry["name"], "methods": entry["methods"], "paths": entry["paths"],
                    "chain": [{"legacy_upload_guard": guard}]})
    return out


def guarded_routes(**options: Any) -> list[dict[str, Any]]:
    """BASE_CONFIG's routes with ``legacy_upload_guard`` on the deprecated ones and on the restricted upload routes'
    paths with an earlier id (``legacy_id_routes``, before the restricted ones), plus the restricted file routes."""
    routes: list[dict[str, Any]] = copy.deepcopy(BASE_CONFIG["routes"])
    for route in routes:
        if route["name"] in GUARD_OPTIONS:
            route["chain"] = [{"legacy_upload_guard": {**GUARD_OPTIONS[route["name"]], **options}}]
    at = next(i for i, route in enumerate(routes) if route["name"] == "card_file_upload")
    routes[at:at] = legacy_id_routes(**options)
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


class CountingServer(web.Server):
    """An aiohttp low-level server that counts the TCP connections it accepted."""

    accepted = 0

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        self.accepted += 1
        super().connection_made(handler, transport)


@dataclass
class CountingUpstream(RecordingUpstream):
    """A RecordingUpstream that also counts connections: a refused request must not even open one."""

    server: CountingServer | None = None

    @property
    def connections(self) -> int:
        return self.server.accepted if self.server is not None else 0


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


async def send_raw(port: int, data: bytes, *, wait_for_continue: bool = False, timeout: float = 5.0) -> bytes:
    """Send ``data`` and return everything answered until the gateway closes the connection.

    With ``wait_for_continue`` only the head is sent first; the body follows once ``100 Continue`` arrives (or is
    never sent if a final answer comes instead).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()
    try:
        if wait_for_continue:
            head, sep, body = data.partition(b"\r\n\r\n")
            writer.write(head + sep)
            await writer.drain()
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            received += first
            if first.startswith(b"HTTP/1.1 100 "):
                writer.write(body)
                await writer.drain()
        else:
            writer.write(data)
            await writer.drain()
        received += await read_answer(reader, timeout)
    finally:
        writer.close()
    return bytes(received)


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0) -> None:
    """Wait until ``check`` (a function, or a coroutine function) holds; fail if it does not within ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
