"""Who still uses deprecated behaviour: the usage counter (bounded memory on the request's path) and the ledger's
store (the database: SQLite and a real PostgreSQL server), without a gateway around them.

The ledger in a running gateway (background writes, outages, signals, the command line) is tested through real
processes in tests/integration/test_usage_ledger.py."""

from __future__ import annotations

import datetime as dt
import os
import threading
from typing import TYPE_CHECKING, Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from gateway.app import ConfigError, parse_config
from gateway.config.ledger import database_url
from gateway.ops.ledger.migrations import HEAD
from gateway.ops.ledger.query import Query, parse_when, window
from gateway.ops.ledger.schema import metadata
from gateway.ops.ledger.store import MIGRATIONS, Store
from gateway.ops.usage import HOUR, UsageCounter
from tests.ledger_testlib import at_revision_0001, write_old_rows

if TYPE_CHECKING:
    from gateway.core.decision import Decision
    from gateway.core.route import Route

GUARD = {"legacy_upload_guard": "legacy_uploads"}
T0 = dt.datetime(2026, 11, 2, 10, 0, tzinfo=dt.UTC).timestamp()


class FakeTime:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def expanded(url: str) -> str:
    """A test URL with its ``${LEDGER_PASSWORD}`` reference expanded (the config does it for the gateway)."""
    return url.replace("${LEDGER_PASSWORD}", os.environ.get("LEDGER_PASSWORD", ""))


@pytest.fixture
def store(ledger_url: str) -> Any:
    opened = Store(expanded(ledger_url))
    opened.migrate()
    yield opened
    opened.close()


def _write(store: Store, counter: UsageCounter, now: float = T0) -> None:
    batch = counter.take()
    assert batch is not None
    assert store.write(batch, now) is True
    counter.written(batch)


# --- the counter ----------------------------------------------------------------------------------------------------


def test_counts_by_behaviour_hour_tenant_client_and_decision() -> None:
    clock = FakeTime()
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    for _ in range(5):
        counter.record({"legacy_upload_guard": "blocked"}, "aaa", "legacy-client/1.0", "acme")
    clock.now += 10
    counter.record({"legacy_upload_guard": "allowed"}, "aaa", "legacy-client/1.0", "acme")
    counter.record({"board_cards": "capped"}, None, "x" * 500, None)
    counter.record({}, "ignored", None, "acme")  # no decision: not deprecated use
    assert counter.pending == 7
    batch = counter.take()
    assert batch is not None and batch.count == 7
    hour = int(T0) // HOUR * HOUR
    assert batch.totals() == {(hour, "legacy_uploads", "acme", "blocked"): (5, 0),
                              (hour, "legacy_uploads", "acme", "allowed"): (1, 0),
                              (hour, "board_cards", "none", "capped"): (1, 0)}
    assert batch.untracked == {}
    blocked = (hour, "legacy_uploads", "acme", "aaa", "legacy-client/1.0", "blocked")
    allowed = (hour, "legacy_uploads", "acme", "aaa", "legacy-client/1.0", "allowed")
    assert (batch.requests[blocked], batch.first_seen[blocked], batch.last_seen[blocked]) == (5, T0, T0)
    assert (batch.requests[allowed], batch.first_seen[allowed], batch.last_seen[allowed]) == (1, T0 + 10, T0 + 10)
    # No token, a User-Agent cut at 200 characters, a request refused before its tenant was known.
    assert (hour, "board_cards", "none", "", "x" * 200, "capped") in batch.requests


def test_clients_per_behaviour_and_hour_are_bounded_and_the_rest_counted_as_untracked() -> None:
    clock = FakeTime()
    counter = UsageCounter(max_clients=10, behaviours=GUARD, clock=clock)
    for i in range(1000):
        counter.record({"legacy_upload_guard": "blocked"}, f"client-{i}", None, "acme")
    counter.record({"legacy_upload_guard": "allowed"}, "client-3", None, "acme")  # tracked: another decision too
    batch = counter.take()
    assert batch is not None and len(batch.requests) == 11
    assert sum(batch.untracked.values()) == 990
    assert sum(n for n, _ in batch.totals().values()) == 1001  # every request is in the totals
    assert batch.totals()[(int(T0) // HOUR * HOUR, "legacy_uploads", "acme", "blocked")] == (1000, 990)
    counter.written(batch)
    counter.record({"legacy_upload_guard": "blocked"}, "client-999", None, "acme")  # still this hour: untracked
    clock.now += HOUR  # a new hour: a new set of clients
    counter.record({"legacy_upload_guard": "blocked"}, "client-999", None, "acme")
    batch = counter.take()
    assert batch is not None
    assert [k[3] for k in batch.requests] == ["client-999"] and sum(batch.untracked.values()) == 1


def test_a_batch_is_sent_again_as_it_was_until_it_is_written_and_memory_stays_bounded() -> None:
    counter = UsageCounter(max_rows=100, behaviours=GUARD, clock=FakeTime())
    for i in range(60):
        counter.record({"legacy_upload_guard": "blocked"}, f"c{i}", None, "acme")
    first = counter.take()
    assert first is not None and len(first.requests) == 60
    # The write failed: what arrives meanwhile is held apart, within the bound on rows held in all.
    for i in range(60, 200):
        counter.record({"legacy_upload_guard": "blocked"}, f"c{i}", None, "acme")
    assert counter.take() is first  # the same batch, the same id
    assert counter.pending == 200
    counter.written(first)
    second = counter.take()
    assert second is not None and second.id != first.id
    assert len(second.requests) == 40 and sum(second.untracked.values()) == 100  # the rest untracked
    assert counter.dropped == 0 and counter.pending == 140
    # Given up on at exit: not what the memory bound turned away (``dropped``), which the ledger counts apart.
    assert counter.discard() == 140 and counter.dropped == 0 and counter.take() is None


def test_untracked_keys_are_bounded_too_and_what_is_not_kept_is_counted() -> None:
    clock = FakeTime()
    counter = UsageCounter(max_rows=3, clock=clock)
    for i in range(3):
        counter.record({"p": "d"}, f"c{i}", None, "t")  # the bound on client rows: reached
    for i in range(5):  # a long outage: one new hour after another, each with a new client
        clock.now += HOUR
        counter.record({"p": "d"}, f"new{i}", None, "t")
    assert counter.pending == 6 and counter.dropped == 2  # 3 rows, 3 hours of untracked requests


# --- windows and URLs -------------------------------------------------------------------------------------------


def test_windows_are_whole_hours() -> None:
    now = T0 + 1800  # 10:30
    assert parse_when("2h", now) == now - 7200
    assert parse_when("30d", now) == now - 30 * 86400
    assert parse_when("2026-10-01", now) == dt.datetime(2026, 10, 1, tzinfo=dt.UTC).timestamp()
    berlin = dt.timezone(dt.timedelta(hours=1))
    assert parse_when("2026-10-01T12:00", now, berlin) == dt.datetime(2026, 10, 1, 11, tzinfo=dt.UTC).timestamp()
    assert window(now - 7200, now) == (int(T0) - 7200, int(T0) + 3600)  # 08:00 to 11:00
    for bad in ("yesterday", "30", "5y", "2026-13-01"):
        with pytest.raises(ValueError, match="neither a duration"):
            parse_when(bad, now)


@pytest.mark.parametrize("url, expected", [
    ("sqlite:///usage.sqlite3", "sqlite:///usage.sqlite3"),
    ("sqlite:////var/lib/gateway/usage.sqlite3", "sqlite:////var/lib/gateway/usage.sqlite3"),
    ("sqlite://", "sqlite://"),
    ("postgresql://gw:pw@db:5432/ledger", "postgresql+psycopg://gw:pw@db:5432/ledger"),
    ("postgres://gw:pw@db/ledger?sslmode=require", "postgresql+psycopg://gw:pw@db/ledger?sslmode=require"),
    ("postgresql://gw@/ledger?host=/run/postgresql", "postgresql+psycopg://gw@/ledger?host=/run/postgresql"),
])
def test_database_urls(url: str, expected: str) -> None:
    assert database_url(url) == expected


@pytest.mark.parametrize("url, message", [
    ("mysql://root:hunter2@db/x", "unsupported database 'mysql'"),
    ("sqlite://relative.db", "sqlite:///relative/path"),
    ("postgresql://gw:hunter2@db:5432", "names its database"),
    ("postgresql://gw:hunter2@:5432/x", "names its host"),
    ("hunter2", "expected sqlite:///PATH"),
])
def test_a_bad_url_is_refused_without_being_echoed(url: str, message: str) -> None:
    config = {"tenants": [{"name": "t", "hosts": ["t.test"], "upstream": "http://127.0.0.1:1"}],
              "usage": {"ledger": {"url": url}}}
    with pytest.raises(ConfigError) as err:
        parse_config(config)
    [problem] = err.value.problems
    assert problem.startswith("usage.ledger.url: ") and message in problem
    assert "hunter2" not in str(err.value)


# --- the store, on SQLite and PostgreSQL ------------------------------------------------------------------------


def test_the_migrations_create_the_schema_the_code_uses(store: Store) -> None:
    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    assert store.migrate() == ("0002", "0002")  # again: nothing to do
    # The head the gateway compares with at start (without importing Alembic) is Alembic's own.
    assert ScriptDirectory(str(MIGRATIONS)).get_current_head() == HEAD == store.revision()


def test_batches_add_up_and_one_sent_twice_counts_once(store: Store) -> None:
    clock = FakeTime()
    a = UsageCounter(behaviours=GUARD, clock=clock)
    b = UsageCounter(behaviours=GUARD, clock=clock)
    for _ in range(3):
        a.record({"legacy_upload_guard": "blocked"}, "c1", "ua", "acme")
    clock.now -= 100
    b.record({"legacy_upload_guard": "blocked"}, "c1", "ua", "acme")
    clock.now += 500
    b.record({"legacy_upload_guard": "blocked"}, "c1", "ua", "acme")
    batch = a.take()
    assert batch is not None
    assert store.write(batch, T0) is True
    assert store.write(batch, T0) is False  # its outcome was unknown, so it came again: not counted twice
    _write(store, b)
    report = store.report(Query(*window(T0 - 86400, T0 + 3600)))
    assert report["behaviours"]["legacy_uploads"]["requests"] == 5
    [row] = report["behaviours"]["legacy_uploads"]["top_clients"]
    assert (row["requests"], row["first_seen"], row["last_seen"]) == (5, T0 - 100, T0 + 400)


def test_two_writers_at_once_add_up_exactly(store: Store, ledger_url: str) -> None:
    """Two stores (two processes' engines) upserting the same rows concurrently, many times."""
    other = Store(expanded(ledger_url))
    errors: list[BaseException] = []

    def writer(target: Store, offset: int) -> None:
        try:
            for round_ in range(20):
                counter = UsageCounter(behaviours=GUARD, clock=FakeTime(T0 + offset + round_))
                for i in range(50):
                    counter.record({"legacy_upload_guard": "blocked"}, f"c{i}", "ua", "acme")
                batch = counter.take()
                assert batch is not None
                target.write(batch, T0)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(s, i)) for i, s in enumerate((store, other))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    other.close()
    assert errors == []
    report = store.report(Query(*window(T0, T0 + 60), top=None))["behaviours"]["legacy_uploads"]
    assert report["requests"] == 2000 and report["clients"] == 50
    assert {row["requests"] for row in report["top_clients"]} == {40}


def test_reports_filter_order_and_count_by_day(store: Store) -> None:
    clock = FakeTime()
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    for _ in range(4):
        counter.record({"legacy_upload_guard": "blocked"}, "busy", "old-sdk", "acme")
    counter.record({"board_cards": "capped"}, "busy", "old-sdk", "acme")
    clock.now += 2 * 86400  # two days later
    counter.record({"legacy_upload_guard": "allowed"}, "recent", None, "oldco")
    _write(store, counter)
    everything = store.report(Query(*window(T0 - 86400, T0 + 3 * 86400)))
    assert list(everything["behaviours"]) == ["board_cards", "legacy_uploads"]
    uploads = everything["behaviours"]["legacy_uploads"]
    assert uploads["by_decision"] == {"blocked": 4, "allowed": 1}
    assert uploads["by_tenant"] == {"acme": {"blocked": 4}, "oldco": {"allowed": 1}}
    assert [r["client"] for r in uploads["top_clients"]] == ["busy", "recent"]
    recent = store.report(Query(*window(T0 - 86400, T0 + 3 * 86400), order="recent", top=1))
    [row] = recent["behaviours"]["legacy_uploads"]["top_clients"]
    assert (row["client"], row["user_agent"], row["decisions"]) == ("recent", None, {"allowed": 1})
    oldco = store.report(Query(*window(T0 - 86400, T0 + 3 * 86400), tenant="oldco", behaviour="legacy_uploads"))
    assert list(oldco["behaviours"]) == ["legacy_uploads"] and oldco["behaviours"]["legacy_uploads"]["requests"] == 1
    first_day = store.report(Query(*window(T0, T0 + 3600)))
    assert first_day["behaviours"]["legacy_uploads"]["requests"] == 4  # the window is whole hours
    day = int(T0) // 86400 * 86400
    assert store.daily(*window(T0 - 86400, T0 + 3 * 86400)) == [
        ("acme", "board_cards", day, 1), ("acme", "legacy_uploads", day, 4),
        ("oldco", "legacy_uploads", day + 2 * 86400, 1)]


def test_retention_deletes_whole_hours_before_the_cut(store: Store) -> None:
    clock = FakeTime(T0 - 40 * 86400)
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    counter.record({"legacy_upload_guard": "blocked"}, "old", None, "acme")
    clock.now = T0
    counter.record({"legacy_upload_guard": "blocked"}, "new", None, "acme")
    _write(store, counter)
    cut = int(T0 - 30 * 86400) // HOUR * HOUR
    # The old hour's total and client row, and the old client's day and state (the rollups keep the retention too).
    assert store.prune(cut, T0 - 7 * 86400) == 4
    report = store.report(Query(*window(T0 - 50 * 86400, T0 + 3600)))["behaviours"]["legacy_uploads"]
    assert report["requests"] == 1 and [r["client"] for r in report["top_clients"]] == ["new"]


def test_a_report_holds_only_its_top_rows_whatever_the_window_holds(store: Store) -> None:
    """The database groups, orders and cuts to ``top``: 20,000 clients in the window, and what the report's
    process allocates stays far below what their rows would take (before, every row was fetched and folded in
    Python: about 1 KB each)."""
    import tracemalloc

    from gateway.ops.ledger.schema import clients, totals

    hour = int(T0) // HOUR * HOUR
    rows = [{"bucket": hour - HOUR * (i % 3), "behaviour": "legacy_uploads", "tenant": "acme", "client": f"{i:012x}",
             "user_agent": "sdk/1.0", "decision": "blocked", "requests": 1 + i % 7, "first_seen": T0 - i,
             "last_seen": T0 - i} for i in range(20_000)]
    # One client (token) with a second User-Agent: one client, two User-Agent variants.
    rows.append({**rows[0], "user_agent": "sdk/2.0", "decision": "allowed", "requests": 100, "last_seen": T0})
    with store.engine.begin() as conn:
        conn.execute(clients.insert(), rows)
        conn.execute(totals.insert(), [
            {"bucket": hour - HOUR * k, "behaviour": "legacy_uploads", "tenant": "acme", "decision": d, "requests": n,
             "untracked": 0} for k in range(3) for d, n in (("blocked", 1), ("allowed", 1))])
    query = Query(*window(T0 - 86400, T0 + 1), top=5)
    store.report(query)  # statements compiled once (SQLAlchemy's cache): not the rows' cost
    tracemalloc.start()
    try:
        report = store.report(query)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    uploads = report["behaviours"]["legacy_uploads"]
    assert (uploads["clients"], uploads["variants"]) == (20_000, 20_001)
    top = uploads["top_clients"]
    assert [(r["client"], r["user_agent"], r["requests"], r["decisions"]) for r in top[:2]] == [
        (f"{0:012x}", "sdk/2.0", 100, {"allowed": 100}), (f"{6:012x}", "sdk/1.0", 7, {"blocked": 7})]
    assert len(top) == 5


def test_a_held_client_row_costs_what_the_docs_say() -> None:
    """What a client row held in memory costs, measured with tracemalloc as requests bring rows: every client new
    in the hour (so also in the hour's set of clients), a User-Agent string of its own, two requests each, and just
    past a growth of the dictionaries (the most a row costs). docs/operations.md says the most a row costs and what
    the default bound (usage.ledger.max_pending_clients) costs: both must hold, and the first not overstate by much.
    (Before, the docs said 410 bytes and 80 MiB for a default of 200,000 rows: a row cost 590 to 770 bytes.) Each
    request is recorded as the gateway records it, with its call (issue 36: an example call and the rule that decided
    it are kept per client)."""
    import re
    import tracemalloc
    from pathlib import Path

    from gateway.config.ledger import LedgerConfig
    from gateway.core.decision import Decision, Kind
    from gateway.core.route import Route

    docs = " ".join((Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text().split())
    stated = re.search(r"A client row held costs up to ([\d,]+) bytes \(with a User-Agent of 200 characters; "
                       r"about ([\d,]+) with one of 20\)", docs)
    bound = re.search(r"the default bound, ([\d,]+) rows, costs at most about (\d+) MiB", docs)
    assert stated is not None and bound is not None, "docs/operations.md no longer states what a row costs"
    most, short = (int(stated.group(i).replace(",", "")) for i in (1, 2))
    rows, mib = int(bound.group(1).replace(",", "")), int(bound.group(2))
    assert rows == LedgerConfig().max_pending_clients

    uploads = Route.build("legacy_card_file_upload", ["PUT"], ["/cards/{card_id}/files"], ["/api/v1"])
    forbidden = Decision("legacy_uploads", 1, "forbidden", Kind.SETTING)

    def per_row(agent_length: int, clients: int = 22_000) -> float:
        clock = FakeTime()
        counter = UsageCounter(max_clients=clients, max_rows=clients, behaviours=GUARD, clock=clock)
        calls = [Call("PUT", f"/api/v1/cards/{i}/files", uploads, forbidden) for i in range(clients)]
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(2):
                for i in range(clients):
                    clock.now += 0.001
                    # Strings of their own, as each request's fingerprint and header are.
                    client, agent = f"{i:012x}", f"{i:0{agent_length}d}"
                    counter.record({"legacy_upload_guard": "blocked"}, client, agent, "acme", calls[i])
            return (tracemalloc.get_traced_memory()[0] - before) / clients
        finally:
            tracemalloc.stop()

    long, brief = per_row(200), per_row(20)
    print(f"a held client row: {long:.0f} bytes with a 200-character User-Agent, {brief:.0f} with 20")
    assert 0.9 * most <= long <= most, (long, most)
    assert 0.9 * short <= brief <= 1.1 * short, (brief, short)
    assert rows * most <= mib * 2**20, (rows, most, mib)


def test_rows_the_database_refuses_are_left_out_and_the_rest_is_written(store: Store) -> None:
    """A batch holding rows that cannot be stored (a name longer than the key columns; a row the database refuses,
    here through a constraint an administrator added) is written without them, in the same transaction as the rest,
    and says what it left out. Before, PostgreSQL refused the whole batch, every retry, for ever (and SQLite kept
    the long name, to fail after a move to PostgreSQL)."""
    from sqlalchemy import text

    with store.engine.begin() as conn:
        if store.dialect == "sqlite":
            conn.exec_driver_sql("CREATE TRIGGER no_evil BEFORE INSERT ON usage_clients WHEN NEW.user_agent = 'evil' "
                                 "BEGIN SELECT RAISE(ABORT, 'no evil clients'); END")
        else:
            conn.execute(text("ALTER TABLE usage_clients ADD CONSTRAINT no_evil CHECK (user_agent <> 'evil')"))
    clock = FakeTime()
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    for i in range(40):
        counter.record({"legacy_upload_guard": "blocked"}, f"c{i:02d}", "sdk/1.0", "acme")
    for _ in range(3):
        counter.record({"legacy_upload_guard": "blocked"}, "bad", "evil", "acme")
    for _ in range(2):
        counter.record({"legacy_upload_guard": "allowed"}, "long", "sdk/1.0", "t" * 65)
    batch = counter.take()
    assert batch is not None
    assert store.write(batch, T0) is True
    assert batch.refused == 5
    assert batch.refused_why is not None and ("no_evil" in batch.refused_why or "no evil" in batch.refused_why)
    report = store.report(Query(*window(T0 - 60, T0 + 60), top=None))["behaviours"]["legacy_uploads"]
    # The refused client's requests are in the totals, as untracked; the long name's are nowhere.
    assert (report["requests"], report["untracked_clients_requests"], report["clients"]) == (43, 3, 40)
    assert report["by_tenant"] == {"acme": {"blocked": 43}}
    assert store.write(batch, T0) is False  # sent again (an unknown outcome): recognised, nothing added twice
    counter.written(batch)
    # A long name alone, on a clean batch: refused before the database sees it, whichever database it is.
    counter.record({"legacy_upload_guard": "allowed"}, "long", "sdk/1.0", "t" * 65)
    batch = counter.take()
    assert batch is not None and store.write(batch, T0) is True
    assert batch.refused == 1 and "a name longer than the ledger's columns (64)" in (batch.refused_why or "")
    assert store.report(Query(*window(T0 - 60, T0 + 60)))["behaviours"]["legacy_uploads"]["requests"] == 43


# --- each client's rollups, and the migration that made them (revision 0002) ------------------------------------


class Call:
    """A request's call as the counter reads it (``usage.Call``): its method, path, route and rollout."""

    def __init__(self, method: str, path: str, route: Route, decision: Decision | None = None) -> None:
        self.method, self.path, self.route = method, path, route
        self.rollout = None if decision is None else Decided(decision)


class Decided:
    """A rollout that decides every behaviour alike (``core.decision.Decider``)."""

    now = 0.0  # not read by the counter

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def decide(self, behaviour: str) -> Decision:
        return self.decision

    def previews(self) -> list[str]:
        return []


def _state(store: Store) -> dict[tuple[str, str, str], tuple[Any, ...]]:
    rows, _ = store.readiness(0, 0)
    return {(r[0], r[1], r[2]): tuple(r[3:]) for r in rows}


def _days(store: Store) -> dict[tuple[str, str, str, int], tuple[int, int]]:
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT tenant, client, behaviour, day, requests, refused FROM usage_client_days")
        return {(r[0], r[1], r[2], int(r[3])): (int(r[4]), int(r[5])) for r in rows}


def test_each_batch_rolls_up_its_clients_in_the_same_transaction(store: Store) -> None:
    """Per company, client and behaviour: first and last seen, requests, the latest decision and User-Agent, an
    example call (method and route template, never the path's ids or query), the rule that decided it, when it was
    last refused; per UTC day its requests and refusals. Two processes' batches add up; a batch sent again adds
    nothing; the upload guard's "passed" (nothing uploaded) is no deprecated call."""
    from gateway.core.decision import Decision, Kind
    from gateway.core.route import Route

    uploads = Route.build("legacy_card_file_upload", ["PUT"], ["/cards/{card_id}/files"], ["/api/v1"])
    exempt = Decision("legacy_uploads", 0, "allowed", Kind.EXEMPTION, exemption="old-app")
    dated = Decision("legacy_uploads", 1, "forbidden", Kind.SETTING)
    clock = FakeTime()
    a = UsageCounter(behaviours=GUARD, clock=clock)
    b = UsageCounter(behaviours=GUARD, clock=clock)
    a.record({"legacy_upload_guard": "allowed"}, "c1", "sdk/1", "acme",
             Call("PUT", "/api/v1/cards/4711/files", uploads, exempt))
    a.record({"legacy_upload_guard": "passed"}, "c2", "sdk/1", "acme", Call("PUT", "/api/v1/cards/9/files", uploads))
    clock.now += 86400  # the next day
    b.record({"legacy_upload_guard": "blocked"}, "c1", "sdk/2", "acme",
             Call("PUT", "/api/v1/cards/12/files", uploads, dated))
    b.record({"legacy_upload_guard": "blocked"}, "c1", "sdk/2", "acme")
    batch = b.take()
    assert batch is not None and store.write(batch, T0) and not store.write(batch, T0)  # again: nothing added
    _write(store, a)
    assert _state(store) == {("acme", "c1", "legacy_uploads"): (
        T0, T0 + 86400, 3, "blocked", "sdk/2", "PUT /api/v1/cards/{card_id}/files", "setting", T0 + 86400)}
    day = int(T0) // 86400 * 86400
    assert _days(store) == {("acme", "c1", "legacy_uploads", day): (1, 0),
                            ("acme", "c1", "legacy_uploads", day + 86400): (2, 2)}
    # An older batch arriving late changes the counts, not what the latest request said.
    late = UsageCounter(behaviours=GUARD, clock=FakeTime(T0 - 3600))
    late.record({"legacy_upload_guard": "allowed"}, "c1", "sdk/0", "acme", Call("PUT", "/x", uploads, exempt))
    _write(store, late)
    assert _state(store)[("acme", "c1", "legacy_uploads")] == (
        T0 - 3600, T0 + 86400, 4, "blocked", "sdk/2", "PUT /api/v1/cards/{card_id}/files", "setting", T0 + 86400)


def test_the_bridge_and_exemptions_are_the_rule_that_decided(store: Store) -> None:
    from gateway.core.decision import Decision, Kind
    from gateway.core.route import Route

    board = Route.build("board", ["GET"], ["/boards/{board_id}"], ["/api/latest"])
    call = Call("GET", "/api/latest/boards/7", board, Decision("board_cards", 2, "removed", Kind.DATE, bridge=True))
    counter = UsageCounter(behaviours={"board_cards": "board_cards"}, clock=FakeTime())
    counter.record({"board_cards": "removed:backfilled"}, "bridged", "app/1", "acme", call)
    counter.record({"board_cards": "capped(brownout):capped"}, "browned", "app/1", "acme",
                   Call("GET", "/api/latest/boards/8", board, Decision("board_cards", 1, "capped", Kind.BROWNOUT)))
    counter.record({"board_cards": "capped:capped"}, "shadowed", "app/1", "acme",
                   Call("GET", "/api/latest/boards/9", board, Decision("board_cards", 1, "capped", Kind.DATE, shadow=2)))
    _write(store, counter)
    state = _state(store)
    assert {client: (row[5], row[6]) for (_, client, _), row in state.items()} == {
        "bridged": ("GET /api/latest/boards/{board_id}", "bridge"),
        "browned": ("GET /api/latest/boards/{board_id}", "brownout"),
        "shadowed": ("GET /api/latest/boards/{board_id}", "shadow")}
    # Removed by its date, but its cards came back through the bridge: not refused.
    assert state[("acme", "bridged", "board_cards")][7] == 0.0


def test_a_ledger_written_before_the_rollups_is_upgraded_and_its_rows_kept(ledger_url: str, tmp_path: Any) -> None:
    """A database of revision 0001 with rows written as the store before 0002 wrote them (its upserts of hourly rows
    and totals, the only tables it had): `gateway migrate` upgrades it, the hourly rows are kept as they were, and
    each client's rollups are filled from them (SQLite and PostgreSQL)."""
    import contextlib
    import io

    import yaml

    from gateway import cli

    url = expanded(ledger_url)
    old = at_revision_0001(url)
    assert old.revision() == "0001"
    hour = int(T0) // 3600 * 3600
    rows = [  # (bucket, behaviour, tenant, client, user agent, decision, requests, first seen, last seen)
        (hour, "board_cards", "acme", "c1", "sdk/1", "capped:untouched", 2, T0 + 1, T0 + 100),
        (hour + 86400, "board_cards", "acme", "c1", "sdk/2", "removed:removed", 3, T0 + 86401, T0 + 86500),
        (hour + 86400, "board_cards", "acme", "c1", "sdk/1", "full(exemption):untouched", 1, T0 + 86402, T0 + 86450),
        (hour, "legacy_uploads", "oldco", "", "", "allowed", 4, T0 + 5, T0 + 50),
        (hour, "legacy_uploads", "oldco", "c3", "sdk/1", "passed", 9, T0 + 5, T0 + 50),
        (hour, "board_cards", "acme", "c4", "app/3", "removed:backfilled", 2, T0 + 7, T0 + 70),
    ]
    write_old_rows(old, rows)
    before = {}
    with old.engine.connect() as conn:
        for table in ("usage_clients", "usage_totals"):
            before[table] = sorted(tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table}"))
    old.close()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"tenants": [{"name": "acme", "hosts": ["a.test"], "upstream": "http://127.0.0.1:1"}],
                                      "usage": {"ledger": {"url": ledger_url}}}))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["migrate", "--config", str(config)]) == 0
    assert out.getvalue().rstrip().endswith("schema 0002 (was 0001)")
    store = Store(url)
    try:
        assert store.revision() == "0002"
        with store.engine.connect() as conn:
            for table, rows_before in before.items():
                assert sorted(tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table}")) == rows_before
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        day = int(T0) // 86400 * 86400
        assert _state(store) == {
            # Its latest row decides the decision and User-Agent; its removal the last refusal; no example nor rule
            # was kept before 0002.
            ("acme", "c1", "board_cards"): (T0 + 1, T0 + 86500, 6, "removed:removed", "sdk/2", "", "", T0 + 86500),
            ("oldco", "", "legacy_uploads"): (T0 + 5, T0 + 50, 4, "allowed", "", "", "", 0.0),
            # Its cards rebuilt by the bridge: not refused.
            ("acme", "c4", "board_cards"): (T0 + 7, T0 + 70, 2, "removed:backfilled", "app/3", "", "", 0.0)}
        assert _days(store) == {("acme", "c1", "board_cards", day): (2, 0),
                                ("acme", "c1", "board_cards", day + 86400): (4, 3),
                                ("oldco", "", "legacy_uploads", day): (4, 0),
                                ("acme", "c4", "board_cards", day): (2, 0)}
        # The next batch adds to what was filled, and brings the example and the rule.
        from gateway.core.decision import Decision, Kind
        from gateway.core.route import Route

        board = Route.build("board", ["GET"], ["/boards/{board_id}"], ["/api/latest"])
        counter = UsageCounter(behaviours={"board_cards": "board_cards"}, clock=FakeTime(T0 + 2 * 86400))
        counter.record({"board_cards": "removed:removed"}, "c1", "sdk/2", "acme",
                       Call("GET", "/api/latest/boards/3", board, Decision("board_cards", 2, "removed", Kind.DATE)))
        _write(store, counter, T0 + 2 * 86400)
        assert _state(store)[("acme", "c1", "board_cards")] == (
            T0 + 1, T0 + 2 * 86400, 7, "removed:removed", "sdk/2", "GET /api/latest/boards/{board_id}", "date",
            T0 + 2 * 86400)
    finally:
        store.close()


def test_readiness_reads_each_client_once_with_its_trend_summed_by_the_database(store: Store) -> None:
    """A client's requests in the last 7 UTC days (today included) and the 7 before, and its refusals in the last 7:
    one row per client, whatever days it called on."""
    from gateway.ops.ledger.readiness import days_from

    clock = FakeTime()
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    for days_ago, decision, n in ((13, "allowed", 4), (8, "allowed", 2), (7, "blocked", 1), (6, "blocked", 3),
                                  (0, "allowed", 5), (20, "allowed", 100)):
        clock.now = T0 - days_ago * 86400
        for _ in range(n):
            counter.record({"legacy_upload_guard": decision}, "c1", "sdk", "acme")
    _write(store, counter)
    state, trend = store.readiness(T0 - 30 * 86400, days_from(T0))
    assert [row[:3] for row in state] == [("acme", "c1", "legacy_uploads")]
    assert trend == [("acme", "c1", "legacy_uploads", 8, 7, 3)]  # 3 + 5; 4 + 2 + 1; the 3 blocked six days ago
    assert store.readiness(T0 - 30 * 86400, days_from(T0), tenant="oldco") == ([], [])


def test_a_freeze_reads_who_was_first_seen_before_its_instant(store: Store) -> None:
    clock = FakeTime()
    counter = UsageCounter(behaviours=GUARD, clock=clock)
    counter.record({"legacy_upload_guard": "allowed"}, "early", None, "acme")
    counter.record({"legacy_upload_guard": "allowed"}, "early", None, "oldco")
    clock.now += 86400
    counter.record({"legacy_upload_guard": "allowed"}, "late", None, "acme")
    counter.record({"legacy_upload_guard": "allowed"}, "early", None, "acme")  # again: first seen stays
    counter.record({"board_cards": "full:untouched"}, "late", None, "acme")
    _write(store, counter)
    found = store.seen_before([("legacy_uploads", T0 + 3600), ("board_cards", T0 + 3600)])
    assert sorted(found[("legacy_uploads", T0 + 3600)]) == [("acme", "early"), ("oldco", "early")]
    assert found[("board_cards", T0 + 3600)] == []
