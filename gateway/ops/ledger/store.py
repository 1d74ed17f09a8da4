"""The usage ledger's database side (SQLAlchemy Core, synchronous; sqlite3 or psycopg 3): the schema and its upgrades
(Alembic), batches written as upserts that add up (several processes may write the same rows: ``Store.write``), with
each client's rollups in the same transaction; reports, readiness reads, a freeze's record of who was seen,
retention. Blocking by nature: the gateway calls it from the ledger's own threads, the command line directly."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import sqlalchemy.exc
from sqlalchemy import (
    Connection,
    and_,
    case,
    create_engine,
    delete,
    distinct,
    event,
    func,
    inspect,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.sql.elements import ColumnElement

from ...config.ledger import NAME_WIDTH, database_url
from ..usage import Batch, ClientKey, TotalKey, counted, refused
from .migrations import HEAD
from .query import DAY, Query, iso
from .schema import EXAMPLE_WIDTH, RULE_WIDTH, batches, client_days, client_state, clients, totals

__all__ = ("Store", "describe_error", "sqlite_path")

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_MIGRATING = threading.Lock()
_LOCK_KEY = 0x6C656467  # pg_advisory_xact_lock: one process migrates at a time
# Alembic logs every step at INFO ("Context impl SQLiteImpl.", ...); the ledger logs one line of its own.
logging.getLogger("alembic").setLevel(logging.WARNING)


def refused_for_content(err: BaseException) -> bool:
    """Whether the database (or its driver) refused what a statement held, rather than failing to run it: a data
    error (a value too long, a character the database's encoding lacks, found by the server or by the driver
    encoding for it) or an integrity error (a constraint). An outage, a lock or a timeout is none of these."""
    return isinstance(err, (sqlalchemy.exc.DataError, sqlalchemy.exc.IntegrityError, UnicodeError))


def _fits(key: TotalKey) -> bool:
    """Whether a total's names (behaviour, tenant, decision) fit the key columns."""
    return len(key[1]) <= NAME_WIDTH and len(key[2]) <= NAME_WIDTH and len(key[3]) <= NAME_WIDTH


def _refuse(batch: Batch, requests: int, why: str) -> None:
    batch.refused += requests
    batch.refused_why = batch.refused_why or why


def describe_error(err: BaseException) -> str:
    """One line for a log or an answer: the driver's own message, never SQLAlchemy's rendering of the statement and
    its parameters (clients' User-Agents, tens of thousands of rows). Callers pass it through the config's secret
    masking before showing it."""
    orig = getattr(err, "orig", None) or err
    lines = str(orig).strip().splitlines()
    message = lines[0].strip() if lines else ""
    return f"{type(orig).__name__}: {message[:300]}" if message else type(orig).__name__


# --- the store ----------------------------------------------------------------------------------------------------


class Store:
    def __init__(self, url: str, *, timeout: float = 5.0, read_timeout: float = 60.0) -> None:
        """``timeout``: for connecting and for each write; ``read_timeout``: for a report (PostgreSQL's
        statement_timeout; SQLite's busy timeout is ``timeout``)."""
        self.timeout = timeout
        self.read_timeout = read_timeout
        parsed = make_url(database_url(url))
        sqlite_file = parsed.get_backend_name() == "sqlite"
        self.dialect: Literal["sqlite", "postgresql"] = "sqlite" if sqlite_file else "postgresql"
        # A SQLite file: the one at its path must stay the one open (``_same_file``).
        self.path = os.path.abspath(parsed.database) if sqlite_file and parsed.database else None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file the schema was made in
        self.reopened: str | None = None  # "deleted" or "replaced": the file was, and a new one opened (the ledger's)
        self.engine = _sqlite_engine(parsed, timeout) if sqlite_file else _postgres_engine(parsed, timeout)
        insert = sqlite.insert if self.dialect == "sqlite" else postgresql.insert
        t = insert(totals)
        self._upsert_totals = t.on_conflict_do_update(
            index_elements=list(totals.primary_key.columns),
            set_={"requests": totals.c.requests + t.excluded.requests,
                  "untracked": totals.c.untracked + t.excluded.untracked})
        c = insert(clients)
        self._upsert_clients = c.on_conflict_do_update(
            index_elements=list(clients.primary_key.columns),
            set_={"requests": clients.c.requests + c.excluded.requests,
                  "first_seen": case((c.excluded.first_seen < clients.c.first_seen, c.excluded.first_seen),
                                     else_=clients.c.first_seen),
                  "last_seen": case((c.excluded.last_seen > clients.c.last_seen, c.excluded.last_seen),
                                    else_=clients.c.last_seen)})
        # A batch's rows go to the driver's executemany as tuples, in chunks: SQLAlchemy's per-row parameter
        # processing would triple a large flush's Python time (the time the writer thread competes with the event
        # loop for the interpreter), and the chunks bound what is allocated at once.
        self._totals_sql = _positional(self._upsert_totals, self.engine, _TOTAL_COLUMNS)
        self._clients_sql = _positional(self._upsert_clients, self.engine, _CLIENT_COLUMNS)
        st, new = client_state.c, insert(client_state)
        later = new.excluded.last_seen >= st.last_seen

        def latest(column: str) -> Any:
            return case((later, new.excluded[column]), else_=st[column])

        def known(column: str) -> Any:  # an example or a rule: the latest one known (rows before 0002 had none)
            empty: Any = literal_column("''")
            return case((and_(new.excluded[column] != empty, or_(later, st[column] == empty)), new.excluded[column]),
                        else_=st[column])

        self._state_sql = _positional(new.on_conflict_do_update(
            index_elements=list(client_state.primary_key.columns),
            set_={"first_seen": case((new.excluded.first_seen < st.first_seen, new.excluded.first_seen),
                                     else_=st.first_seen),
                  "last_seen": case((later, new.excluded.last_seen), else_=st.last_seen),
                  "requests": st.requests + new.excluded.requests,
                  "last_decision": latest("last_decision"), "user_agent": latest("user_agent"),
                  "example": known("example"), "rule": known("rule"),
                  "last_refused": case((new.excluded.last_refused > st.last_refused, new.excluded.last_refused),
                                       else_=st.last_refused)}), self.engine, _STATE_COLUMNS)
        day = insert(client_days)
        self._days_sql = _positional(day.on_conflict_do_update(
            index_elements=list(client_days.primary_key.columns),
            set_={"requests": client_days.c.requests + day.excluded.requests,
                  "refused": client_days.c.refused + day.excluded.refused}), self.engine, _DAY_COLUMNS)
        claim = insert(batches).on_conflict_do_nothing(index_elements=[batches.c.id])
        self._claim_batch = claim.returning(batches.c.id)  # a row back: claimed now; none: written before

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _transaction(self, *, write: bool, timeout: float) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn.execution_options(ledger_write=write)
            with conn.begin():
                if self.dialect == "postgresql":
                    ms = int(timeout * 1000)
                    conn.execute(text(f"SET LOCAL statement_timeout = {ms}"))
                    conn.execute(text(f"SET LOCAL lock_timeout = {ms}"))
                yield conn

    # --- schema ---

    def migrate(self) -> tuple[str | None, str]:
        """Create or upgrade the schema to the newest revision; (the revision found, the revision now). Alembic is
        imported only when there is something to do."""
        with self._transaction(write=True, timeout=max(self.timeout, 60.0)) as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            found = _revision(conn)
            if found != HEAD:
                from alembic import command
                from alembic.config import Config

                config = Config()
                config.set_main_option("script_location", str(MIGRATIONS))
                config.attributes["connection"] = conn
                # Alembic's migration context is one module-level proxy (``alembic.context``): two ledgers of one
                # process (gateways started side by side in a test, or a reload's new one) must not migrate at once.
                with _MIGRATING:
                    command.upgrade(config, "head")
        if self.path is not None:
            status = os.stat(self.path)
            self._file = (status.st_dev, status.st_ino)
        return found, HEAD

    def _same_file(self) -> None:
        """Before a write to a SQLite file: whether the file at its path is still the one opened. An unlinked file
        takes writes without a word while `gateway usage`, a restart and a backup find nothing at the path; so when
        it was deleted (or another file put there), the connections are closed, the deleted file's leftover WAL and
        shared-memory files removed (the new file must not read them), and a new file made at the path, schema
        included, for this write; ``reopened`` says so. A file that cannot be made again fails the write, saying
        why, until it can."""
        if self.path is None:
            return
        if self._file is not None:
            lost = self._lost(self.path, self._file)
            if lost is None:
                return
            self._let_go(self.path, lost)
        try:
            self.migrate()
        except Exception as err:  # noqa: BLE001 - any driver error: the write fails, saying why
            raise RuntimeError(f"the file {self.path} was {self.reopened or 'lost'} and cannot be made again: "
                               f"{describe_error(err)}") from None

    @staticmethod
    def _lost(path: str, opened: tuple[int, int]) -> str | None:
        """What became of the file opened at ``path``: "deleted", "replaced", or None (still there)."""
        try:
            status = os.stat(path)
        except FileNotFoundError:
            return "deleted"
        return None if (status.st_dev, status.st_ino) == opened else "replaced"

    def _let_go(self, path: str, lost: str) -> None:
        """The lost file's connections closed and, when it was deleted, its leftover WAL and shared-memory files."""
        self.engine.dispose()
        if lost == "deleted":
            for leftover in (path + "-wal", path + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        self._file, self.reopened = None, lost

    def revision(self) -> str | None:
        """The schema's revision (None: no schema yet)."""
        with self._transaction(write=False, timeout=self.timeout) as conn:
            return _revision(conn)

    # --- writing ---

    def write(self, batch: Batch, now: float, *, forget: str | None = None) -> bool:
        """Add the batch's counts; False when a batch of that id was already written (nothing is added twice).
        ``forget``: the id of this process's previous batch, settled now that the next one is being written.

        Several processes may write the same hour, client and decision at once (``--workers``, replicas): each row is
        ``INSERT ... ON CONFLICT DO UPDATE SET requests = requests + excluded.requests`` (first seen the smaller, last
        seen the larger), atomic per row in both databases, so concurrent batches add up exactly. Rows go in key
        order (two PostgreSQL transactions lock shared rows in the same order and cannot deadlock); SQLite writes
        start with ``BEGIN IMMEDIATE`` (WAL mode: a writer waits up to the busy timeout instead of failing on a lock
        upgrade).

        A row the database refuses for what it holds (a value longer than its column, a character its encoding
        lacks: a data or integrity error, not an outage) does not hold the others back for ever: the batch is
        written again with each chunk of rows in a savepoint, halved until the refused rows stand alone, and those
        are left out. A refused client row's requests still count in the totals, as untracked; a refused total's
        are not kept. A name longer than its column is refused here, before the database sees it (SQLite would keep
        it). ``batch.refused`` and ``batch.refused_why`` say what was left out."""
        self._same_file()
        try:
            return self._write(batch, now, forget, careful=False)
        except Exception as err:
            if not refused_for_content(err):
                raise
        return self._write(batch, now, forget, careful=True)

    def _write(self, batch: Batch, now: float, forget: str | None, *, careful: bool) -> bool:
        batch.refused, batch.refused_why = 0, None
        totals_of = batch.totals()
        too_long = {key for key in totals_of if not _fits(key)}
        with self._transaction(write=True, timeout=self.timeout) as conn:
            if not self._claimed(conn, batch, now, forget):
                return False
            moved, left_out = self._write_clients(conn, batch, too_long, careful)
            self._write_rollups(conn, *_rollups(batch, too_long, left_out), careful)
            for key in too_long:
                _refuse(batch, totals_of[key][0], f"a name longer than the ledger's columns ({NAME_WIDTH}): "
                        f"{_too_long_names(key)}")
            self._write_totals(conn, batch, {k: totals_of[k] for k in totals_of.keys() - too_long}, moved, careful)
        return True

    def _claimed(self, conn: Connection, batch: Batch, now: float, forget: str | None) -> bool:
        """Whether the batch is claimed now (False: a write of it committed before); ``forget``, the previous batch's
        claim, is let go in the same transaction."""
        if conn.execute(self._claim_batch, {"id": batch.id, "written_at": now}).first() is None:
            return False
        if forget is not None:
            conn.execute(delete(batches).where(batches.c.id == forget))
        return True

    def _write_clients(self, conn: Connection, batch: Batch, too_long: set[TotalKey], careful: bool
                       ) -> tuple[dict[TotalKey, int], set[ClientKey]]:
        """The batch's client rows; the requests of refused ones per total (counted there as untracked), and their
        keys."""
        moved: dict[TotalKey, int] = {}
        left_out: set[ClientKey] = set()
        requests, first, last = batch.requests, batch.first_seen, batch.last_seen
        for keys in _chunks(sorted(requests)):
            rows = [(*k, requests[k], first[k], last[k]) for k in keys if (k[0], k[1], k[2], k[5]) not in too_long]
            for row, why in self._insert(conn, self._clients_sql, rows, careful):
                total = (row[0], row[1], row[2], row[5])
                moved[total] = moved.get(total, 0) + row[6]
                left_out.add(row[:6])
                _refuse(batch, row[6], why)
        return moved, left_out

    def _write_rollups(self, conn: Connection, state: dict[Any, tuple[Any, ...]], days: dict[Any, tuple[int, int]],
                       careful: bool) -> None:
        # A rollup row the database refuses is left out without a word more: its requests are in the hourly
        # rows written before (and refused with them there, counted).
        for sql, rollup in ((self._state_sql, state), (self._days_sql, days)):
            for keys in _chunks(sorted(rollup)):
                for _ in self._insert(conn, sql, [(*k, *rollup[k]) for k in keys], careful):
                    pass

    def _write_totals(self, conn: Connection, batch: Batch, totals_of: dict[TotalKey, tuple[int, int]],
                      moved: dict[TotalKey, int], careful: bool) -> None:
        for keys in _chunks(sorted(totals_of)):
            rows = [(*k, totals_of[k][0], totals_of[k][1] + moved.get(k, 0)) for k in keys]
            for row, why in self._insert(conn, self._totals_sql, rows, careful):
                _refuse(batch, row[4] - moved.get((row[0], row[1], row[2], row[3]), 0), why)

    def _insert(self, conn: Connection, sql: str, rows: list[tuple[Any, ...]], careful: bool
                ) -> Iterator[tuple[tuple[Any, ...], str]]:
        """Upsert ``rows`` (``executemany``). ``careful``: in a savepoint, halved on a refusal for content until the
        refused rows stand alone; yields each refused row and the database's reason."""
        if not rows:
            return
        if not careful:
            conn.exec_driver_sql(sql, rows)
            return
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(sql, rows)
        except Exception as err:
            if not refused_for_content(err):
                raise
            if len(rows) == 1:
                yield rows[0], describe_error(err)
                return
            half = len(rows) // 2
            yield from self._insert(conn, sql, rows[:half], careful)
            yield from self._insert(conn, sql, rows[half:], careful)

    def prune(self, before: int, batches_before: float) -> int:
        """Delete the hours before ``before`` (retention) and batch ids written before ``batches_before``; the
        number of rows deleted."""
        with self._transaction(write=True, timeout=max(self.timeout, 60.0)) as conn:
            deleted = conn.execute(delete(clients).where(clients.c.bucket < before)).rowcount
            deleted += conn.execute(delete(totals).where(totals.c.bucket < before)).rowcount
            deleted += conn.execute(delete(client_days).where(client_days.c.day <= before - DAY)).rowcount
            deleted += conn.execute(delete(client_state).where(client_state.c.last_seen < before)).rowcount
            conn.execute(delete(batches).where(batches.c.written_at < batches_before))
        return int(deleted)

    # --- reading ---

    def report(self, query: Query) -> dict[str, Any]:
        """Per behaviour over the query's hours: requests by decision and by tenant, requests of untracked clients,
        how many clients (token fingerprints) and User-Agent variants (a client with one User-Agent in one company)
        there were, and the variants (``top`` of them per behaviour, most requests or most recently seen first),
        each with its requests, decisions, first and last seen.

        The database does the work: it groups, orders and cuts to ``top``, so that what leaves it (and what this
        process holds) is the top rows per behaviour, never every client of the window. Each row's decisions are
        summed beside it, one column per decision the behaviour's totals name: one pass over the window's rows, no
        second lookup per row."""
        c = clients.c
        c_where = _filters(c, query)
        variants = (select(c.behaviour, c.client).where(c_where)
                    .group_by(c.behaviour, c.tenant, c.client, c.user_agent).subquery("variants"))
        v = variants.c
        requests, last_seen = func.sum(c.requests), func.max(c.last_seen)
        first = [last_seen.desc(), requests.desc()] if query.order == "recent" else [requests.desc(), last_seen.desc()]
        with self._transaction(write=False, timeout=self.read_timeout) as conn:
            total_rows = conn.execute(
                select(totals.c.behaviour, totals.c.tenant, totals.c.decision, func.sum(totals.c.requests),
                       func.sum(totals.c.untracked))
                .where(_filters(totals.c, query))
                .group_by(totals.c.behaviour, totals.c.tenant, totals.c.decision)).all()
            counts = conn.execute(
                select(v.behaviour, func.count(), func.count(distinct(v.client))).group_by(v.behaviour)).all()
            top_rows: list[tuple[str, Sequence[str], Sequence[Any]]] = []
            for behaviour, names in sorted(_decisions(total_rows).items()):
                statement = (
                    select(c.tenant, c.client, c.user_agent, requests, func.min(c.first_seen), last_seen,
                           *(func.sum(case((c.decision == name, c.requests), else_=0)) for name in names))
                    .where(c_where, c.behaviour == behaviour)
                    .group_by(c.tenant, c.client, c.user_agent)
                    .order_by(*first, c.tenant, c.client, c.user_agent))
                if query.top is not None:
                    statement = statement.limit(query.top)
                top_rows += [(behaviour, names, row) for row in conn.execute(statement)]
        return fold_report(query, total_rows, counts, top_rows)

    def daily(self, since: int, until: int, tenants: frozenset[str] | None = None) -> list[tuple[str, str, int, int]]:
        """(tenant, behaviour, day, requests): every request per UTC day (``day``: its midnight, Unix seconds), of
        ``tenants`` only when given."""
        # The day's length inline: as two bound parameters, PostgreSQL could not tell the grouped expression is the
        # selected one.
        day = (totals.c.bucket - totals.c.bucket % literal_column(str(DAY))).label("day")
        where = [totals.c.bucket >= since, totals.c.bucket < until]
        if tenants is not None:
            where.append(totals.c.tenant.in_(sorted(tenants)))
        with self._transaction(write=False, timeout=self.read_timeout) as conn:
            rows = conn.execute(
                select(totals.c.tenant, totals.c.behaviour, day, func.sum(totals.c.requests))
                .where(*where)
                .group_by(totals.c.tenant, totals.c.behaviour, day)
                .order_by(totals.c.tenant, totals.c.behaviour, day)).all()
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]


    def readiness(self, since: float, days_from: int, tenant: str | None = None, behaviour: str | None = None,
                  client: str | None = None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Each client (per company and behaviour) seen since ``since``: its state row (tenant, client, behaviour,
        first and last seen, requests, last decision, User-Agent, example, rule, last refused); and its trend from
        the UTC day ``days_from`` (tenant, client, behaviour, requests in the 7 days from ``days_from + 7 days``,
        in the 7 before, refusals in the 7 last), summed by the database. A row per client each: tens of thousands
        for a fleet's 10,000 clients, never its hourly rows nor its days."""
        st, cd = client_state.c, client_days.c
        split: Any = literal_column(str(int(days_from) + 7 * DAY))
        state_where = [st.last_seen >= since]
        days_where = [cd.day >= days_from]
        for value, columns in ((tenant, (st.tenant, cd.tenant)), (behaviour, (st.behaviour, cd.behaviour)),
                               (client, (st.client, cd.client))):
            if value is not None:
                state_where.append(columns[0] == value)
                days_where.append(columns[1] == value)
        with self._transaction(write=False, timeout=self.read_timeout) as conn:
            state = conn.execute(
                select(st.tenant, st.client, st.behaviour, st.first_seen, st.last_seen, st.requests, st.last_decision,
                       st.user_agent, st.example, st.rule, st.last_refused).where(*state_where)).all()
            recent = cd.day >= split
            days = conn.execute(
                select(cd.tenant, cd.client, cd.behaviour, func.sum(case((recent, cd.requests), else_=0)),
                       func.sum(case((recent, literal_column("0")), else_=cd.requests)),
                       func.sum(case((recent, cd.refused), else_=0)))
                .where(*days_where).group_by(cd.tenant, cd.client, cd.behaviour)).all()
        return [tuple(row) for row in state], [tuple(row) for row in days]

    def seen_before(self, instants: Sequence[tuple[str, float]]) -> dict[tuple[str, float], list[tuple[str, str]]]:
        """For each (behaviour, instant): the (tenant, client) first seen on it before the instant (a freeze's
        record of who is not new)."""
        st = client_state.c
        found: dict[tuple[str, float], list[tuple[str, str]]] = {}
        with self._transaction(write=False, timeout=self.read_timeout) as conn:
            for behaviour, at in instants:
                rows = conn.execute(select(st.tenant, st.client)
                                    .where(st.behaviour == behaviour, st.first_seen < at)).all()
                found[(behaviour, at)] = [(str(tenant), str(client)) for tenant, client in rows]
        return found


# Kinds of the calendar, which the bridge's own decision overrides as the rule (``usage.rule_of``).
_CALENDAR_RULES = frozenset({"default", "setting", "date", "override"})


def _bridged(decision: str) -> bool:
    """Whether a decision shows the behaviour's bridge acted: the upload upgrade's outcomes, the card backfill's."""
    return decision.startswith("upgrade") or decision.endswith((":backfilled", ":backfill_failed"))


def _sqlite_engine(parsed: URL, timeout: float) -> Engine:
    engine = create_engine(parsed, connect_args={"timeout": timeout, "check_same_thread": False})
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _postgres_engine(parsed: URL, timeout: float) -> Engine:
    connect_args: dict[str, Any] = {
        "connect_timeout": max(1, math.ceil(timeout)),
        # A connection whose peer vanished (a blackholed database) fails after this, not after TCP's
        # retransmissions (minutes).
        "tcp_user_timeout": int(timeout * 1000),
        "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
    }
    if "application_name" not in parsed.query:
        connect_args["application_name"] = "deprecation-gateway"
    # Two threads use it (writes, reads): a connection each, checked before use (the database may have
    # restarted since the last write). Positional parameters (%s): the batches' rows are sent as tuples.
    return create_engine(parsed, pool_size=2, max_overflow=0, pool_timeout=timeout, pool_pre_ping=True,
                         pool_recycle=3600, connect_args=connect_args, paramstyle="format")


def _decisions(total_rows: Sequence[Sequence[Any]]) -> dict[str, list[str]]:
    """Per behaviour, the decisions its totals name, in their first order."""
    decisions: dict[str, list[str]] = {}
    for behaviour, _, decision, _, _ in total_rows:
        if decision not in decisions.setdefault(behaviour, []):
            decisions[behaviour].append(decision)
    return decisions


def _too_long_names(key: TotalKey) -> str:
    """The names of a totals row that its columns cannot hold, cut for the message."""
    return ", ".join(repr(name[:80]) for name in key[1:] if len(name) > NAME_WIDTH)


def _rollups(batch: Batch, too_long: set[TotalKey], left_out: set[ClientKey]
             ) -> tuple[dict[tuple[str, str, str], tuple[Any, ...]], dict[tuple[int, str, str, str], tuple[int, int]]]:
    """The batch's client rows written, rolled up: per company, client and behaviour its state (first and last seen,
    requests, the latest decision and User-Agent, its example call and rule, when it was last refused); and per UTC
    day its requests and refusals. A decision that is no deprecated call (``usage.counted``) is left out of both."""
    state: dict[tuple[str, str, str], list[Any]] = {}
    days: dict[tuple[int, str, str, str], list[int]] = {}
    for key, n in batch.requests.items():
        hour, behaviour, tenant, client, _agent, decision = key
        if not counted(decision) or (hour, behaviour, tenant, decision) in too_long or key in left_out:
            continue
        no = refused(decision)
        _roll_state(state, key, n, batch.first_seen[key], batch.last_seen[key], no)
        _roll_day(days, key, n, no)
    out = {who: _state_row(batch, who, *row) for who, row in state.items()}
    return out, {key: (n, no) for key, (n, no) in days.items()}


def _roll_day(days: dict[tuple[int, str, str, str], list[int]], key: ClientKey, n: int, no: bool) -> None:
    """One client row into its client's UTC day: ``[requests, refused]``."""
    hour, behaviour, tenant, client, _agent, _decision = key
    day = days.setdefault((hour - hour % DAY, tenant, client, behaviour), [0, 0])
    day[0] += n
    day[1] += n if no else 0


def _roll_state(state: dict[tuple[str, str, str], list[Any]], key: ClientKey, n: int, first: float, seen: float,
                no: bool) -> None:
    """One client row into its client's state: ``[first_seen, last_seen, requests, decision, agent, last_refused]``."""
    _hour, behaviour, tenant, client, agent, decision = key
    row = state.get((tenant, client, behaviour))
    if row is None:
        state[(tenant, client, behaviour)] = [first, seen, n, decision, agent, seen if no else 0.0]
        return
    row[0] = min(row[0], first)
    row[2] += n
    if seen > row[1]:
        row[1], row[3], row[4] = seen, decision, agent
    if no and seen > row[5]:
        row[5] = seen


def _state_row(batch: Batch, who: tuple[str, str, str], first_seen: float, last_seen: float, n: int, decision: str,
               agent: str, last_refused: float) -> tuple[Any, ...]:
    """A client's state row, with its rule (``bridge`` when the bridge acted under the calendar) and example call."""
    tenant, client, behaviour = who
    rule = batch.rules.get((behaviour, tenant, client), "")
    if rule in _CALENDAR_RULES and _bridged(decision):
        rule = "bridge"
    example = batch.examples.get((behaviour, tenant, client), "")
    return (first_seen, last_seen, n, decision, agent, example[:EXAMPLE_WIDTH], rule[:RULE_WIDTH], last_refused)


_TOTAL_COLUMNS = ("bucket", "behaviour", "tenant", "decision", "requests", "untracked")
_CLIENT_COLUMNS = ("bucket", "behaviour", "tenant", "client", "user_agent", "decision", "requests", "first_seen",
                   "last_seen")
_STATE_COLUMNS = ("tenant", "client", "behaviour", "first_seen", "last_seen", "requests", "last_decision",
                  "user_agent", "example", "rule", "last_refused")
_DAY_COLUMNS = ("day", "tenant", "client", "behaviour", "requests", "refused")
_CHUNK = 5000


def _positional(statement: Any, engine: Any, columns: tuple[str, ...]) -> str:
    """The statement's SQL for the engine's dialect, its parameters positional in the order of ``columns``."""
    compiled = statement.compile(dialect=engine.dialect)
    assert tuple(compiled.positiontup or ()) == columns, compiled.positiontup
    return str(compiled)


def _chunks(keys: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start:start + _CHUNK]


def _filters(columns: Any, query: Query) -> ColumnElement[bool]:
    conditions = [columns.bucket >= query.since, columns.bucket < query.until]
    if query.tenant is not None:
        conditions.append(columns.tenant == query.tenant)
    if query.behaviour is not None:
        conditions.append(columns.behaviour == query.behaviour)
    return and_(*conditions)


def fold_report(query: Query, total_rows: Sequence[Sequence[Any]] = (), counts: Sequence[Sequence[Any]] = (),
                top_rows: Sequence[tuple[str, Sequence[str], Sequence[Any]]] = ()) -> dict[str, Any]:
    """The report's shape from what ``Store.report`` read: the totals per behaviour, tenant and decision; per
    behaviour, its User-Agent variants and distinct clients; the top variants in order, each with its behaviour,
    the decisions its last columns count, and its row (tenant, client, user agent, requests, first seen, last seen,
    then one count per decision). With no rows: the empty report."""
    behaviours: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        found = behaviours.get(name)
        if found is None:
            found = behaviours[name] = {"requests": 0, "by_decision": {}, "by_tenant": {},
                                        "untracked_clients_requests": 0, "clients": 0, "variants": 0,
                                        "top_clients": []}
        return found

    for behaviour, tenant, decision, requests, untracked in total_rows:
        _add_total(entry(behaviour), tenant, decision, int(requests), int(untracked))
    for behaviour, variants, distinct_clients in counts:
        e = entry(behaviour)
        e["variants"], e["clients"] = int(variants), int(distinct_clients)
    for behaviour, names, row in top_rows:
        entry(behaviour)["top_clients"].append(_top_client(names, row))
    for e in behaviours.values():
        _order_counts(e)
    return {"since": iso(query.since), "until": iso(query.until), "order": query.order,
            "behaviours": dict(sorted(behaviours.items()))}


def _order_counts(entry: dict[str, Any]) -> None:
    """A behaviour's counts by decision, and its tenants' (tenants by name), the largest first."""
    entry["by_decision"] = _by_count(entry["by_decision"])
    entry["by_tenant"] = {tenant: _by_count(d) for tenant, d in sorted(entry["by_tenant"].items())}


def _add_total(entry: dict[str, Any], tenant: str, decision: str, requests: int, untracked: int) -> None:
    entry["requests"] += requests
    entry["by_decision"][decision] = entry["by_decision"].get(decision, 0) + requests
    per = entry["by_tenant"].setdefault(tenant, {})
    per[decision] = per.get(decision, 0) + requests
    entry["untracked_clients_requests"] += untracked


def _top_client(names: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    """A row of the top variants: tenant, client, user agent, requests, first and last seen, a count per decision
    of ``names`` (the ones that are not 0 kept)."""
    tenant, client, agent, requests, first, last, *per_decision = row
    decisions = {name: int(n) for name, n in zip(names, per_decision, strict=True) if n}
    return {"tenant": tenant, "client": client or None, "user_agent": agent or None, "requests": int(requests),
            "decisions": _by_count(decisions), "first_seen": round(float(first), 3),
            "last_seen": round(float(last), 3)}


def _by_count(counts: dict[str, int]) -> dict[str, int]:
    """Counts by name, the largest first (then by name)."""
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _revision(conn: Connection) -> str | None:
    """The revision Alembic recorded (its alembic_version table), read without importing Alembic."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


# --- SQLite: transactions started by us (pysqlite's own are deferred, and it starts none before a SELECT) ----------


def _sqlite_connect(dbapi_connection: Any, record: Any) -> None:
    dbapi_connection.isolation_level = None  # sqlite3 emits no BEGIN of its own; _sqlite_begin does
    cursor = dbapi_connection.cursor()
    try:
        # WAL: readers never block the writer, and several processes' writers take turns (busy timeout).
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # A writer takes the write lock at once: a deferred transaction that reads and then writes fails at once
    # (SQLITE_BUSY, no waiting) when another process wrote in between.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("ledger_write") else "BEGIN")


def sqlite_path(url: str) -> str | None:
    """The file a SQLite URL names (None for another database, ``:memory:`` for ``sqlite://``)."""
    parsed = make_url(database_url(url))
    if parsed.get_backend_name() != "sqlite":
        return None
    return parsed.database or ":memory:"

