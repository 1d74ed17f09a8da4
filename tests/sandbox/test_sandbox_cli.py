"""``python -m sandbox``: readiness line, options, clean shutdown on signals."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import pytest

from sandbox.__main__ import parse_args, settings_from_args
from sandbox.settings import SandboxSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_cli_serves_and_exits_cleanly(signum: signal.Signals) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", "0", "--token", "cli-token",
        "--log-level", "warning", "--gzip",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both piped
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


def test_parse_args_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_NOW", raising=False)
    args = parse_args([])
    assert (args.host, args.port, args.tokens, args.log_level, args.gzip) == ("127.0.0.1", 8081, None, "info", False)
    settings = settings_from_args(args)
    assert (settings.cards_cap_from, settings.cards_removal_from, settings.now, settings.extra_boards) == (
        None, None, None, ())
    assert settings == SandboxSettings(signing_secret=settings.signing_secret)


def test_schedule_clock_and_extra_board_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_NOW", raising=False)
    settings = settings_from_args(parse_args([
        "--cards-cap-from", "2026-10-01",
        "--cards-removal-from", "2026-11-01T12:30:00+02:00",
        "--now", "2026-10-15T08:00:00.250Z",
        "--extra-board", "101", "--extra-board", "0", "--extra-board", "10000",
    ]))
    assert settings.cards_cap_from == datetime(2026, 10, 1, tzinfo=UTC)
    assert settings.cards_removal_from == datetime(2026, 11, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert settings.cards_removal_from == datetime(2026, 11, 1, 10, 30, tzinfo=UTC)
    assert settings.now == datetime(2026, 10, 15, 8, 0, 0, 250000, tzinfo=UTC)
    assert settings.current_time() == settings.now
    assert settings.extra_boards == (101, 0, 10000)


def test_now_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_NOW", "2026-11-02")
    assert parse_args([]).now == datetime(2026, 11, 2, tzinfo=UTC)
    assert parse_args(["--now", "2026-09-01T00:00:00Z"]).now == datetime(2026, 9, 1, tzinfo=UTC)  # flag wins
    monkeypatch.setenv("SANDBOX_NOW", "")
    assert parse_args([]).now is None


@pytest.mark.parametrize(
    ("argv", "env", "complaint"),
    [
        (["--cards-cap-from", "tomorrow"], None, "--cards-cap-from"),
        (["--cards-cap-from", "2026-13-01"], None, "--cards-cap-from"),
        (["--cards-removal-from", "2026-11-01T00:00:00"], None, "no timezone"),
        (["--now", "2026-11-01 noon"], None, "--now"),
        ([], "2026-11-01T00:00", "--now"),
        (["--extra-board", "-1"], None, "--extra-board"),
        (["--extra-board", "ten"], None, "--extra-board"),
    ],
)
def test_bad_values_exit_with_usage_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          argv: list[str], env: str | None, complaint: str) -> None:
    if env is None:
        monkeypatch.delenv("SANDBOX_NOW", raising=False)
    else:
        monkeypatch.setenv("SANDBOX_NOW", env)
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert complaint in capsys.readouterr().err


async def test_cli_schedule_and_extra_boards_end_to_end() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", "0", "--log-level", "warning",
        "--cards-cap-from", "2026-10-01", "--cards-removal-from", "2026-11-01", "--extra-board", "150",
        "--extra-board", "0",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "SANDBOX_NOW": "2026-10-31T23:59:59Z"},
    )
    assert proc.stdout is not None and proc.stderr is not None  # both piped
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=10)).decode()
        match = re.fullmatch(r"sandbox listening on http://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        base = f"http://127.0.0.1:{match.group(1)}"
        auth = {"Authorization": "Bearer sandbox-token"}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/api/latest/boards/4", headers=auth) as resp:
                board = await resp.json()
            assert [c["id"] for c in board["cards"]] == list(range(251, 351))
            assert "board_id=4" in board["cards_deprecation_message"]
            async with session.get(f"{base}/api/latest/cards?board_id=4&limit=100&offset=100", headers=auth) as resp:
                assert [c["id"] for c in await resp.json()] == list(range(351, 401))
            async with session.get(f"{base}/api/v1/spaces/1/boards/5", headers=auth) as resp:
                assert (await resp.json())["cards"] == []
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
