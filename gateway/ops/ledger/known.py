"""A freeze's record of who is not new (``rollout.request.KnownClients``): per frozen behaviour and freeze instant,
the (company, client) first seen on it before the instant by any replica (``usage_client_state.first_seen``), read
every ``usage.ledger.sync_interval`` on the ledger's reader thread, joined by the clients this process counts, and kept
in a file (``known_clients_file``) across restarts and outages; nothing learnt is forgotten. An instant's record is
final once read ``flush_interval + flush_timeout`` after it; before, a client not in it is new while the last read is
within ``flush_interval + sync_interval + flush_timeout`` (the bound: a replica learns of another's clients within
it), else unplaced (None; also before the first read, without a file): the engine's fallback applies, counted in
``gateway_freeze_unplaced_total`` and said once per behaviour until a read succeeds (docs/rollout.md, "Freezes").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ...config.ledger import LedgerConfig
from ...rollout.plan import RolloutPlan
from .ledger import Ledger, LedgerUnavailable

__all__ = ("KnownClients", "KnownFamilies", "snapshot_path")

log = logging.getLogger("gateway.ledger")

_VERSION = 1
# A read after a failed one comes sooner than the interval (but not in a loop).
_RETRY = 5.0

Instant = tuple[str, float]  # (behaviour, freeze instant)


class KnownFamilies:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.unplaced = Counter(
            "gateway_freeze_unplaced", "Requests whose client a freeze could not place (the usage ledger's record of "
            "who was seen before the freeze date not read yet, or not read for too long): the behaviour's fallback "
            "applied (board_cards: known; legacy_uploads: new).", ("behaviour",), registry=registry)


def snapshot_path(options: LedgerConfig, spool_dir: str | None) -> Path | None:
    """Where the record is kept across restarts: ``known_clients_file``, else beside a SQLite file, else (PostgreSQL)
    in the spool directory or the system's temporary one, named after the database; None for an in-memory SQLite."""
    if options.known_clients_file is not None:
        return Path(options.known_clients_file)
    from .store import sqlite_path

    path = sqlite_path(options.url)
    if path == ":memory:":
        return None
    if path is not None:
        return Path(path + ".known-clients.json")
    digest = hashlib.sha256(options.url.encode()).hexdigest()[:12]
    return Path(spool_dir or tempfile.gettempdir()) / f"gateway-known-clients-{digest}.json"


def _write_whole(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` as the file at ``path``, whole or not at all: written beside it, then put in its place (the file
    beside it removed when that fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(payload, out, separators=(",", ":"))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class KnownClients:
    def __init__(self, ledger: Ledger, path: Path | None, *, families: KnownFamilies,
                 clock: Callable[[], float] = time.time) -> None:
        options = ledger.options
        self._ledger = ledger
        self._path = path
        self._families = families
        self._clock = clock
        self._interval = options.sync_interval
        self._settle = options.flush_interval + options.flush_timeout
        self._bound = options.flush_interval + options.sync_interval + options.flush_timeout
        self._known: dict[Instant, set[tuple[str, str]]] = {}
        self._final: set[Instant] = set()
        self._by_behaviour: dict[str, list[float]] = {}
        self._read_at: float | None = None  # when the last successful read started (the ledger's clock)
        self._said: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._dirty = False

    # --- what the engine asks ---------------------------------------------------------------------------------

    def seen_before(self, tenant: str, behaviour: str, client: str, at: float) -> bool | None:
        key = (behaviour, at)
        known = self._known.get(key)
        if known is not None and (tenant, client) in known:
            return True
        if key in self._final:
            return False
        if known is None:
            self._watch(key)
        if known is not None and self._read_lately():
            return False  # not final yet, but read within the bound: what the fleet had written then
        self._unplaced(behaviour)
        return None

    def _read_lately(self) -> bool:
        """Whether the record was read within its bound."""
        read_at = self._read_at
        return read_at is not None and self._clock() - read_at <= self._bound

    def _unplaced(self, behaviour: str) -> None:
        self._families.unplaced.labels(behaviour).inc()
        if behaviour not in self._said:
            self._said.add(behaviour)
            why = "not read yet" if self._read_at is None else "not read for longer than its bound"
            log.warning("freeze of %s: a client could not be placed (the usage ledger's record of who was seen before "
                        "the freeze date is %s); the behaviour's fallback applies until it is read (said once)",
                        behaviour, why)

    # --- what this process sees ----------------------------------------------------------------------------------

    def own(self, behaviour: str, tenant: str, client: str, when: float) -> None:
        """A client this process counted (``UsageCounter.seen``): known for every freeze of the behaviour after
        ``when``."""
        for at in self._by_behaviour.get(behaviour, ()):
            if when < at:
                known = self._known[(behaviour, at)]
                if (tenant, client) not in known:
                    known.add((tenant, client))
                    self._dirty = True

    def watch(self, plan: RolloutPlan) -> bool:
        """Every freeze instant of ``plan`` (at start, and on reload); whether there is any. Read from the plan's
        distinct schedules (``RolloutPlan.shared``, worked out with the state off the event loop on a reload): every
        company's own schedules would be built here, on the loop, 100 ms at 10,000 companies."""
        for groups in plan.shared().values():
            for schedule in groups:
                if schedule.freeze is not None:
                    self._watch((schedule.behaviour.name, schedule.freeze.at))
        return bool(self._known)

    def _watch(self, key: Instant) -> None:
        if key in self._known:
            return
        self._known[key] = set()
        self._by_behaviour.setdefault(key[0], []).append(key[1])
        self._wake.set()

    # --- life ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._load()
        self._task = asyncio.create_task(self._run(), name="usage-ledger-known-clients")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._dirty:
            await asyncio.to_thread(self._save, self._payload())

    async def _run(self) -> None:
        while True:
            ok = True
            if self._known:
                ok = await self.sync()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval if ok else min(_RETRY, self._interval))

    async def sync(self) -> bool:
        """Read the record from the ledger once; False when it could not be read."""
        keys = sorted(self._known)
        started = self._clock()
        try:
            found = await self._ledger.seen_before(keys)
        except LedgerUnavailable:
            return False
        for key, rows in found.items():
            self._learn(key, rows, started)
        self._read_at = started
        self._said.clear()
        if self._dirty and self._path is not None:
            self._dirty = False
            await asyncio.to_thread(self._save, self._payload())
        return True

    def _learn(self, key: tuple[str, float], rows: list[tuple[str, str]], started: float) -> None:
        """One instant's clients as read (a read started ``started``); final once read after it has settled."""
        known = self._known.setdefault(key, set())
        before = len(known)
        known.update(rows)
        if len(known) != before:
            self._dirty = True
        if started >= key[1] + self._settle and key not in self._final:
            self._final.add(key)
            self._dirty = True

    # --- the file --------------------------------------------------------------------------------------------------

    def _payload(self) -> dict[str, Any]:
        """What the file holds, copied on the loop (the sets change there), sorted and written in a thread."""
        return {"version": _VERSION, "database": self._database(), "written_at": self._clock(),
                "instants": [{"behaviour": behaviour, "at": at, "final": (behaviour, at) in self._final,
                              "clients": list(known)} for (behaviour, at), known in self._known.items()]}

    def _database(self) -> str:
        """Which database the record is of (a file of another one is not read): a digest of its URL."""
        return hashlib.sha256(self._ledger.options.url.encode()).hexdigest()[:16]

    def _save(self, payload: dict[str, Any]) -> None:
        path = self._path
        if path is None:
            return
        for item in payload["instants"]:
            item["clients"].sort()
        try:
            _write_whole(path, payload)
        except OSError as err:
            log.warning("freeze record: cannot write %s (%s): a restart during a database outage would not know the "
                        "clients seen before the freeze", path, err.strerror or err)

    def _load(self) -> None:
        path = self._path
        if path is None:
            return
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            log.warning("freeze record: cannot read %s (%s): starting without it", path, err)
            return
        if self._ours(data):
            self._restore(data)

    def _ours(self, data: Any) -> bool:
        """Whether a file's data is a record this gateway writes, of this database."""
        return isinstance(data, dict) and data.get("version") == _VERSION and data.get("database") == self._database()

    def _restore(self, data: dict[str, Any]) -> None:
        for item in data.get("instants", ()):
            key = (str(item["behaviour"]), float(item["at"]))
            self._watch(key)
            self._known[key].update((str(t), str(c)) for t, c in item["clients"])
            if item.get("final"):
                self._final.add(key)
