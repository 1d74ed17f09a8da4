"""Issue 36's figures: migration readiness over a fleet's ledger.

A ledger of N clients (default 10,000) over 90 days of hourly rows is generated in the database as the code before
issue 36 wrote it (revision 0001: hourly client rows and totals), then upgraded by the gateway's own migration
(revision 0002 fills each client's rollups from those rows). Its shape, from a seeded random generator: 20
companies; each client calls one behaviour (70 % board_cards, 30 % legacy_uploads) with one User-Agent; 40 % call on
9 days in 10, 4 hours a day; 30 % on 1 day in 5, 1 to 2 hours; 20 % did so and stopped 10 to 80 days ago; 10 %
started within the last 14 days; 1 to 20 requests an hour. Per database (SQLite, PostgreSQL):

1. the rows, and the migration's time;
2. the readiness report: every client read and folded (``gateway outreach --all --json``'s work, in process), and
   through a gateway process ``/deprecations?top=1000`` (its 30-day report and readiness) and ``/status.json``
   (the clients to contact);
3. a client's own view: ``GET /_gateway/deprecations`` through the gateway process for clients the cache has not
   seen (each a different token), one after another: median, p99 and slowest.

    .venv/bin/python bench/readiness.py [--clients 10000] [--days 90] [--own 200] [--skip-postgres]

Needs Debian's postgresql for the PostgreSQL figures (started here in a temporary directory, as an unprivileged
user: tests/postgres_testlib.py); without it the PostgreSQL rows say so. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))
import run as harness  # noqa: E402 - the main harness's process helpers

from gateway.app import parse_config  # noqa: E402
from gateway.config.ledger import ClientNames  # noqa: E402
from gateway.core.http import token_fingerprint  # noqa: E402
from gateway.ops.ledger.readiness import build, days_from  # noqa: E402
from gateway.ops.ledger.store import MIGRATIONS, Store  # noqa: E402

DAY, HOUR = 86400, 3600
COMPANIES = [f"co{i:02d}" for i in range(20)]
TOKEN = "bench-admin-token-0123456789"
Row = tuple[int, str, str, str, str, str, int, float, float]


def _config(url: str, port: int = 0, admin: int = 0) -> dict[str, Any]:
    return {
        "server": {"listen": f"{harness.HOST}:{port}", "admin_listen": f"{harness.HOST}:{admin}",
                   "admin_token": TOKEN, "shutdown_timeout": 2},
        "access_log": {"enabled": False},
        "tenants": [{"name": name, "hosts": [f"{name}.bench"], "upstream": "http://127.0.0.1:1",
                     "created": "2025-01-01", "restricted_file_access": True, "forbid_legacy_uploads": False,
                     "rollout": {"forbid_legacy_uploads": "2027-03-01"}} for name in COMPANIES],
        "routes": [{"name": "board", "methods": ["GET"], "paths": ["/boards/{board_id}"],
                    "chain": [{"board_cards": {}}]},
                   {"name": "legacy_card_file_upload", "methods": ["PUT"], "paths": ["/cards/{card_id}/files"],
                    "chain": [{"legacy_upload_guard": {"detect": "route",
                                                       "successor": "/api/v1/cards/{card_id}/files"}}]}],
        "usage": {"ledger": {"url": url, "retention_days": 400}},
    }


def _client(i: int) -> tuple[str, str, str]:
    """The i-th client: its company, token (the fingerprint is its SHA-256's), behaviour."""
    behaviour = "board_cards" if i % 10 < 7 else "legacy_uploads"
    return COMPANIES[i % len(COMPANIES)], f"Bearer bench-{i}", behaviour


def generate(clients: int, days: int, now: float, seed: int = 36) -> list[Row]:
    """The hourly client rows, in the shape the docstring gives."""
    rng = random.Random(seed)
    today = int(now) // DAY * DAY
    rows: list[Row] = []
    for i in range(clients):
        tenant, token, behaviour = _client(i)
        fingerprint = token_fingerprint(token) or ""
        agent = f"bench-sdk/{i % 5 + 1}.0"
        profile = rng.random()
        first, last, share, hours = today - (days - 1) * DAY, today, 0.9, (4, 4)
        if 0.4 <= profile < 0.7:
            share, hours = 0.2, (1, 2)
        elif 0.7 <= profile < 0.9:
            last = today - rng.randint(10, 80) * DAY
        elif profile >= 0.9:
            first = today - rng.randint(0, 13) * DAY
        for day in range(first, last + 1, DAY):
            if rng.random() >= share:
                continue
            for hour in rng.sample(range(24), rng.randint(*hours)):
                bucket = day + hour * HOUR
                if bucket > now:
                    continue
                if behaviour == "board_cards":
                    decision = "capped:capped" if bucket >= now - 60 * DAY else "full:untouched"
                else:
                    decision = "allowed"
                n = rng.randint(1, 20)
                seen = bucket + rng.random() * 3000
                rows.append((bucket, behaviour, tenant, fingerprint, agent, decision, n, seen, seen + 300))
    return rows


def _totals(rows: list[Row]) -> list[tuple[int, str, str, str, int, int]]:
    sums: dict[tuple[int, str, str, str], int] = {}
    for bucket, behaviour, tenant, _, _, decision, n, _, _ in rows:
        key = (bucket, behaviour, tenant, decision)
        sums[key] = sums.get(key, 0) + n
    return [(*key, n, 0) for key, n in sums.items()]


def seed(url: str, rows: list[Row]) -> None:
    """The rows at revision 0001, inserted directly (COPY on PostgreSQL)."""
    from alembic import command
    from alembic.config import Config

    store = Store(url, timeout=600, read_timeout=600)
    with store.engine.begin() as conn:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
    totals = _totals(rows)
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        if store.dialect == "postgresql":
            with cursor.copy("COPY usage_clients FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            with cursor.copy("COPY usage_totals FROM STDIN") as copy:
                for total in totals:
                    copy.write_row(total)
        else:
            cursor.executemany("INSERT INTO usage_clients VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            cursor.executemany("INSERT INTO usage_totals VALUES (?, ?, ?, ?, ?, ?)", totals)
        raw.commit()
    finally:
        raw.close()
    store.close()


def _median(fn: Any, times: int = 3) -> tuple[float, Any]:
    taken, result = [], None
    for _ in range(times):
        started = time.perf_counter()
        result = fn()
        taken.append(time.perf_counter() - started)
    return statistics.median(taken), result


def measure(name: str, url: str, rows: list[Row], clients: int, own: int, tmp: Path) -> list[str]:
    lines = []
    seed(url, rows)
    store = Store(url, timeout=600, read_timeout=600)
    started = time.perf_counter()
    store.migrate()
    migration = time.perf_counter() - started
    with store.engine.connect() as conn:
        state, days = (conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
                       for table in ("usage_client_state", "usage_client_days"))
    lines.append(f"{name}: {len(rows):,} hourly rows of {clients:,} clients; migration 0002 filled "
                 f"{state:,} state rows and {days:,} day rows in {migration:.1f} s")
    config = parse_config(_config(url))
    plan, names, options = config.rollout_plan(), ClientNames(()), config.model.usage.readiness
    wall = now = time.time()
    since = wall - options.window_days * DAY

    def report() -> tuple[float, float, int]:
        began = time.perf_counter()
        found = store.readiness(since, days_from(wall))
        read = time.perf_counter() - began
        ready = build(*found, plan=plan, names=names, wall=wall, now=now, quiet_days=options.quiet_days,
                      window_days=options.window_days)
        text = json.dumps(ready.to_json(None))
        return read, time.perf_counter() - began, len(text)

    taken, (read, whole, size) = _median(report)
    lines.append(f"{name}: the readiness report of every client (gateway outreach --all --json): {taken:.2f} s "
                 f"(the database's read {read:.2f} s), {size / 2**20:.1f} MiB of JSON")
    store.close()
    lines += _through_a_gateway(name, url, clients, own, tmp)
    for line in lines:
        print(line, flush=True)
    return lines


def _through_a_gateway(name: str, url: str, clients: int, own: int, tmp: Path) -> list[str]:
    from benchlib import percentile

    from tests.process_testlib import LivezProbe

    port, admin = harness.pick_ports(18790, 2)
    path = tmp / f"gw-{name}.yaml"
    path.write_text(json.dumps(_config(url, port, admin)))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--log-level", "warning"]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    lines = []
    with harness.Stack() as stack:
        proc = stack.start(harness.Proc(f"gw-{name}", argv, tmp, f"gw-{name}.log", cwd=tmp))
        harness.wait_ready(proc, lambda: harness.http(f"http://{harness.HOST}:{admin}/readyz")[0] == 200)
        for page in ("/deprecations?since=30d&top=1000", "/status.json"):
            # Each read a window of its own (a query, not an answer shared with the read before).
            taken: list[float] = []
            for _ in range(3):
                began = time.perf_counter()
                status, body = harness.http(f"http://{harness.HOST}:{admin}{page}&x={began}" if "?" in page else
                                            f"http://{harness.HOST}:{admin}{page}?since={30 + len(taken)}d",
                                            timeout=120, headers=headers)
                assert status == 200, (status, body[:300])
                taken.append(time.perf_counter() - began)
            lines.append(f"{name}: {page} through the gateway: median {statistics.median(taken):.2f} s "
                         f"({len(body) / 1024:.0f} KiB)")
        rng = random.Random(7)
        times = []
        # The event loop meanwhile: /livez asked every 10 ms from another process (tests/process_testlib.py).
        probe = LivezProbe(admin)
        for i in rng.sample(range(clients), own):
            tenant, token, _ = _client(i)
            began = time.perf_counter()
            status, body = harness.http(f"http://{harness.HOST}:{port}/_gateway/deprecations", timeout=60,
                                        headers={"Authorization": token, "Host": f"{tenant}.bench"})
            times.append(time.perf_counter() - began)
            assert status == 200, (status, body[:300])
        asyncio.run(probe.finish())
        lines.append(f"{name}: a client's own view (/_gateway/deprecations, {own} clients not cached): median "
                     f"{percentile(times, 0.5) * 1000:.1f} ms, p99 {percentile(times, 0.99) * 1000:.1f} ms, slowest "
                     f"{max(times) * 1000:.1f} ms; the event loop meanwhile: /livez p99 {probe.p99 * 1000:.1f} ms, "
                     f"slowest {probe.worst * 1000:.1f} ms ({probe.count} answers)")
        stack.stop(proc)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--own", type=int, default=200, help="clients asking for their own view")
    parser.add_argument("--skip-postgres", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-readiness-"))
    postgres = None
    try:
        started = time.perf_counter()
        rows = generate(args.clients, args.days, time.time())
        print(f"generated {len(rows):,} hourly rows in {time.perf_counter() - started:.1f} s", flush=True)
        lines = measure("SQLite", f"sqlite:///{tmp}/ledger.sqlite3", rows, args.clients, args.own, tmp)
        if not args.skip_postgres:
            from tests import postgres_testlib

            try:
                postgres = postgres_testlib.start_postgres()
            except RuntimeError as err:
                print(f"PostgreSQL: {err}; its rows are left out", file=sys.stderr)
            if postgres is not None:
                url = postgres.url(postgres.create_database(), postgres_testlib.PASSWORD)
                lines += measure("PostgreSQL", url, rows, args.clients, args.own, tmp)
        print("\n".join(["", *lines]))
    finally:
        if postgres is not None:
            from tests import postgres_testlib

            postgres_testlib.remove(postgres)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
