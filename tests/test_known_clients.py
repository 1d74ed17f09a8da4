"""A freeze's record of who was seen before its date (``ops.ledger.known``), in one process with a real SQLite
database: what another process wrote is learnt at the next read, what this process counts at once; what is learnt
is kept in a file and neither a restart nor an unreadable database forgets it; a client it cannot place is None,
counted and said once. Two gateway processes on PostgreSQL: tests/integration/test_freeze.py."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import parse_config
from gateway.config.ledger import LedgerConfig
from gateway.ops.ledger import Ledger, LedgerFamilies
from gateway.ops.ledger.known import KnownClients, KnownFamilies, snapshot_path
from gateway.ops.ledger.store import Store
from gateway.ops.usage import UsageCounter

GUARD = {"legacy_upload_guard": "legacy_uploads"}
DAY = 86400


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _plan(freeze: str) -> Any:
    return parse_config({
        "tenants": [{"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01",
                     "restricted_file_access": True, "forbid_legacy_uploads": False}],
        "rollout": {"freezes": [{"behaviour": "legacy_uploads", "from": freeze}]},
    }).rollout_plan()


def _write(url: str, client: str, at: float) -> None:
    """A call recorded by another process at ``at``."""
    store = Store(url)
    store.migrate()
    counter = UsageCounter(behaviours=GUARD, clock=lambda: at)
    counter.record({"legacy_upload_guard": "allowed"}, client, "sdk/1", "acme")
    batch = counter.take()
    assert batch is not None and store.write(batch, at)
    store.close()


async def _known(url: str, snapshot: Path | None, clock: Clock, registry: CollectorRegistry, **options: Any
                 ) -> tuple[Ledger, KnownClients, UsageCounter]:
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    config = LedgerConfig(url=url, **{"flush_interval": 0.05, "flush_timeout": 1.0, "sync_interval": 0.1, **options})
    ledger = Ledger(config, counter, redact=str, families=LedgerFamilies(registry))
    known = KnownClients(ledger, snapshot, families=KnownFamilies(registry), clock=clock)
    await ledger.start()
    return ledger, known, counter


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_who_was_seen_before_the_freeze_is_read_kept_and_never_forgotten(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path}/usage.sqlite3"
    snapshot = tmp_path / "known.json"
    clock = Clock()
    freeze = time.strftime("%Y-%m-%d", time.gmtime(clock.now - DAY))  # yesterday (UTC): its record is final
    plan = _plan(freeze)
    at = plan.schedules["acme"]["legacy_uploads"].freeze.at
    _write(url, "early", at - 3600)  # seen by another replica before the freeze
    registry = CollectorRegistry()
    ledger, known, counter = await _known(url, snapshot, clock, registry)
    try:
        assert known.watch(plan)
        caplog.set_level(logging.WARNING, "gateway.ledger")
        # Not read yet, no file: it cannot place anyone (counted every time, said once).
        assert [known.seen_before("acme", "legacy_uploads", c, at) for c in ("early", "late", "late")] == [None] * 3
        assert registry.get_sample_value("gateway_freeze_unplaced_total", {"behaviour": "legacy_uploads"}) == 3
        assert len([r for r in caplog.records if "could not be placed" in r.message]) == 1
        known.start()
        await _until(lambda: known.seen_before("acme", "legacy_uploads", "early", at) is True)
        assert known.seen_before("acme", "legacy_uploads", "late", at) is False  # first seen after: new
        assert known.seen_before("oldco", "legacy_uploads", "early", at) is False  # another company's is its own
        _write(url, "elsewhere", at - 60)  # another replica writes what it saw before the freeze
        await _until(lambda: known.seen_before("acme", "legacy_uploads", "elsewhere", at) is True)
    finally:
        await known.close()
        await ledger.close()
    assert snapshot.exists()
    # Restarted while its database cannot be read: the file keeps what it knew, and the record is final.
    broken = f"sqlite:///{tmp_path}/gone/usage.sqlite3"
    registry = CollectorRegistry()
    ledger, again, _ = await _known(broken, snapshot, clock, registry)
    try:
        assert again.watch(plan)
        again.start()
        await _until(lambda: ledger.state == "failing")
        assert [again.seen_before("acme", "legacy_uploads", c, at) for c in ("early", "elsewhere", "late")] == [
            None, None, None]  # another database's file (its URL differs) is not read
    finally:
        await again.close()
        await ledger.close()
    # The same database, gone and impossible to make again: what the file holds is what it answers.
    (tmp_path / "usage.sqlite3").rename(tmp_path / "moved.sqlite3")
    (tmp_path / "usage.sqlite3").mkdir()
    ledger, again, _ = await _known(url, snapshot, clock, CollectorRegistry(), flush_timeout=0.2)
    try:
        again.watch(plan)
        assert [again.seen_before("acme", "legacy_uploads", c, at) for c in ("early", "elsewhere", "late")] == [
            None, None, None]  # before start: the file is not read yet
        again.start()
        await _until(lambda: ledger.state == "failing")
        assert [again.seen_before("acme", "legacy_uploads", c, at) for c in ("early", "elsewhere", "late")] == [
            True, True, False]
    finally:
        await again.close()
        await ledger.close()


async def test_what_this_process_counts_is_known_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/usage.sqlite3"
    clock = Clock()
    freeze = time.strftime("%Y-%m-%d", time.gmtime(clock.now + DAY))  # tomorrow
    plan = _plan(freeze)
    at = plan.schedules["acme"]["legacy_uploads"].freeze.at
    ledger, known, counter = await _known(url, None, clock, CollectorRegistry(), flush_interval=3600)
    counter.max_clients = 1  # the second client of the hour gets no row of its own: this process saw it all the same
    try:
        assert known.watch(plan)
        counter.seen = known.own
        counter.record({"legacy_upload_guard": "allowed"}, "mine", "sdk/1", "acme")  # before the freeze
        counter.record({"legacy_upload_guard": "allowed"}, "untracked", "sdk/1", "acme")
        assert known.seen_before("acme", "legacy_uploads", "mine", at) is True  # not written yet: known
        assert known.seen_before("acme", "legacy_uploads", "untracked", at) is True
        clock.now = at + 1
        counter.record({"legacy_upload_guard": "allowed"}, "after", "sdk/1", "acme")
        assert known.seen_before("acme", "legacy_uploads", "after", at) is None  # never read: cannot tell
    finally:
        await known.close()
        await ledger.close()


async def test_a_record_not_yet_final_is_trusted_within_its_bound_only(tmp_path: Path) -> None:
    """Just after the freeze instant another replica may still hold what it saw before it (its flush_interval):
    a client not in the record is new while the last read is within flush_interval + sync_interval + flush_timeout,
    unplaced once the reads have failed for longer."""
    url = f"sqlite:///{tmp_path}/usage.sqlite3"
    clock = Clock()
    plan = _plan(time.strftime("%Y-%m-%d", time.gmtime(clock.now)))
    at = plan.schedules["acme"]["legacy_uploads"].freeze.at
    clock.now = at + 0.5  # half a second after the freeze: not final for a flush interval and a timeout
    ledger, known, _ = await _known(url, None, clock, CollectorRegistry(), flush_interval=5.0, flush_timeout=5.0,
                                    sync_interval=1.0)
    try:
        known.watch(plan)
        assert await known.sync()
        assert known.seen_before("acme", "legacy_uploads", "new", at) is False
        clock.now += 5 + 1 + 5 + 0.1  # the bound, without another read
        assert known.seen_before("acme", "legacy_uploads", "new", at) is None
        clock.now = at + 11  # a read after flush_interval + flush_timeout: final
        assert await known.sync()
        clock.now += 3600
        assert known.seen_before("acme", "legacy_uploads", "new", at) is False
    finally:
        await known.close()
        await ledger.close()


def test_where_the_record_is_kept(tmp_path: Path) -> None:
    assert snapshot_path(LedgerConfig(url=f"sqlite:///{tmp_path}/u.sqlite3"), None) == \
        tmp_path / "u.sqlite3.known-clients.json"
    assert snapshot_path(LedgerConfig(url="sqlite://"), None) is None
    postgres = snapshot_path(LedgerConfig(url="postgresql://gw:pw@db:5432/ledger"), str(tmp_path))
    assert postgres is not None and postgres.parent == tmp_path and postgres.name.startswith("gateway-known-clients-")
    chosen = snapshot_path(LedgerConfig(url="sqlite://", known_clients_file=str(tmp_path / "k.json")), None)
    assert chosen == tmp_path / "k.json"
