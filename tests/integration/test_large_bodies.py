"""Bodies over 100 MiB, both ways, through a real gateway process: byte-exact and in bounded memory."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.gateway_testlib import Received, RecordingUpstream, free_port

ROOT = Path(__file__).resolve().parents[2]
SIZE = 150 * 1024 * 1024 + 7
CHUNK = 1024 * 1024


def _vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _pattern(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (CHUNK // 32)


async def _body(size: int) -> AsyncIterator[bytes]:
    sent = 0
    i = 0
    while sent < size:
        chunk = _pattern(i)[: size - sent]
        sent += len(chunk)
        i += 1
        yield chunk


def _digest(size: int) -> str:
    h = hashlib.sha256()
    sent = 0
    i = 0
    while sent < size:
        chunk = _pattern(i)[: size - sent]
        h.update(chunk)
        sent += len(chunk)
        i += 1
    return h.hexdigest()


@pytest.mark.slow
async def test_150_mib_up_and_down_through_a_gateway_process(upstream: RecordingUpstream, tmp_path: Path) -> None:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        if request.method != "GET":
            return web.json_response({"size": received.body_size, "sha256": received.body_sha256})
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = SIZE
        await resp.prepare(request)
        async for chunk in _body(SIZE):
            await resp.write(chunk)
        return resp

    upstream.responder = responder
    port, admin = free_port(), free_port()
    config = {"server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{admin}"},
              "access_log": {"enabled": False},
              "tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": upstream.url}]}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
        assert b"listening" in line, line
        baseline = _vm_hwm_mib(proc.pid)
        expected = _digest(SIZE)
        async with aiohttp.ClientSession(auto_decompress=False) as client:
            async with client.put(f"http://127.0.0.1:{port}/up", data=_body(SIZE),
                                  headers={"Content-Length": str(SIZE)}) as resp:
                assert resp.status == 200
                assert await resp.json() == {"size": SIZE, "sha256": expected}
            async with client.get(f"http://127.0.0.1:{port}/down") as resp:
                assert resp.headers["Content-Length"] == str(SIZE)
                h = hashlib.sha256()
                async for chunk in resp.content.iter_chunked(CHUNK):
                    h.update(chunk)
            assert h.hexdigest() == expected
        peak = _vm_hwm_mib(proc.pid)
        print(f"gateway VmHWM baseline {baseline:.1f} MiB, after 2x150 MiB {peak:.1f} MiB")
        # 300 MiB went through; the gateway's peak memory grew by far less than one body.
        assert peak - baseline < 40, (baseline, peak)
        assert peak < 100, peak
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
