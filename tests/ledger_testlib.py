"""The usage ledger as tests prepare it: a database left at revision 0001 with rows written as the store before the
per-client rollups wrote them (its upserts of hourly rows and totals), and gateway processes whose wall clock (the
ledger's, ``time.time``) is moved, so that a real process records a call days before or after today."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.ops.ledger.store import MIGRATIONS, Store
from tests.process_testlib import ROOT

# (bucket, behaviour, tenant, client, user agent, decision, requests, first seen, last seen)
OldRow = tuple[int, str, str, str, str, str, int, float, float]


def at_revision_0001(url: str) -> Store:
    """A ledger as the code before revision 0002 made it: Alembic to 0001 only (the caller closes it)."""
    from alembic import command
    from alembic.config import Config

    store = Store(url)
    with store.engine.begin() as conn:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
    return store


def write_old_rows(store: Store, rows: Sequence[OldRow]) -> None:
    """``rows`` and their totals, upserted as the store of revision 0001 did (its two statements, unchanged since)."""
    totals: dict[tuple[int, str, str, str], int] = {}
    for bucket, behaviour, tenant, _, _, decision, requests, _, _ in rows:
        key = (bucket, behaviour, tenant, decision)
        totals[key] = totals.get(key, 0) + requests
    with store.engine.begin() as conn:
        conn.exec_driver_sql(store._clients_sql, list(rows))
        conn.exec_driver_sql(store._totals_sql, [(*key, n, 0) for key, n in sorted(totals.items())])


# Started in a gateway process before anything else (sitecustomize): its wall clock moved by TEST_WALL_OFFSET
# seconds. The rollout's clock is the gateway's own (GATEWAY_NOW fixes it).
_HOOK = """
import os, time
_offset = float(os.environ.get("TEST_WALL_OFFSET") or 0)
if _offset:
    _real, _real_ns = time.time, time.time_ns
    time.time = lambda: _real() + _offset
    time.time_ns = lambda: _real_ns() + int(_offset * 1e9)
"""


def moved_wall(tmp_path: Path, offset: float, environ: dict[str, str]) -> dict[str, Any]:
    """The environment of a gateway process whose ``time.time`` reads ``offset`` seconds from now."""
    hook = tmp_path / "wall-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_HOOK)
    return {**environ, "PYTHONPATH": f"{hook}:{ROOT}", "TEST_WALL_OFFSET": str(offset)}
