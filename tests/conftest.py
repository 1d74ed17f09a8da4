"""Shared fixtures: a recording upstream, an in-process gateway in front of it, its admin app, the ledger's databases.
Everything goes through real sockets on 127.0.0.1. The helpers the tests import are in tests/gateway_testlib.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.ops.admin import make_admin_app
from gateway.rollout import Clock
from tests.gateway_testlib import (
    AdminFactory,
    CountingServer,
    CountingUpstream,
    GatewayFactory,
    RecordingUpstream,
    RunningGateway,
    admin_url,
    make_config,
    serve_gateway,
)


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


_REPOSITORY = Path(__file__).resolve().parent.parent
_DEFAULT_LEDGER = [_REPOSITORY / f"gateway-usage.sqlite3{suffix}" for suffix in ("", "-wal", "-shm", "-journal")]


@pytest.fixture(autouse=True)
def nothing_written_to_the_repository_s_ledger() -> Iterator[None]:
    """A gateway left at the usage ledger's default writes ./gateway-usage.sqlite3: from a test whose working directory
    is the repository, one file every such test shares (and a developer's own). Each test gives its gateway a ledger of
    its own (in memory, or beside its config: tests/process_testlib.write_config)."""

    def state() -> dict[Path, int | None]:
        return {path: path.stat().st_mtime_ns if path.exists() else None for path in _DEFAULT_LEDGER}

    before = state()
    yield
    changed = [path.name for path, mtime in state().items() if mtime is not None and mtime != before[path]]
    assert not changed, f"a test wrote the repository's default usage ledger: {changed}"


@pytest.fixture
async def upstream(aiohttp_raw_server: Any) -> RecordingUpstream:
    recorder = RecordingUpstream()
    server = await aiohttp_raw_server(recorder.handle, auto_decompress=False)
    recorder.port = server.port
    recorder.url = f"http://127.0.0.1:{server.port}"
    return recorder


@pytest.fixture
async def start_gateway() -> AsyncIterator[GatewayFactory]:
    """``await start_gateway(config_dict, clock=None)``: a gateway listening on a free port of 127.0.0.1."""
    running: list[RunningGateway] = []

    async def start(config: dict[str, Any], clock: Clock | None = None, access_log: Any = None) -> RunningGateway:
        item = await serve_gateway(config, clock, access_log)
        running.append(item)
        return item

    yield start
    for item in running:
        await item.stop()


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


@pytest.fixture
async def counting_upstream() -> AsyncIterator[CountingUpstream]:
    recorder = CountingUpstream()
    server = CountingServer(recorder.handle, auto_decompress=False)
    recorder.server = server
    runner = web.ServerRunner(server, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    recorder.port = runner.addresses[0][1]
    recorder.url = f"http://127.0.0.1:{recorder.port}"
    yield recorder
    await runner.cleanup()


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
