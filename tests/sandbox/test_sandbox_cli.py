"""``python -m sandbox``: readiness line, options, clean shutdown on signals."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from sandbox.__main__ import parse_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_cli_serves_and_exits_cleanly(signum):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", "0", "--token", "cli-token",
        "--log-level", "warning", "--gzip",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=10)).decode()
        match = re.fullmatch(r"sandbox listening on http://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        base = f"http://127.0.0.1:{match.group(1)}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/api/latest/boards/2", headers={"Authorization": "Bearer cli-token"},
                                   auto_decompress=False) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Encoding"] == "gzip"
            async with session.get(f"{base}/api/latest/boards/2",
                                   headers={"Authorization": "Bearer sandbox-token"}) as resp:
                assert resp.status == 401
        proc.send_signal(signum)
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
        assert b"Traceback" not in await proc.stderr.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_parse_args_defaults():
    args = parse_args([])
    assert (args.host, args.port, args.tokens, args.log_level, args.gzip) == ("127.0.0.1", 8081, None, "info", False)
