"""A freeze's record of who was seen before its date, across a fleet: gateway processes on one PostgreSQL database.

Replica A runs two days in the past (its wall clock moved, its rollout clock fixed there: ``ledger_testlib``), so
that a client it sees is first seen before the freeze date (yesterday); B and the others run today, after it. What
the engine decided for each client is read back from the ledger, which keeps the rule that decided each client's
latest call (``freeze`` when the freeze gave it the last phase), and what the client got: the policies decide through
the request's rollout, so a frozen client's legacy upload is refused and its board has no cards.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.core.http import token_fingerprint
from gateway.ops.ledger.store import Store
from tests.board_fixtures import board_bytes
from tests.gateway_testlib import BASE_CONFIG, RecordingUpstream, guarded_routes
from tests.integration.board_testlib import json_responder
from tests.ledger_testlib import moved_wall
from tests.process_testlib import Proc, start, wait_for

DAY = 86400
EARLY, LATE = "Bearer early-token", "Bearer late-token"
X, Y = token_fingerprint(EARLY) or "", token_fingerprint(LATE) or ""  # a credential always has a fingerprint


def _config(upstream: str, url: str, known: Path) -> dict[str, Any]:
    yesterday = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).date().isoformat()
    tenants = [dict(t, upstream=upstream) for t in BASE_CONFIG["tenants"]]
    # oldco: legacy uploads allowed, its board's cards kept in full into 2027; both frozen from yesterday.
    tenants[1] = {**tenants[1], "restricted_file_access": True, "forbid_legacy_uploads": False, "rollout": {
        "board_cards_cap": "2027-01-01", "board_cards_removal": "2027-02-01",
        "freezes": [{"behaviour": "legacy_uploads", "from": yesterday}, {"behaviour": "board_cards",
                                                                         "from": yesterday}]}}
    routes = guarded_routes()
    for route in routes:
        if route["name"] == "board":
            route["chain"] = [{"board_cards": {}}]
    return {"tenants": tenants, "routes": routes, "access_log": {"enabled": False},
            "usage": {"ledger": {"url": url, "flush_interval": 0.2, "flush_timeout": 1, "sync_interval": 0.5,
                                 "known_clients_file": str(known)}}}


# What a client gets: (the legacy upload's status, the board's cards). Its calendar: the upload allowed (the
# company's setting is off), the board's 3 cards in full; frozen: the last phases, refused and no cards.
KNOWN, FROZEN = (200, 3), (403, 0)


async def _calls(proc: Proc, token: str) -> tuple[int, int]:
    """An upload and a board read of oldco's: a call on each frozen behaviour; what the client got."""
    headers = {"Host": "old.test", "Authorization": token, "User-Agent": "sdk/1.0"}
    async with aiohttp.ClientSession() as client:
        async with client.put(proc.url + "/api/v1/cards/1/files", data=b"x", headers=headers) as resp:
            upload = resp.status
        async with client.get(proc.url + "/api/latest/boards/1", headers=headers) as resp:
            assert resp.status == 200
            cards = (await resp.json()).get("cards") or []
    return upload, len(cards)


def _rules(url: str, since: float = 0.0) -> dict[tuple[str, str], str]:
    """The rule of each client's latest call on oldco, per behaviour, as the ledger keeps it (a call after
    ``since``: a replica of today's, not A two days ago)."""
    store = Store(url.replace("${LEDGER_PASSWORD}", os.environ["LEDGER_PASSWORD"]))
    try:
        rows, _ = store.readiness(since, 0, tenant="oldco")
    finally:
        store.close()
    return {(row[1], row[2]): row[9] for row in rows}


def _unplaced(metrics: dict[Any, float], behaviour: str) -> float:
    return metrics.get(("gateway_freeze_unplaced_total", (("behaviour", behaviour),)), 0.0)


async def test_a_client_seen_by_one_replica_before_the_freeze_is_known_to_the_others(
        postgres: Any, postgres_url: str, upstream: RecordingUpstream, tmp_path: Path) -> None:
    upstream.responder = json_responder(board_bytes(3), etag=None)
    now = time.time()
    past = dt.datetime.fromtimestamp(now - 2 * DAY, dt.UTC).isoformat()
    today = dt.datetime.fromtimestamp(now, dt.UTC).isoformat()
    config = {name: _config(upstream.url, postgres_url, tmp_path / f"{name}-known.json") for name in "abc"}
    store = Store(postgres_url.replace("${LEDGER_PASSWORD}", os.environ["LEDGER_PASSWORD"]))
    store.migrate()  # (as `gateway migrate` before a deploy: the test reads the tables from its first poll)
    store.close()
    a, b = await asyncio.gather(
        start(config["a"], tmp_path, name="a", env={**moved_wall(tmp_path, -2 * DAY, dict(os.environ)),
                                                    "GATEWAY_NOW": past}),
        start(config["b"], tmp_path, name="b", env={**os.environ, "GATEWAY_NOW": today}))
    loop = asyncio.get_running_loop()
    procs = [a, b]
    try:
        assert await _calls(a, EARLY) == KNOWN  # first seen two days ago: before the freeze
        seen = time.monotonic()
        # B learns it within the stated bound: its next calls there are no longer decided by the freeze.
        learnt: list[float] = []

        async def known_on_b() -> bool:
            if await _calls(b, EARLY) != KNOWN:  # frozen until B learns of it
                return False
            await asyncio.sleep(0.3)  # B's flush interval: its decision reaches the ledger
            rules = await loop.run_in_executor(None, _rules, postgres_url, now - 60)
            if rules.get((X, "legacy_uploads")) in (None, "freeze") or rules.get((X, "board_cards")) in (None, "freeze"):
                return False
            learnt.append(time.monotonic() - seen)
            return True

        await wait_for(known_on_b, 15)
        print(f"replica B knew the client replica A first saw before the freeze after {learnt[0]:.1f} s "
              f"(bound: flush_interval 0.2 + sync_interval 0.5 + flush_timeout 1 s, and the test's own polling)")
        assert learnt[0] < 5
        # A client first seen today, after the freeze: the last phase, on B and on A (restarted today).
        assert await _calls(b, LATE) == FROZEN
        a.stop()
        a = await start(config["a"], tmp_path, name="a-today", env={**os.environ, "GATEWAY_NOW": today})
        procs.append(a)
        for proc in (a, b):
            async def decided(proc: Proc = proc) -> bool:
                # (A, restarted, places no one until its first read of the record: its board answer meanwhile is the
                # calendar's, the fallback of a compatibility behaviour.)
                if await _calls(proc, LATE) != FROZEN:
                    return False
                rules = await loop.run_in_executor(None, _rules, postgres_url)
                return rules.get((Y, "legacy_uploads")) == "freeze" and rules.get((Y, "board_cards")) == "freeze"

            await wait_for(decided, 10)
        assert await _calls(a, EARLY) == KNOWN
        await asyncio.sleep(0.5)
        rules = await loop.run_in_executor(None, _rules, postgres_url)
        assert rules[(X, "legacy_uploads")] == "setting" and rules[(X, "board_cards")] == "default"

        # The database stopped: B answers from its record (final: read after the freeze date), and so does B
        # restarted during the outage (its file); a replica that never read it (C) cannot place anyone.
        await loop.run_in_executor(None, postgres.stop, "fast")
        b.stop()
        b = await start(config["b"], tmp_path, name="b-again", env={**os.environ, "GATEWAY_NOW": today})
        c = await start(config["c"], tmp_path, name="c", env={**os.environ, "GATEWAY_NOW": today})
        procs += [b, c]
        assert [await _calls(b, token) for token in (EARLY, LATE)] == [KNOWN, FROZEN]
        # C cannot place EARLY: the upload guard takes the stricter answer (refused), board_cards the one that breaks
        # nothing (its cards).
        for _ in range(3):
            assert await _calls(c, EARLY) == (403, 3)
        metrics_b, metrics_c = await b.metrics(), await c.metrics()
        assert _unplaced(metrics_b, "legacy_uploads") == 0 and _unplaced(metrics_b, "board_cards") == 0
        # Counted at each decision (the ledger's record of C's calls decides once per client and write; every
        # request, once the policies decide through the request's rollout: tests/test_known_clients.py counts them).
        assert _unplaced(metrics_c, "legacy_uploads") >= 1 and _unplaced(metrics_c, "board_cards") >= 1
        said = c.log.read_text()
        assert said.count("freeze of legacy_uploads: a client could not be placed") == 1
        assert said.count("freeze of board_cards: a client could not be placed") == 1
        await loop.run_in_executor(None, postgres.start)

        # What C decided while it could not tell arrives with its held counts: the fallback rules. A compatibility
        # behaviour treats the client as known (its calendar decided), the upload guard as new (the freeze).
        async def fallback_written() -> bool:
            return await loop.run_in_executor(None, _rules, postgres_url) == {
                (X, "legacy_uploads"): "freeze", (X, "board_cards"): "default",
                (Y, "legacy_uploads"): "freeze", (Y, "board_cards"): "freeze"}

        await wait_for(fallback_written, 75)

        async def c_reads_the_record() -> bool:
            return (await c.metrics()).get(("gateway_usage_ledger_up", ())) == 1.0

        await wait_for(c_reads_the_record, 75)
        await asyncio.sleep(1.0)  # a read of the record, every 0.5 s
        unplaced = _unplaced(await c.metrics(), "legacy_uploads")
        assert await _calls(c, EARLY) == KNOWN
        await asyncio.sleep(0.5)  # a write: C's record of the call decided again
        assert _unplaced(await c.metrics(), "legacy_uploads") == unplaced  # placed again: nothing more unplaced
    finally:
        if not postgres.running():
            postgres.start()
        for proc in procs:
            proc.stop()
