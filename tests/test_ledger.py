"""The usage ledger's background writer, in one process with a real database: what it does when the database cannot
be opened, answers too slowly, comes back, and when the gateway stops; reads that see this process's own writes.

Through real gateway processes (signals, two processes on one database, PostgreSQL stopped under load, the command
line): tests/integration/test_usage_ledger.py."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import Secrets
from gateway.config.ledger import LedgerConfig
from gateway.ops.ledger import Ledger, LedgerFamilies, LedgerUnavailable, Query, window
from gateway.ops.ledger.store import Store
from gateway.ops.usage import UsageCounter
from tests.gateway_testlib import free_port

GUARD = {"legacy_upload_guard": "legacy_uploads"}


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _ledger(url: str, registry: CollectorRegistry, **options: Any) -> tuple[Ledger, UsageCounter]:
    counter = UsageCounter(behaviours=GUARD)
    config = LedgerConfig(url=url, **{"flush_interval": 0.05, "flush_timeout": 2.0, **options})
    secrets = Secrets({"hunter2-secret": "${LEDGER_PASSWORD}"})
    return Ledger(config, counter, redact=secrets.redact, families=LedgerFamilies(registry)), counter


def _uploads(counter: UsageCounter, n: int, client: str = "c1") -> None:
    for _ in range(n):
        counter.record({"legacy_upload_guard": "blocked"}, client, "sdk/1", "acme")


def _stored(path: Path) -> int:
    store = Store(f"sqlite:///{path}")
    try:
        report = store.report(Query(*window(time.time() - 3600, time.time())))
    finally:
        store.close()
    return int(report["behaviours"].get("legacy_uploads", {}).get("requests", 0))


async def test_a_database_that_cannot_be_opened_costs_nothing_but_a_state_and_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = tmp_path / "not-yet"
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"sqlite:///{missing}/usage.sqlite3", registry)
    caplog.set_level(logging.INFO, logger="gateway.ledger")
    await ledger.start()
    try:
        _uploads(counter, 5)
        await _until(lambda: _sample(registry, "gateway_usage_ledger_flushes_total", result="failure") >= 3)
        assert ledger.state == "failing" and "unable to open database file" in (ledger.error or "")
        assert _sample(registry, "gateway_usage_ledger_up") == 0
        assert counter.pending == 5 and _sample(registry, "gateway_usage_ledger_pending_requests") == 5
        with pytest.raises(LedgerUnavailable, match="unable to open database file"):
            await ledger.report(Query(*window(time.time() - 60, time.time())))
        _uploads(counter, 2)  # still counted meanwhile
        missing.mkdir()
        await _until(lambda: ledger.state == "ok")
        assert _sample(registry, "gateway_usage_ledger_up") == 1 and counter.pending == 0
        report = await ledger.report(Query(*window(time.time() - 60, time.time())))
        assert report["behaviours"]["legacy_uploads"]["requests"] == 7
    finally:
        await ledger.close()
    # One line when it started failing, one when it came back: not one per attempt.
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.ledger"]
    assert len([line for line in lines if "cannot write" in line]) == 1
    assert len([line for line in lines if "writing again" in line]) == 1
    assert _sample(registry, "gateway_usage_ledger_dropped_requests_total", reason="shutdown") == 0


async def test_a_write_slower_than_its_timeout_is_not_counted_twice(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The first write outlives flush_timeout but commits: the batch, sent again under the same id, is recognised."""
    registry = CollectorRegistry()
    path = tmp_path / "usage.sqlite3"
    ledger, counter = _ledger(f"sqlite:///{path}", registry, flush_timeout=0.3)
    original = Store.write
    slow = {"calls": 0}

    def write(self: Store, *args: Any, **kwargs: Any) -> bool:
        slow["calls"] += 1
        if slow["calls"] == 1:
            time.sleep(1.0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Store, "write", write)
    await ledger.start()
    try:
        await _until(lambda: ledger.state == "ok")
        _uploads(counter, 4)
        await _until(lambda: ledger.state == "failing")
        assert ledger.error is not None and "no answer within 0.3s" in ledger.error
        await _until(lambda: ledger.state == "ok" and counter.pending == 0)
    finally:
        await ledger.close()
    assert slow["calls"] >= 2 and _stored(path) == 4


async def test_stopping_writes_what_is_held_and_counts_what_it_cannot(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    path = tmp_path / "usage.sqlite3"
    ledger, counter = _ledger(f"sqlite:///{path}", registry, flush_interval=3600)
    await ledger.start()
    await _until(lambda: ledger.state == "ok")
    _uploads(counter, 3)
    await ledger.close()  # the flush interval is an hour away: the last write is close()'s
    assert _stored(path) == 3
    # A database that is gone when the gateway stops: what was held is counted as lost, in one line.
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"postgresql://gw:hunter2-secret@127.0.0.1:{free_port()}/ledger", registry,
                              flush_timeout=1.0)
    caplog.set_level(logging.INFO, logger="gateway.ledger")
    await ledger.start()
    _uploads(counter, 6)
    await _until(lambda: ledger.state == "failing")
    await ledger.close()
    assert _sample(registry, "gateway_usage_ledger_dropped_requests_total", reason="shutdown") == 6
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.ledger"]
    assert any("6 counted request(s) could not be written before exit" in line for line in lines)
    # Counted once, as what it is: not also as the memory bound's (before: 6 more, and a false "memory bound" error).
    assert _sample(registry, "gateway_usage_ledger_dropped_requests_total", reason="memory") == 0
    assert not any("memory bound" in line for line in lines), lines
    # The password is never shown: not in the state, not in a log line.
    assert all("hunter2" not in line for line in lines) and "hunter2" not in str(ledger.status())
    assert "${LEDGER_PASSWORD}" in ledger.shown_url or "<redacted>" in ledger.shown_url


async def test_stopping_is_bounded_while_a_migration_hangs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A migration may take up to a minute (PostgreSQL: waiting for another process's migration lock). A stop that
    comes meanwhile waits for it no longer than the last write's own budget (flush_timeout + 1 s), then counts what
    is held as lost; before, it waited for the migration to end."""
    release = threading.Event()

    def migrate(self: Store) -> tuple[str | None, str]:
        release.wait(30)
        raise RuntimeError("released")

    monkeypatch.setattr(Store, "migrate", migrate)
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"sqlite:///{tmp_path}/usage.sqlite3", registry, flush_timeout=0.5)
    caplog.set_level(logging.INFO, logger="gateway.ledger")
    await ledger.start()
    try:
        _uploads(counter, 3)
        await asyncio.sleep(0.2)  # the background write is inside the migration
        started = time.monotonic()
        await ledger.close()
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 3.0, took
    assert ledger.state == "closed"
    assert _sample(registry, "gateway_usage_ledger_dropped_requests_total", reason="shutdown") == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.ledger"]
    assert any("3 counted request(s) could not be written before exit (a write still running after 1.5s at exit)"
               in line for line in lines), lines


async def test_the_database_s_modules_are_frozen_even_while_it_is_down(tmp_path: Path) -> None:
    """Full collections hold the GIL for as long as they walk every tracked object; the ledger freezes what loading
    SQLAlchemy and the driver made as soon as they are loaded, not only after a first migration that a database
    down at start may not allow for hours."""
    registry = CollectorRegistry()
    ledger, _ = _ledger(f"postgresql://gw:pw@127.0.0.1:{free_port()}/ledger", registry, flush_timeout=0.5)
    gc.unfreeze()
    before = gc.get_freeze_count()
    assert before == 0
    await ledger.start()
    try:
        await _until(lambda: ledger.state == "failing")
        assert gc.get_freeze_count() > 1000
    finally:
        await ledger.close()
        gc.unfreeze()


async def test_a_read_sees_this_process_s_own_writes_at_once(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"sqlite:///{tmp_path}/usage.sqlite3", registry, flush_interval=3600)
    await ledger.start()
    try:
        await _until(lambda: ledger.state == "ok")
        _uploads(counter, 2, "first")
        _uploads(counter, 1, "second")
        report = await ledger.report(Query(*window(time.time() - 60, time.time()), order="recent"))
        rows = report["behaviours"]["legacy_uploads"]["top_clients"]
        assert [(r["client"], r["requests"]) for r in rows] == [("second", 1), ("first", 2)]
        day = int(time.time()) // 86400 * 86400
        assert await ledger.daily(*window(time.time() - 86400, time.time())) == [("acme", "legacy_uploads", day, 3)]
    finally:
        await ledger.close()
    with pytest.raises(LedgerUnavailable, match="not running"):
        await ledger.report(Query(*window(time.time() - 60, time.time())))


def test_ledgers_of_one_process_migrate_one_at_a_time(tmp_path: Path) -> None:
    """Alembic's migration context is one module-level proxy: four ledgers of one process created at once (gateways
    started side by side) each end at the head revision. Without the lock, one thread's upgrade ran on another's
    connection ("table usage_totals already exists", KeyError 'script' or 'config')."""
    import threading

    stores = [Store(f"sqlite:///{tmp_path}/ledger{i}.sqlite3") for i in range(4)]
    results: list[tuple[str | None, str] | BaseException] = []

    def migrate(store: Store) -> None:
        try:
            results.append(store.migrate())
        except BaseException as err:  # noqa: BLE001 - the test reports it
            results.append(err)

    threads = [threading.Thread(target=migrate, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert all(isinstance(r, tuple) and r[0] is None for r in results), results
        assert [store.revision() for store in stores] == [results[0][1]] * 4  # type: ignore[index]
    finally:
        for store in stores:
            store.close()


async def test_identical_reads_share_one_query_and_a_new_request_is_still_seen_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three status pages reading at once cost one query; a page refreshed within its freshness costs none while
    this process has counted nothing since, and a read after a new request queries again (and sees it)."""
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"sqlite:///{tmp_path}/usage.sqlite3", registry, flush_interval=3600)
    original = Store.report
    calls = []

    def report(self: Store, query: Query) -> dict[str, Any]:
        calls.append(query)
        time.sleep(0.2)  # long enough for the three to meet
        return original(self, query)

    monkeypatch.setattr(Store, "report", report)
    query = Query(*window(time.time() - 3600, time.time()))
    await ledger.start()
    try:
        await _until(lambda: ledger.state == "ok")
        _uploads(counter, 2)
        answers = await asyncio.gather(*(ledger.report(query, fresh=10) for _ in range(3)))
        assert len(calls) == 1 and all(a["behaviours"]["legacy_uploads"]["requests"] == 2 for a in answers)
        again = await ledger.report(query, fresh=10)  # nothing counted since: the same answer
        assert len(calls) == 1 and again == answers[0]
        assert (await ledger.report(query))["behaviours"]["legacy_uploads"]["requests"] == 2  # fresh=0: a query
        assert len(calls) == 2
        _uploads(counter, 1)
        seen = await ledger.report(query, fresh=10)  # a request since: read again, and it is there
        assert len(calls) == 3 and seen["behaviours"]["legacy_uploads"]["requests"] == 3
        other = Query(query.since, query.until, top=1)
        await asyncio.gather(ledger.report(query, fresh=10), ledger.report(other, fresh=10))
        assert len(calls) == 4  # another query is not the same read (and the first was still fresh)
    finally:
        await ledger.close()


async def test_a_last_write_slower_than_its_timeout_is_waited_for_not_reported_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The last write at exit outlives flush_timeout but commits: its outcome is waited for (within the last write's
    budget, flush_timeout + 1 s) and nothing is reported lost (before: every request in it was, though all were in
    the database). One that has not answered even then is said to be of unknown outcome, never counted as lost."""
    original = Store.write
    delay = {"seconds": 0.0}

    def write(self: Store, *args: Any, **kwargs: Any) -> bool:
        time.sleep(delay["seconds"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Store, "write", write)
    caplog.set_level(logging.INFO, logger="gateway.ledger")
    for seconds, answered in ((0.8, True), (2.5, False)):
        registry = CollectorRegistry()
        path = tmp_path / f"usage-{seconds}.sqlite3"
        ledger, counter = _ledger(f"sqlite:///{path}", registry, flush_interval=3600, flush_timeout=0.3)
        await ledger.start()
        await _until(lambda: ledger.state == "ok")
        delay["seconds"] = seconds
        _uploads(counter, 5)
        caplog.clear()
        await ledger.close()
        delay["seconds"] = 0.0
        lines = [r.getMessage() for r in caplog.records if r.name == "gateway.ledger"]
        assert _sample(registry, "gateway_usage_ledger_dropped_requests_total", reason="shutdown") == 0, lines
        assert not any("could not be written" in line for line in lines), lines
        unknown = any("5 counted request(s) were in a write that had not answered at exit" in line for line in lines)
        assert unknown is not answered, lines
        await _until(lambda: _stored(path) == 5)  # in the database (the slower one commits in its thread)


async def test_the_pending_gauge_shows_what_is_held_between_attempts(tmp_path: Path) -> None:
    """While writes fail and back off (1 s, 2 s, ... up to a minute), the gauge follows what is counted within a
    second (before: it moved only at each attempt, and read 0 after a quiet spell while requests were held)."""
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"postgresql://gw:pw@127.0.0.1:{free_port()}/ledger", registry, flush_interval=3600,
                              flush_timeout=0.5)
    await ledger.start()
    try:
        failures = "gateway_usage_ledger_flushes_total"
        await _until(lambda: _sample(registry, failures, result="failure") >= 2)  # the next attempt: 1.6 s or more
        _uploads(counter, 3)
        await _until(lambda: _sample(registry, "gateway_usage_ledger_pending_requests") == 3, timeout=1.3)
        assert _sample(registry, failures, result="failure") == 2  # no attempt meanwhile: the gauge moved by itself
    finally:
        await ledger.close()


async def test_a_deleted_file_that_cannot_be_made_again_fails_writes_until_it_can(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The ledger's directory deleted with its file: the writes fail, saying why (the ledger is down, the status page
    says so), the counts are held; once the directory is back, the file is made again and what was held is in it."""
    import shutil

    directory = tmp_path / "ledger"
    directory.mkdir()
    registry = CollectorRegistry()
    ledger, counter = _ledger(f"sqlite:///{directory}/usage.sqlite3", registry)
    caplog.set_level(logging.INFO, logger="gateway.ledger")
    await ledger.start()
    try:
        await _until(lambda: ledger.state == "ok")
        _uploads(counter, 2)
        await _until(lambda: counter.pending == 0)
        shutil.rmtree(directory)
        _uploads(counter, 3)
        await _until(lambda: ledger.state == "failing")
        assert "was deleted and cannot be made again" in (ledger.error or "")
        assert _sample(registry, "gateway_usage_ledger_up") == 0 and counter.pending == 3
        directory.mkdir()
        await _until(lambda: ledger.state == "ok", timeout=15)
        assert "the file was deleted while in use" in (ledger.status()["notice"] or "")
        assert _sample(registry, "gateway_usage_ledger_reopened_total") == 1
    finally:
        await ledger.close()
    assert _stored(directory / "usage.sqlite3") == 3
