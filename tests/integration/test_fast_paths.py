"""aiohttp's fast paths and their fallbacks through real sockets: the upstream sees the same bytes, and the client gets
the same answers, whichever of core/aiohttp_fast.py's paths are on; ``gateway serve`` says which at start and
refuses a GATEWAY_AIOHTTP_FAST_PATHS it does not understand. (CI runs the road tests once with every path off.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict
from yarl import URL

from gateway.config.upstream import UpstreamConfig
from gateway.core import aiohttp_fast
from gateway.core.aiohttp_fast import ENV, PATHS, decide
from gateway.proxy.upstream import UpstreamClient
from gateway.server.listener import _Connection
from tests.gateway_testlib import RecordingUpstream, RunningGateway, make_config, raw_exchange
from tests.process_testlib import ROOT, start

# Each road: every path on; the bodyless road off (bodyless requests take ClientRequest's); every path off.
VARIANTS = {"on": "on", "bodyless_off": ",".join(name for name in PATHS if name != "upstream_bodyless"), "off": "off"}


class _RawUpstream:
    """Records each request's head and body as the bytes that arrived; answers 200 with a small body."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, bytes]] = []
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                body = b""
                if b"transfer-encoding: chunked" in lines:
                    while size := int((line := await reader.readline()).strip(), 16):
                        body += line + await reader.readexactly(size + 2)
                    body += line + await reader.readline()
                for line in lines:
                    if line.startswith(b"content-length:"):
                        body = await reader.readexactly(int(line.partition(b":")[2]))
                self.seen.append((head, body))
                answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Up: 1\r\nx-up: 2\r\n\r\n"
                writer.write(answer if head.startswith(b"HEAD ") else answer + b"hello")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[_RawUpstream]:
    upstream = _RawUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    yield upstream
    server.close()
    await server.wait_closed()


async def _chunks() -> AsyncIterator[bytes]:
    yield b"abc"
    yield b"defgh"


async def _one_chunk() -> AsyncIterator[bytes]:
    yield b"12345"


async def _send_all(client: UpstreamClient, port: int) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    """A request of each kind the proxy core sends, through ``client``: what each was answered."""
    base = f"http://127.0.0.1:{port}"
    signed = f"http://user:secret@127.0.0.1:{port}"

    def headers(*extra: tuple[str, str]) -> CIMultiDict[str]:
        return CIMultiDict([("Host", f"127.0.0.1:{port}"), ("X-Many", "1"), ("x-many", "2"), ("Via", "1.1 x"), *extra])

    requests = [
        ("GET", base, "/a/b%2Fc?q=1&r", headers(("Accept", "*/*")), None),
        ("HEAD", base, "/h", headers(), None),
        ("POST", base, "/empty", headers(), None),
        ("DELETE", base, "/d", headers(("authorization", "Bearer a"), ("Authorization", "Bearer b")), None),
        ("PUT", base, "/chunked", headers(), _chunks()),
        ("PUT", base, "/length", headers(("Content-Length", "5")), _one_chunk()),
        ("GET", signed, "/signed", headers(("Authorization", "Bearer client")), None),
        ("PATCH", signed, "/signed", headers(), _chunks()),
    ]
    answers = []
    for method, origin, target, sent, body in requests:
        response = await client.request_to(method, origin, target, sent, body)
        content = await response.content.read()
        answers.append((response.status, list(response.headers.items()), content))
        response.release()
    return answers


async def test_every_road_sends_the_same_bytes_and_reads_the_same_answers(
    raw: _RawUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, answered = {}, {}
    for variant, setting in VARIANTS.items():
        monkeypatch.setattr(aiohttp_fast, "FAST", decide({ENV: setting}, {}))
        raw.seen.clear()
        client = UpstreamClient.open(UpstreamConfig(connect_timeout=2, read_timeout=2), max_field_size=8190)
        try:
            answered[variant] = await _send_all(client, raw.port)
        finally:
            await client.close()
        seen[variant] = list(raw.seen)
    assert seen["bodyless_off"] == seen["on"] and seen["off"] == seen["on"]
    assert answered["bodyless_off"] == answered["on"] and answered["off"] == answered["on"]
    heads = [head for head, _ in seen["on"]]
    assert heads[0].endswith(b"X-Many: 1\r\nx-many: 2\r\nVia: 1.1 x\r\nAccept: */*\r\n\r\n")  # nothing folded, added
    assert b"Content-Length: 0\r\n" in heads[2]
    assert heads[6].count(b"Authorization") == 1 and b"Authorization: Basic dXNlcjpzZWNyZXQ=" in heads[6]
    assert seen["on"][4][1] == b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"
    assert answered["on"][0] == (200, [("Content-Length", "5"), ("X-Up", "1"), ("x-up", "2")], b"hello")


@pytest.mark.parametrize("path", ["upstream_request", "upstream_bodyless"])
async def test_with_a_road_off_its_fallback_carries_the_request(
    path: str, raw: _RawUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream_request off: ClientSession.request carries every request; upstream_bodyless off: a request without
    a body goes through aiohttp's ClientRequest like one with a body."""
    calls: list[str] = []
    session_request, request_send = aiohttp.ClientSession.request, aiohttp.ClientRequest.send

    def counted_request(self: aiohttp.ClientSession, method: str, url: URL, **kwargs: object) -> object:
        calls.append(f"session {method}")
        return session_request(self, method, url, **kwargs)  # type: ignore[arg-type]

    async def counted_send(self: aiohttp.ClientRequest, conn: object) -> aiohttp.ClientResponse:
        calls.append(f"send {self.method}")
        return await request_send(self, conn)  # type: ignore[arg-type]

    monkeypatch.setattr(aiohttp.ClientSession, "request", counted_request)
    monkeypatch.setattr(aiohttp.ClientRequest, "send", counted_send)
    monkeypatch.setattr(aiohttp_fast, "FAST", decide({ENV: ",".join(name for name in PATHS if name != path)}, {}))
    client = UpstreamClient.open(UpstreamConfig(), max_field_size=8190)
    try:
        headers = CIMultiDict([("Host", f"127.0.0.1:{raw.port}")])
        for method, body in (("GET", None), ("PUT", _one_chunk())):
            (await client.request_to(method, f"http://127.0.0.1:{raw.port}", "/x", headers, body)).release()
    finally:
        await client.close()
    if path == "upstream_request":
        assert calls == ["session GET", "send GET", "session PUT", "send PUT"]
    else:
        assert calls == ["send GET", "send PUT"]
    assert len(raw.seen) == 2


async def test_with_reply_one_write_off_the_same_answer_leaves_in_two_writes(
    gw: RunningGateway, upstream: RecordingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    write, writelines = StreamWriter._write, StreamWriter._writelines

    def counting_write(self: StreamWriter, chunk: bytes) -> None:
        if isinstance(self._protocol, _Connection):
            writes.append(len(chunk))
        write(self, chunk)

    def counting_writelines(self: StreamWriter, chunks: list[bytes]) -> None:
        if isinstance(self._protocol, _Connection):
            writes.append(sum(len(c) for c in chunks))
        writelines(self, chunks)

    monkeypatch.setattr(StreamWriter, "_write", counting_write)
    monkeypatch.setattr(StreamWriter, "_writelines", counting_writelines)
    request = b"GET /small HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: rid-1\r\nConnection: close\r\n\r\n"
    answers = {}
    for setting in ("on", ",".join(name for name in PATHS if name != "reply_one_write")):
        monkeypatch.setattr(aiohttp_fast, "FAST", decide({ENV: setting}, {}))
        writes.clear()
        data = await raw_exchange(gw.port, request)
        head, _, body = data.partition(b"\r\n\r\n")
        answers[setting] = ([line for line in head.split(b"\r\n") if not line.startswith(b"Date:")], body)
        expected = [len(data)] if setting == "on" else [len(head) + 4, len(body)]
        assert writes == expected, setting
    (on, off), = [tuple(answers.values())]
    assert on == off and on[0][0] == b"HTTP/1.1 200 OK"


async def test_serve_logs_which_fast_paths_are_on(upstream: RecordingUpstream, tmp_path: Path) -> None:
    env = {**os.environ, ENV: "reply_headers,reply_one_write"}
    gw = await start(make_config(upstream.url), tmp_path, env=env)
    try:
        async with aiohttp.ClientSession() as client, client.get(gw.url + "/anything") as response:
            assert response.status == 200
    finally:
        gw.stop()
    forced = f"forced off by {ENV}"
    assert (f"fast paths on: reply_headers, reply_one_write; off: upstream_request ({forced}), upstream_bodyless "
            f"({forced}), upstream_protocol ({forced})") in gw.log.read_text()


def test_serve_refuses_a_fast_path_it_does_not_know(tmp_path: Path) -> None:
    env = {**os.environ, ENV: "off,reply_headers"}
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(ROOT / "config/gateway.yaml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"gateway: {ENV}='off,reply_headers': unknown fast path off (on, off, or "
                                        "names from upstream_request, upstream_bodyless, upstream_protocol, "
                                        "upstream_body_into, reply_headers, reply_one_write)")
