"""The usage ledger in a running gateway: writes what the usage counter holds to the database in the background (its
own thread, never on a request's path), and answers the admin endpoints' reads (a second thread). A database slow or
down costs the record, never a request: the batch stays in the counter and is sent again after a backoff
(docs/operations.md, "The usage ledger"; docs/configuration.md, ``usage.ledger``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ...config.ledger import LedgerConfig
from ..gc_pauses import freeze_startup
from ..usage import HOUR, Batch, UsageCounter

if TYPE_CHECKING:
    from .query import Query
    from .store import Store

__all__ = ("Ledger", "LedgerFamilies", "LedgerUnavailable")

log = logging.getLogger("gateway.ledger")

T = TypeVar("T")

_BACKOFF_CAP = 60.0
_PRUNE_EVERY = HOUR
_BATCH_IDS_KEPT = 7 * 86400  # ids of batches of processes that have gone
_READ_TIMEOUT = 30.0
_METRICS_EVERY = 1.0  # seconds between updates of the pending gauge while no write runs
_REFUSALS_SAID = 10  # distinct reasons for refused rows logged, at most (then the metric alone counts them)
_READS_KEPT = 32  # answers kept for identical reads (``Ledger._shared``)


async def _returned_well(busy: asyncio.Future[Any], timeout: float) -> bool:
    """Whether a write that outlived its timeout returned, within ``timeout`` more, without an error."""
    if not busy.done():
        await asyncio.wait({busy}, timeout=timeout)
    return busy.done() and not busy.cancelled() and busy.exception() is None


class LedgerUnavailable(Exception):
    """The ledger could not answer: its database unreachable, failing, or too slow. The message is safe to show."""


class LedgerFamilies:
    """The ledger's metric families (registered once per registry, through ``Metrics.families``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # With --workers: the smallest over the live workers (0 if any worker cannot write).
        self.up = Gauge("gateway_usage_ledger_up", "1 when the usage ledger's last write succeeded; 0 while its "
                        "writes fail, and before its first.", registry=registry, multiprocess_mode="livemin")
        self.flushes = Counter("gateway_usage_ledger_flushes", "Writes of counted usage to the ledger's database, by "
                               "result (success, failure).", ("result",), registry=registry)
        for result in ("success", "failure"):
            self.flushes.labels(result)
        self.flush_duration = Histogram(
            "gateway_usage_ledger_flush_duration_seconds", "Time one successful write of the ledger took.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=registry)
        self.pending = Gauge("gateway_usage_ledger_pending_requests", "Requests counted in memory and not yet "
                             "written to the ledger.", registry=registry, multiprocess_mode="livesum")
        self.dropped = Counter(
            "gateway_usage_ledger_dropped_requests", "Requests counted but not kept, by reason: memory (the bound on "
            "what is held while the database cannot be written was reached), shutdown (not written before the "
            "process exited), refused (their rows refused by the database for what they hold: a client row's "
            "requests still count in the totals, as untracked).", ("reason",), registry=registry)
        for reason in ("memory", "shutdown", "refused"):
            self.dropped.labels(reason)
        self.reopened = Counter(
            "gateway_usage_ledger_reopened", "Times the ledger's SQLite file was found deleted or replaced while in "
            "use, and a new one made at its path (what was written before is not in it).", registry=registry)


class _Failure(Exception):
    pass


class _Read:
    """A read in progress or answered, for the identical reads that follow (``Ledger._shared``)."""

    __slots__ = ("task", "mark", "at")

    def __init__(self, mark: tuple[int, int]) -> None:
        self.task: asyncio.Task[Any]
        self.mark = mark  # the usage counter's mark once this process's counts were written for it
        self.at = float("inf")  # when it was answered (monotonic)


class _Worker:
    """One daemon thread that runs calls in order; each call's outcome arrives on an asyncio future."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        # A call that outlives its caller's patience still ends: its error must not be reported as never retrieved.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queue.put((fn, future, loop))
        return future

    def stop(self, wait: float) -> bool:
        """Let the thread end after what it is doing; True if it did within ``wait`` seconds."""
        self._queue.put(None)
        self._thread.join(wait)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future, loop = item
            if future.done():  # its caller gave up before it started
                continue
            try:
                result = fn()
            except BaseException as err:  # noqa: BLE001 - handed to the caller, whatever it is
                _deliver(loop, future, None, err)
            else:
                _deliver(loop, future, result, None)


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
             error: BaseException | None) -> None:
    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop has closed: nobody waits any more
        pass


class Ledger:
    def __init__(
        self,
        options: LedgerConfig,
        counter: UsageCounter,
        *,
        redact: Callable[[str], str],
        families: LedgerFamilies,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``redact``: the config's secret masking (``Secrets.redact``), through which the URL and every database
        error pass before they are shown anywhere."""
        self.options = options
        self.counter = counter
        self._redact = redact
        self.shown_url = redact(options.url)
        self.families = families
        self._clock = clock
        self._store: Store | None = None
        self._writer: _Worker | None = None
        self._reader: _Worker | None = None
        self._busy: asyncio.Future[Any] | None = None  # a write that outlived its timeout, still running
        self._busy_batch: Batch | None = None  # the batch it writes
        self._lost = {"refused": 0, "shutdown": 0}  # requests counted and not kept, besides the memory bound's
        self._refusals_said: set[str] = set()
        self.refused_why: str | None = None  # why the database last refused rows
        self.notice: str | None = None  # what the status page says of the file itself (made again at its path)
        self._reads: dict[tuple[Any, ...], _Read] = {}
        self._lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._schema: str | None = None
        self._next_prune = 0.0
        self._last_batch: str | None = None
        self._failures = 0
        self._dropped_seen = 0
        self._full = False
        self.state = "starting"  # starting | ok | failing | closed
        self.error: str | None = None
        self.since = clock()  # when the state began
        self.last_written: float | None = None

    # --- life ---

    async def start(self) -> None:
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._writer = _Worker("usage-ledger-write")
        # An in-memory SQLite database lives in one connection: reads go to the same thread.
        self._reader = self._writer if self.options.url.rstrip("/").lower() in ("sqlite:", "sqlite+pysqlite:") \
            else _Worker("usage-ledger-read")
        self.families.up.set(0)
        self._task = asyncio.create_task(self._run(), name="usage-ledger")

    async def close(self) -> None:
        """The last write (within ``flush_timeout`` + 1 s), then the threads stop. What could not be written is
        counted as dropped and said in one log line; what was in a write that had not answered by then, in another
        (it may yet commit)."""
        if self._task is None or self._closing:
            return
        self._closing = True
        assert self._wake is not None
        self._wake.set()
        written = await self._last_write(self.options.flush_timeout + 1)
        if not written and self.counter.pending:
            self._give_up()
        self._sync_metrics()
        self.state = "closed"
        self._stop_threads()

    async def _last_write(self, budget: float) -> bool:
        """The background write in progress, then the last one, each within ``budget``; True when nothing is left
        unwritten."""
        # The background write in progress (a migration or a retention prune may take up to a minute): waited for
        # within the same budget as the last write, so that a stop is bounded by about twice flush_timeout.
        assert self._task is not None
        done, _ = await asyncio.wait({self._task}, timeout=budget)
        deadline = asyncio.get_running_loop().time() + budget
        written = False
        if not done:  # the writer thread is still inside that call: a last write would only queue behind it
            await self._give_up_write(budget)
        else:
            with contextlib.suppress(TimeoutError):
                written = await asyncio.wait_for(self.flush(prune=False), budget)
        return written or await self._settle_last_write(deadline)

    async def _give_up_write(self, budget: float) -> None:
        """The background task stopped while its write is still running in the writer's thread, and said."""
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.error = self.error or f"a write still running after {budget:g}s at exit"

    def _stop_threads(self) -> None:
        """The writer and reader threads stopped (1 s each), then the store closed unless one is still inside a
        call (its engine left alone: a daemon thread ends with the process)."""
        store, self._store = self._store, None
        for worker in {id(w): w for w in (self._writer, self._reader) if w is not None}.values():
            if not worker.stop(1.0):
                store = None
        if store is not None:
            store.close()

    async def _settle_last_write(self, deadline: float) -> bool:
        """A write that outlived its timeout (the last one, or the one before it, which the last one had to wait
        for): its outcome, waited for until ``deadline`` (the loop's time). If it committed, its batch is let go and
        what was counted since gets one more write; True when nothing is left unwritten."""
        busy, batch = self._busy, self._busy_batch
        if busy is None or batch is None:
            return False
        loop = asyncio.get_running_loop()
        if not await _returned_well(busy, max(0.0, deadline - loop.time())):
            return False
        self._busy = self._busy_batch = None
        self._let_go(batch)
        if not self.counter.pending:
            return True
        try:
            return await asyncio.wait_for(self.flush(prune=False), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return False

    def _give_up(self) -> None:
        """At exit, what is held: lost, counted and said, except a write's that has not answered (it may commit)."""
        busy, batch = self._busy, self._busy_batch
        unknown = batch.count if busy is not None and not busy.done() and batch is not None else 0
        lost = self.counter.discard() - unknown
        if unknown:
            log.warning("usage ledger %s: %d counted request(s) were in a write that had not answered at exit: they "
                        "are in the database if it commits", self.shown_url, unknown)
        if lost:
            self._lost_at_exit(lost)

    def _lost_at_exit(self, lost: int) -> None:
        self._lost["shutdown"] += lost
        self.families.dropped.labels("shutdown").inc(lost)
        log.error("usage ledger %s: %d counted request(s) could not be written before exit (%s)", self.shown_url,
                  lost, self.error or "no answer in time")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.0
        while not self._closing:
            await self._sleep(loop.time() + delay)
            if self._closing:
                return
            delay = self._delay(await self.flush())

    async def _sleep(self, deadline: float) -> None:
        """Until ``deadline`` (the loop's time) or a wake-up; the metrics show what is held at every moment, not only
        at each attempt (a backoff may last a minute)."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while not self._wake.is_set() and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), min(left, _METRICS_EVERY))
            except TimeoutError:
                self._sync_metrics()

    def _delay(self, ok: bool) -> float:
        """Until the next write: flush_interval after a success, else a backoff with jitter."""
        if ok:
            return self.options.flush_interval
        base = min(1.0, self.options.flush_interval)
        delay: float = min(_BACKOFF_CAP, base * 2 ** min(self._failures - 1, 16)) * random.uniform(0.8, 1.2)
        return delay

    # --- writing ---

    async def flush(self, *, prune: bool = True) -> bool:
        """Write what is held now (after the flush in progress, if any); True when nothing is left unwritten.
        ``prune``: apply retention first when it is due (not in the last write, which has only flush_timeout)."""
        assert self._lock is not None
        async with self._lock:
            try:
                await self._write(prune)
            except _Failure as err:
                self._failed(str(err))
                return False
            finally:
                self._sync_metrics()
            self._succeeded()
            return True

    async def _write(self, prune: bool) -> None:
        options = self.options
        if self._schema is None:
            self._schema = await self._call(self._migrate, max(options.flush_timeout, 60.0))
        store = self._store
        assert store is not None
        now = self._clock()
        if prune and now >= self._next_prune:
            await self._prune(store, now)
        batch = self.counter.take()
        if batch is None:
            return
        started = time.monotonic()
        await self._call(functools.partial(store.write, batch, now, forget=self._last_batch), options.flush_timeout,
                         batch=batch)
        self._let_go(batch)
        self.families.flushes.labels("success").inc()
        self.families.flush_duration.observe(time.monotonic() - started)
        self._written(batch, store)

    def _let_go(self, batch: Batch) -> None:
        """A batch committed: its counts leave the counter, and the next write forgets its claim."""
        self.counter.written(batch)
        self._last_batch = batch.id
        self.last_written = self._clock()

    async def _prune(self, store: Store, now: float) -> None:
        """Retention: the hours before ``retention_days`` and the batch ids kept to tell a write that committed."""
        before = int(now - self.options.retention_days * 86400) // HOUR * HOUR
        await self._call(functools.partial(store.prune, before, now - _BATCH_IDS_KEPT),
                         max(self.options.flush_timeout, 60.0))
        self._next_prune = now + _PRUNE_EVERY

    def _written(self, batch: Batch, store: Store) -> None:
        """What a write that committed may have to say: rows the database refused, a SQLite file made anew."""
        if batch.refused:
            self._refused(batch.refused, self._redact(batch.refused_why or "no reason given"))
        if store.reopened is not None:
            self._reopened(store.reopened)
            store.reopened = None

    def _reopened(self, lost: str) -> None:
        """The SQLite file was deleted (or replaced) while in use, and this write made a new one at its path."""
        at = self._clock()
        self.notice = (f"the file was {lost} while in use; a new one was made at its path at "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(at))}: what was written before is not in "
                       "it")
        self.families.reopened.inc()
        log.error("usage ledger %s: %s (the counts held since the last write are)", self.shown_url, self.notice)

    def _refused(self, requests: int, why: str) -> None:
        """Rows the database refused for what they hold, left out of a write that kept the rest: counted, and said
        once per reason (a client that keeps sending what cannot be stored would say it every flush)."""
        self._lost["refused"] += requests
        self.refused_why = why
        self.families.dropped.labels("refused").inc(requests)
        if why not in self._refusals_said and len(self._refusals_said) < _REFUSALS_SAID:
            self._refusals_said.add(why)
            log.error("usage ledger %s: the database refused the rows of %d counted request(s), left out of a write "
                      "that kept the rest (%s)", self.shown_url, requests, why)

    def _migrate(self) -> str:
        """In the writer thread: the engine (SQLAlchemy is imported here, off the event loop and after start-up),
        then the schema."""
        if self._store is None:
            from .store import Store

            self._store = Store(self.options.url, timeout=self.options.flush_timeout, read_timeout=_READ_TIMEOUT)
            # SQLAlchemy's and the driver's modules are here for the process's life: out of the collector's sight
            # like the start-up's (``gateway.cli.freeze_startup``), or each full collection walks them while holding
            # the GIL. Now, not after the first migration: the database may be down for a long while.
            freeze_startup(full=False)
        found, head = self._store.migrate()
        if found != head:
            log.info("usage ledger %s: schema %s (was %s)", self.shown_url, head, found or "empty")
            freeze_startup(full=False)  # Alembic's modules, which the migration loaded
        return head

    async def _call(self, fn: Callable[[], T], timeout: float, *, read: bool = False, batch: Batch | None = None) -> T:
        """``fn`` in the reader's or the writer's thread, within ``timeout``. A write that outlives it goes on in its
        thread (``_busy``, with ``batch`` if it writes one): no other write starts before it has returned."""
        worker = self._reader if read else self._writer
        assert worker is not None
        if not read and self._writing():
            raise _Failure("the previous write has not returned yet")
        future = worker.submit(fn)
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout)
        except asyncio.CancelledError:
            self._abandon(future, read, batch)
            raise
        if not done:
            self._abandon(future, read, batch)
            raise _Failure(f"no answer within {timeout:g}s")
        error = future.exception()
        if error is not None:
            self._raise_for(error)
        return future.result()

    async def _flush_quietly(self) -> None:
        """A flush before a read, so that it sees what was counted; one that takes too long is not waited for."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), self.options.flush_timeout + 1)

    def _writing(self) -> bool:
        """Whether a write that outlived its timeout is still running in the writer's thread."""
        return self._busy is not None and not self._busy.done()

    def _raise_for(self, error: BaseException) -> NoReturn:
        """A call's error as a _Failure in one redacted line (a BaseException that is no Exception as it is)."""
        if not isinstance(error, Exception):
            raise error
        from .store import describe_error

        raise _Failure(self._redact(describe_error(error))) from None

    def _abandon(self, future: asyncio.Future[Any], read: bool, batch: Batch | None) -> None:
        if read:
            future.cancel()  # (a read not started yet is skipped; one running ends on its own)
        else:
            self._busy, self._busy_batch = future, batch

    def _failed(self, error: str) -> None:
        self._failures += 1
        self.error = error
        self.families.flushes.labels("failure").inc()
        self.families.up.set(0)
        if self.state != "failing":
            log.warning("usage ledger %s: cannot write (%s); counting in memory (%d request(s) held), retrying with "
                        "backoff", self.shown_url, error, self.counter.pending)
            self.state = "failing"
            self.since = self._clock()

    def _succeeded(self) -> None:
        if self.state == "failing":
            log.info("usage ledger %s: writing again after %.0fs of failures; what was held is written",
                     self.shown_url, self._clock() - self.since)
        if self.state != "ok":
            self.state = "ok"
            self.since = self._clock()
        self._failures = 0
        self.error = None
        self.families.up.set(1)

    def _sync_metrics(self) -> None:
        counter = self.counter
        dropped = counter.dropped - self._dropped_seen
        self.families.pending.set(counter.pending)
        if dropped > 0:
            self.families.dropped.labels("memory").inc(dropped)
            if not self._full:
                log.error("usage ledger %s: the memory bound (usage.ledger.max_pending_clients) is reached while the "
                          "database cannot be written: requests are no longer kept", self.shown_url)
        self._full = dropped > 0
        self._dropped_seen = counter.dropped

    # --- reading ---

    async def report(self, query: Query, *, fresh: float = 0.0) -> dict[str, Any]:
        """The report over the query's window, this process's counts written first (a read right after a request
        sees it; other processes' counts arrive within their flush_interval). LedgerUnavailable when it cannot.
        ``fresh``: how old an identical read's answer may be to be given again (``_shared``)."""
        return await self._shared(("report", query), lambda store: store.report(query), fresh)

    async def daily(self, since: int, until: int, *, tenants: frozenset[str] | None = None, fresh: float = 0.0
                    ) -> list[tuple[str, str, int, int]]:
        """``Store.daily``; ``tenants``: only theirs (the status page's companies), None: every tenant's."""
        return await self._shared(("daily", since, until, tenants), lambda store: store.daily(since, until, tenants),
                                  fresh)

    async def readiness(self, fold: Callable[[list[tuple[Any, ...]], list[tuple[Any, ...]]], T], *, since: float,
                        days_from: int, tenant: str | None = None, behaviour: str | None = None,
                        client: str | None = None, share: tuple[Any, ...] = (), fresh: float = 0.0,
                        flush: bool = True) -> T:
        """The clients' rollups since ``since`` (and their days from ``days_from``), handed to ``fold`` in the
        reader thread (``readiness.build`` and what it cuts: the answer, never the rows, comes back to the loop).
        Reads with the same window, filters and ``share`` (what tells the callers' folds apart) share one query.
        ``flush``: this process's counts written first (not when a read of the same answer just wrote them)."""
        key = ("readiness", since, days_from, tenant, behaviour, client, *share)
        return await self._shared(
            key, lambda store: fold(*store.readiness(since, days_from, tenant, behaviour, client)), fresh, flush=flush)

    async def seen_before(self,
                          instants: Sequence[tuple[str, float]]) -> dict[tuple[str, float], list[tuple[str, str]]]:
        """A freeze's record: per (behaviour, instant), the (tenant, client) first seen before it, fleet-wide (what
        this process counted is not written first: the record learns it as it counts it)."""
        return await self._shared(("seen_before", tuple(instants)), lambda store: store.seen_before(instants), 0.0,
                                  flush=False)

    async def _shared(self, key: tuple[Any, ...], read: Callable[[Store], T], fresh: float, *,
                      flush: bool = True) -> T:
        """Identical reads share one query: a read that arrives while another is running waits for its answer, and
        one within ``fresh`` seconds of an answer gets it again as long as this process has counted nothing since
        (so a read right after a request still sees it). Three status pages cost one query, not three."""
        found = self._reads.get(key)
        if found is not None and self._shares(found, fresh):
            result: T = await asyncio.shield(found.task)
            return result
        if len(self._reads) >= _READS_KEPT:
            self._forget_answered()
        entry = _Read(self.counter.mark)
        entry.task = asyncio.create_task(self._read(read, entry, flush), name="usage-ledger-read")
        if len(self._reads) < _READS_KEPT:
            self._reads[key] = entry
        entry.task.add_done_callback(functools.partial(self._read_done, key))
        return await asyncio.shield(entry.task)

    def _shares(self, found: _Read, fresh: float) -> bool:
        """Whether a read may have ``found``'s answer: it is running, or answered within ``fresh`` seconds with
        nothing counted since."""
        if not found.task.done():
            return True
        return time.monotonic() - found.at < fresh and found.mark == self.counter.mark

    def _forget_answered(self) -> None:
        for old in [k for k, r in self._reads.items() if r.task.done()]:
            del self._reads[old]

    async def _read(self, read: Callable[[Store], T], entry: _Read, flush: bool = True) -> T:
        store = await self._ready_for_reading(flush)
        entry.mark = self.counter.mark  # what was counted before it is now written: the answer includes it
        try:
            return await self._call(functools.partial(read, store), _READ_TIMEOUT, read=True)
        except _Failure as err:
            raise LedgerUnavailable(f"the usage ledger cannot be read: {err}") from None
        finally:
            entry.at = time.monotonic()

    def _read_done(self, key: tuple[Any, ...], task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:  # (retrieved: a read nobody waits for any more)
            if self._reads.get(key) is not None and self._reads[key].task is task:
                del self._reads[key]

    async def _ready_for_reading(self, flush: bool = True) -> Store:
        if self._task is None or self._closing:
            raise LedgerUnavailable("the usage ledger is not running")
        if (flush or self._schema is None) and self.state != "failing":
            await self._flush_quietly()
        if self._store is None:
            raise LedgerUnavailable(f"the usage ledger cannot be read: {self.error or 'its database is not open yet'}")
        return self._store

    def status(self) -> dict[str, Any]:
        """What the status page shows of the ledger itself."""
        return {"database": self.shown_url, "state": self.state, "since": self.since, "error": self.error,
                "last_written": self.last_written, "pending": self.counter.pending,
                "dropped": self.counter.dropped + self._lost["shutdown"], "refused": self._lost["refused"],
                "refused_why": self.refused_why, "notice": self.notice,
                "flush_interval": self.options.flush_interval, "retention_days": self.options.retention_days}
