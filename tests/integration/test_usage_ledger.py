"""The usage ledger through real gateway processes and a real database (a SQLite file, and a PostgreSQL server the
suite starts, tests/postgres_testlib.py): several processes writing the same clients, restarts, SIGTERM and
SIGKILL, --workers, the database stopped under load and started again, and `gateway usage` reading it all back.

The legacy upload guard makes the decisions: acme (created after 2026-05-21) has legacy uploads forbidden, so each
PUT on the deprecated route is answered 403 by the gateway and counted as blocked; oldco's are allowed and reach the
upstream."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway import cli
from gateway.core.http import token_fingerprint
from tests.gateway_testlib import ADMIN_HEADERS, ADMIN_TOKEN, BASE_CONFIG, RecordingUpstream, free_port, guarded_routes
from tests.process_testlib import ROOT, LivezProbe, Proc, start, wait_for

UA = "legacy-uploader/2.1"


def _config(upstream: str, url: str, **ledger: Any) -> dict[str, Any]:
    tenants = [dict(t, upstream=upstream) for t in BASE_CONFIG["tenants"]]
    return {"tenants": tenants, "routes": guarded_routes(), "access_log": {"enabled": False},
            "usage": {"ledger": {"url": url, **ledger}}}


async def _uploads(proc: Proc, token: str, count: int, host: str = "127.0.0.1") -> None:
    async with aiohttp.ClientSession() as client:
        for _ in range(count):
            async with client.put(proc.url + "/api/v1/cards/1/files", data=b"file bytes",
                                  headers={"Authorization": f"Bearer {token}", "User-Agent": UA,
                                           "Host": host}) as resp:
                assert resp.status == (403 if host == "127.0.0.1" else 200)


def _usage_process(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "usage", "--config", str(config), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _usage(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gateway usage` run by its main() in this process (a new interpreter per call costs seconds of imports on a
    busy machine; one test runs it as a process)."""
    return _main("usage", "--config", str(config), *args)


def _main(*argv: str) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


async def _stop(*procs: Proc) -> None:
    loop = asyncio.get_running_loop()
    for proc in procs:
        proc.proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert await loop.run_in_executor(None, proc.proc.wait, 30) == 0


async def test_two_gateways_on_one_ledger_restarted_report_exact_totals(
        ledger_url: str, upstream: RecordingUpstream, tmp_path: Path) -> None:
    """Both write the same clients into one database; the flush interval is an hour, so every write is the one
    SIGTERM makes. After both are restarted and stopped again, `gateway usage` adds up every request."""
    config = _config(upstream.url, ledger_url, flush_interval=3600)
    a, b = await asyncio.gather(start(config, tmp_path, name="a"), start(config, tmp_path, name="b"))
    await asyncio.gather(_uploads(a, "shared", 7), _uploads(b, "shared", 5))
    await _uploads(a, "only-a", 3)
    await _uploads(b, "oldco-client", 2, host="old.test")
    await _stop(a, b)
    a, b = await asyncio.gather(start(config, tmp_path, name="a2"), start(config, tmp_path, name="b2"))
    await asyncio.gather(_uploads(a, "shared", 2), _uploads(b, "shared", 2))
    await _stop(a, b)

    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _usage_process(a.config_path, "--since", "1h", "--json"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["behaviours"]["legacy_uploads"]
    assert report["requests"] == 21 and report["by_decision"] == {"blocked": 19, "allowed": 2}
    assert report["by_tenant"] == {"acme": {"blocked": 19}, "oldco": {"allowed": 2}}
    assert report["clients"] == 3 and report["untracked_clients_requests"] == 0
    rows = [(r["client"], r["tenant"], r["user_agent"], r["requests"], r["decisions"]) for r in report["top_clients"]]
    assert rows == [(token_fingerprint("Bearer shared"), "acme", UA, 16, {"blocked": 16}),
                    (token_fingerprint("Bearer only-a"), "acme", UA, 3, {"blocked": 3}),
                    (token_fingerprint("Bearer oldco-client"), "oldco", UA, 2, {"allowed": 2})]
    assert "Bearer" not in out.stdout and "shared" not in out.stdout  # fingerprints, never tokens
    # The list of clients to contact, and the other filters.
    out = await loop.run_in_executor(None, lambda: _usage(a.config_path, "--since", "1h", "--csv", "--order",
                                                          "recent"))
    assert out.returncode == 0, out.stderr
    lines = list(csv.DictReader(io.StringIO(out.stdout)))
    assert {(line["client"], line["requests"], line["decisions"]) for line in lines} == {
        (token_fingerprint("Bearer shared"), "16", "blocked=16"), (token_fingerprint("Bearer only-a"), "3", "blocked=3"),
        (token_fingerprint("Bearer oldco-client"), "2", "allowed=2")}
    assert lines[0]["client"] == token_fingerprint("Bearer shared")  # seen last
    out = await loop.run_in_executor(None, lambda: _usage(a.config_path, "--tenant", "oldco", "--top", "5"))
    assert out.returncode == 0, out.stderr
    assert "legacy_uploads: 2 requests (allowed 2), 1 client" in out.stdout
    fingerprint = token_fingerprint("Bearer oldco-client")
    assert fingerprint is not None and fingerprint in out.stdout and "only-a" not in out.stdout
    out = await loop.run_in_executor(None, lambda: _usage(a.config_path, "--until", "2h"))
    assert out.returncode == 0 and "no deprecated behaviour used in the window" in out.stdout
    if ledger_url.startswith("postgresql"):
        from tests import postgres_testlib

        assert out.stdout.startswith("usage ledger postgresql://<redacted>@127.0.0.1:")
        assert postgres_testlib.PASSWORD not in out.stdout + a.log.read_text() + b.log.read_text()


async def test_sigkill_loses_at_most_what_was_counted_since_the_last_write(
        upstream: RecordingUpstream, tmp_path: Path) -> None:
    config = _config(upstream.url, f"sqlite:///{tmp_path}/usage.sqlite3", flush_interval=5)
    proc = await start(config, tmp_path)
    await _uploads(proc, "client", 10)
    report = await proc.get_json("/deprecations?since=1h")  # this process's counts are written before it answers
    assert report["behaviours"]["legacy_uploads"]["requests"] == 10
    await _uploads(proc, "client", 4)  # counted in memory, the next write up to 5 s away
    proc.proc.kill()
    proc.proc.wait(10)
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _usage(proc.config_path, "--since", "1h", "--json"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["behaviours"]["legacy_uploads"]["requests"] == 10


async def test_each_worker_writes_its_own_share(upstream: RecordingUpstream, tmp_path: Path) -> None:
    """`serve --workers 2`: whichever worker answers, /deprecations reads the whole process's usage from the ledger;
    a worker killed and restarted by the supervisor keeps what it had written."""
    port, admin = free_port(), free_port()
    config = _config(upstream.url, f"sqlite:///{tmp_path}/usage.sqlite3", flush_interval=0.2)
    config["server"] = {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{admin}",
                        "admin_token": ADMIN_TOKEN}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        def workers() -> list[str]:
            return Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()

        async def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError("the gateway exited")
            try:
                async with aiohttp.ClientSession() as c, c.get(f"http://127.0.0.1:{admin}/readyz") as r:
                    return r.status == 200 and len(workers()) == 2
            except aiohttp.ClientError:
                return False

        await wait_for(ready, 20)
        async with aiohttp.ClientSession() as client:
            for i in range(40):
                # A new connection each time, so the kernel spreads them over both workers.
                async with client.put(f"http://127.0.0.1:{port}/api/v1/cards/1/files", data=b"x",
                                      headers={"Authorization": f"Bearer token-{i % 4}", "User-Agent": UA,
                                               "Connection": "close"}) as resp:
                    assert resp.status == 403

            async def requests() -> int:
                """What the worker that answers counts; -1 while its ledger cannot be read yet (a worker just started
                by the supervisor answers 503 LEDGER_UNAVAILABLE until its database is open)."""
                async with client.get(f"http://127.0.0.1:{admin}/deprecations?since=1h",
                                      headers={"Connection": "close", **ADMIN_HEADERS}) as resp:
                    body = await resp.json()
                    if resp.status == 503 and body["code"] == "LEDGER_UNAVAILABLE":
                        return -1
                    assert resp.status == 200, body
                    return int(body["behaviours"]["legacy_uploads"]["requests"])

            async def all_written() -> bool:
                return await requests() == 40

            await wait_for(all_written, 10)
            victim = workers()[0]
            os.kill(int(victim), signal.SIGKILL)

            async def replaced() -> bool:
                return len(workers()) == 2 and victim not in workers()

            await wait_for(replaced, 15)

            async def both_read_all() -> bool:  # its share stayed in the ledger, whichever worker reads it
                return {await requests() for _ in range(4)} == {40}

            await wait_for(both_read_all, 15)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
    # (The supervisor's exit status is not this test's: the worker started in place of the killed one may still be
    # starting when SIGTERM comes.) Every request is in the ledger once.
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _usage(path, "--since", "1h", "--json"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["behaviours"]["legacy_uploads"]["requests"] == 40


async def test_the_database_stopped_under_load_fails_and_slows_no_request(
        postgres: Any, postgres_url: str, upstream: RecordingUpstream, tmp_path: Path) -> None:
    """PostgreSQL stopped while two gateways take the same load, one writing to it, one without a ledger: no request
    fails, the median latency stays within 1.5x of the gateway without a ledger (and no request waits on the
    database: none takes as long as a write's timeout); /readyz stays 200; after the database is started again,
    the counts held in memory arrive, exactly. One log line when the writes start failing, one when they resume."""
    ledger = await start(_config(upstream.url, postgres_url, flush_interval=0.2, flush_timeout=1), tmp_path,
                         name="ledger")
    plain_config = _config(upstream.url, "sqlite://")
    plain_config["usage"] = {"ledger": {"enabled": False}}
    plain = await start(plain_config, tmp_path, name="plain")
    latencies: dict[str, list[tuple[float, float]]] = {"ledger": [], "plain": []}
    statuses: dict[str, dict[int, int]] = {"ledger": {}, "plain": {}}
    stop = asyncio.Event()

    async def load(name: str, proc: Proc, worker: int) -> None:
        async with aiohttp.ClientSession() as client:
            i = 0
            while not stop.is_set():
                i += 1
                started = time.monotonic()
                async with client.put(proc.url + "/api/v1/cards/1/files", data=b"x",
                                      headers={"Authorization": f"Bearer client-{worker}-{i % 5}",
                                               "User-Agent": UA}) as resp:
                    await resp.read()
                latencies[name].append((started, time.monotonic() - started))
                statuses[name][resp.status] = statuses[name].get(resp.status, 0) + 1

    tasks = [asyncio.create_task(load(name, proc, w)) for name, proc in (("ledger", ledger), ("plain", plain))
             for w in range(3)]
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(1.0)
        await loop.run_in_executor(None, postgres.stop, "fast")
        outage = time.monotonic()

        async def failing() -> bool:
            return (await ledger.metrics()).get(("gateway_usage_ledger_up", ())) == 0.0

        await wait_for(failing, 10)
        await asyncio.sleep(1.5)  # several failed writes, backing off
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{ledger.admin}/readyz") as resp:
                assert resp.status == 200  # the gateway serves without its database
            async with client.get(f"http://127.0.0.1:{ledger.admin}/deprecations", headers=ADMIN_HEADERS) as resp:
                body = await resp.text()
                assert resp.status == 503 and json.loads(body)["code"] == "LEDGER_UNAVAILABLE"
        recovered = time.monotonic()
        await loop.run_in_executor(None, postgres.start)

        async def writing() -> bool:
            return (await ledger.metrics()).get(("gateway_usage_ledger_up", ())) == 1.0

        async def written() -> bool:
            return (await ledger.metrics()).get(("gateway_usage_ledger_pending_requests", ())) == 0.0

        # The next write comes after the backoff in force when the database came back: it doubles from 0.2 s with
        # each failed write (±20 %), so an outage that a loaded machine stretches past 20 s may wait most of a
        # minute, and at the cap up to 72 s (60 s, +20 %); then the write itself. Bounded at twice that.
        await wait_for(writing, 150)
        # Then the load stops, and all it counted is written. (While it runs, the requests counted during a write are
        # pending when the gauge is read: a scrape finding 0 then is luck, which a loaded machine makes rare.)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await wait_for(written, 30)
        metrics = await ledger.metrics()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not postgres.running():
            postgres.start()
        await _stop(ledger, plain)  # on every path: a failed assertion must not leave two gateways running
    assert statuses == {"ledger": {403: len(latencies["ledger"])}, "plain": {403: len(latencies["plain"])}}
    during = {name: [d for t, d in values if outage <= t < recovered] for name, values in latencies.items()}
    assert min(len(v) for v in during.values()) > 50, {k: len(v) for k, v in during.items()}
    ratio = statistics.median(during["ledger"]) / statistics.median(during["plain"])
    print(f"outage: {len(during['ledger'])} and {len(during['plain'])} requests; median {ratio:.2f}x of the gateway "
          f"without a ledger; slowest {max(during['ledger']) * 1000:.1f} ms and {max(during['plain']) * 1000:.1f} ms")
    assert ratio <= 1.5, (ratio, statistics.median(during["ledger"]), statistics.median(during["plain"]))
    assert max(during["ledger"]) < 1.0, max(during["ledger"])  # no request waited for a write to time out
    assert metrics[("gateway_usage_ledger_flushes_total", (("result", "failure"),))] >= 2
    # Every request made during the outage was kept in memory and written once the database was back.
    out = await loop.run_in_executor(None, lambda: _usage(ledger.config_path, "--since", "1h", "--json"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["behaviours"]["legacy_uploads"]["requests"] == len(latencies["ledger"])
    log = ledger.log.read_text()
    assert log.count("cannot write") == 1 and log.count("writing again") == 1
    from tests import postgres_testlib

    assert postgres_testlib.PASSWORD not in log and postgres_testlib.PASSWORD not in body


async def test_the_command_line_says_what_is_wrong(upstream: RecordingUpstream, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(_config(upstream.url, f"sqlite:///{tmp_path}/nowhere/usage.sqlite3")))
    out = await loop.run_in_executor(None, lambda: _usage(config, "--since", "last week"))
    assert out.returncode == 2 and "--since/--until" in out.stderr and "Traceback" not in out.stderr
    out = await loop.run_in_executor(None, lambda: _usage(config, "--since", "1h", "--until", "2h"))
    assert out.returncode == 2 and "--until must be after --since" in out.stderr
    out = await loop.run_in_executor(None, lambda: _usage(config, "--since", "999999w"))
    assert out.returncode == 2 and "'999999w' is outside the years 1970 to 9998" in out.stderr
    out = await loop.run_in_executor(None, lambda: _usage(config, "--tenant", "Acme Corp"))
    assert out.returncode == 2 and "--tenant must be a name" in out.stderr
    out = await loop.run_in_executor(None, lambda: _usage(config))
    assert out.returncode == 1 and "no usage ledger at" in out.stderr
    assert not (tmp_path / "nowhere").exists()  # reading creates nothing
    migrate = _main("migrate", "--config", str(config))
    assert migrate.returncode == 1 and "cannot migrate the usage ledger" in migrate.stderr
    (tmp_path / "nowhere").mkdir()
    for expected in ("(was empty)", "(already)"):
        migrate = _main("migrate", "--config", str(config))
        assert migrate.returncode == 0 and f"schema 0002 {expected}" in migrate.stdout, migrate.stderr
    out = await loop.run_in_executor(None, lambda: _usage(config))
    assert out.returncode == 0 and "no deprecated behaviour used in the window" in out.stdout
    # A password in the URL: never printed, neither by check-config nor in an error.
    data = _config(upstream.url, f"postgresql://gw:hunter2-secret@127.0.0.1:{free_port()}/ledger", flush_timeout=1)
    config.write_text(yaml.safe_dump(data))
    out = await loop.run_in_executor(None, lambda: _usage(config))
    assert out.returncode == 1 and "cannot read the usage ledger postgresql://<redacted>@127.0.0.1" in out.stderr
    check = _main("check-config", str(config))
    assert check.returncode == 0 and "usage ledger: postgresql://<redacted>@127.0.0.1" in check.stdout
    assert "hunter2" not in out.stderr + check.stdout + check.stderr
    data["usage"] = {"ledger": {"enabled": False}}
    config.write_text(yaml.safe_dump(data))
    out = await loop.run_in_executor(None, lambda: _usage(config))
    assert out.returncode == 2 and "the usage ledger is off" in out.stderr


def test_usage_and_migrate_need_only_the_ledger_s_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployed config takes the admin token and the ledger's URL from the environment: an operator's shell that
    reads the fleet's usage needs the ledger's variable only. serve and check-config still need every one."""
    data = _config("http://gw:${UNSET_UPSTREAM_PASSWORD}@127.0.0.1:9", "${GW_TEST_LEDGER_URL}")
    data["server"] = {"admin_token": "${UNSET_ADMIN_TOKEN}"}
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(data))
    for name in ("UNSET_UPSTREAM_PASSWORD", "UNSET_ADMIN_TOKEN", "GW_TEST_LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    for command in ("migrate", "usage"):
        out = _main(command, "--config", str(config))
        assert out.returncode == 2, out
        assert "usage.ledger.url: environment variable GW_TEST_LEDGER_URL is not set" in out.stderr
        assert "UNSET_" not in out.stderr and "Traceback" not in out.stderr
    monkeypatch.setenv("GW_TEST_LEDGER_URL", f"sqlite:///{tmp_path}/usage.sqlite3")
    migrate = _main("migrate", "--config", str(config))
    assert migrate.returncode == 0 and "schema 0002 (was empty)" in migrate.stdout, migrate.stderr
    out = _usage(config, "--since", "1h")
    assert out.returncode == 0 and "no deprecated behaviour used in the window" in out.stdout, out.stderr
    check = _main("check-config", str(config))
    assert check.returncode == 2
    assert "environment variable UNSET_ADMIN_TOKEN is not set" in check.stderr
    assert "environment variable UNSET_UPSTREAM_PASSWORD is not set" in check.stderr


async def test_a_database_that_is_down_hides_nothing_and_stops_nothing(
        upstream: RecordingUpstream, start_gateway: Any, start_admin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger's database unreachable from the start, its password from the environment: the gateway serves and
    is ready, /deprecations says the ledger cannot be read, and no admin answer shows the password."""
    from tests.gateway_testlib import make_config

    secret = "s3cr3t-ledger-pw"
    monkeypatch.setenv("LEDGER_SECRET", secret)
    url = f"postgresql://gw:${{LEDGER_SECRET}}@127.0.0.1:{free_port()}/ledger"
    gw = await start_gateway(make_config(upstream.url, routes=guarded_routes(),
                                         usage={"ledger": {"url": url, "flush_interval": 0.05, "flush_timeout": 1}}))
    admin = await start_admin(gw)
    texts = []
    async with aiohttp.ClientSession() as client:
        async with client.put(gw.url + "/api/v1/cards/1/files", data=b"x") as resp:
            assert resp.status == 403  # served, and counted in memory
        async with client.get(admin + "/readyz") as resp:
            assert resp.status == 200
        async with client.get(admin + "/deprecations") as resp:
            assert resp.status == 503
            body = await resp.json()
            texts.append(json.dumps(body))
        assert body["code"] == "LEDGER_UNAVAILABLE" and "connection" in body["message"].lower()
        for path in ("/config", "/status", "/status.json", "/metrics"):
            async with client.get(admin + path) as resp:
                assert resp.status == 200, path
                texts.append(await resp.text())
    config = json.loads(texts[1])["config"]
    shown = config["usage"]["ledger"]["url"]  # credentials masked (or shown as their ${NAME} reference)
    assert shown.startswith("postgresql://") and shown.endswith("@127.0.0.1:" + url.rsplit(":", 1)[1])
    status = json.loads(texts[3])
    assert status["ledger"]["state"] == "failing" and status["ledger"]["pending"] == 1
    assert status["usage"]["problem"].startswith("the usage ledger cannot be read")
    assert "gateway_usage_ledger_up 0.0" in texts[4]
    assert all(secret not in text for text in texts)


async def test_retention_deletes_old_hours_when_the_gateway_starts(upstream: RecordingUpstream,
                                                                    tmp_path: Path) -> None:
    """Hours older than usage.ledger.retention_days go (each process checks at start, then hourly); newer stay."""
    from gateway.ops.ledger.store import Store
    from gateway.ops.usage import UsageCounter

    url = f"sqlite:///{tmp_path}/usage.sqlite3"
    store = Store(url)
    store.migrate()
    for days_ago, client in ((40, "old"), (20, "recent")):
        at = time.time() - days_ago * 86400
        def clock(at: float = at) -> float:
            return at

        counter = UsageCounter(behaviours={"legacy_upload_guard": "legacy_uploads"}, clock=clock)
        counter.record({"legacy_upload_guard": "blocked"}, client, UA, "acme")
        batch = counter.take()
        assert batch is not None and store.write(batch, at)
    store.close()
    config = _config(upstream.url, url, retention_days=30)
    proc = await start(config, tmp_path)
    try:
        report = await proc.get_json("/deprecations?since=60d")  # after the first write, which prunes first
    finally:
        proc.stop()
    rows = report["behaviours"]["legacy_uploads"]["top_clients"]
    assert [row["client"] for row in rows] == ["recent"] and report["behaviours"]["legacy_uploads"]["requests"] == 1


def _seed(path: Path, clients: int, agent: str = UA) -> None:
    """``clients`` client rows of this hour in a new SQLite ledger (the schema the gateway makes, the rows inserted
    as they are: quicker than a batch of upserts), and their totals."""
    import sqlite3

    from gateway.ops.ledger.store import Store

    store = Store(f"sqlite:///{path}")
    store.migrate()
    store.close()
    now = time.time()
    hour = int(now) // 3600 * 3600
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executemany("INSERT INTO usage_clients VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       ((hour, "legacy_uploads", "acme", f"{i:012x}", agent, "blocked", 2, now - 1, now - 1)
                        for i in range(clients)))
        db.execute("INSERT INTO usage_totals VALUES (?, ?, ?, ?, ?, ?)",
                   (hour, "legacy_uploads", "acme", "blocked", 2 * clients, 0))
        db.commit()


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_reading_a_large_ledger_neither_stalls_the_proxy_nor_holds_its_rows(
        upstream: RecordingUpstream, tmp_path: Path) -> None:
    """200,000 clients in the window: the database groups, orders and cuts them to the page's 50 per behaviour, in
    the ledger's reader thread, so that reading the status page again and again neither stalls the public listener
    (before: the rows were folded in Python, holding the interpreter: a p99 over 100 ms) nor makes
    the process hold every row (before: +130 MiB at the first read)."""
    _seed(tmp_path / "usage.sqlite3", 200_000)
    proc = await start(_config(upstream.url, f"sqlite:///{tmp_path}/usage.sqlite3"), tmp_path)
    try:
        before = _peak_rss(proc.proc.pid)
        probe = LivezProbe(proc.port, path="/api/v1/boards/1")
        answers = []
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client:

            async def page(days: int) -> None:
                # A window of its own each: every read is a query (identical ones would share one).
                async with client.get(f"http://127.0.0.1:{proc.admin}/status.json?since={days}d") as resp:
                    assert resp.status == 200, await resp.text()
                    answers.append(await resp.json())

            for first in (30, 27):
                await asyncio.gather(*(page(first - i) for i in range(3)))
            await probe.finish()
            grown = _peak_rss(proc.proc.pid) - before
            async with client.get(f"http://127.0.0.1:{proc.admin}/deprecations?top=1001") as resp:
                too_many = resp.status, await resp.json()
    finally:
        proc.stop()
    [policy] = answers[0]["usage"]["policies"]
    assert (policy["requests"], policy["clients"], len(policy["rows"])) == (400_000, 200_000, 50)
    print(f"6 reads of 200,000 clients: the public listener's slowest answer {probe.worst * 1000:.1f} ms, p99 {probe.p99 * 1000:.1f} ms "
          f"({probe.count} answers); peak memory +{grown / 2**20:.1f} MiB")
    assert probe.count > 10
    # Generous bounds (a loaded machine stretches every answer): before, the p99 was 126 to 143 ms and the slowest
    # answer 225 to 245 ms on the machine where this one measured 11 to 26 ms and 17 to 74 ms.
    assert probe.p99 < 0.075, probe.p99
    assert probe.worst < 1.0, probe.worst
    assert grown < 40 * 2**20, grown
    # An answer's size is bounded too: at most 1,000 clients per behaviour (every one: gateway usage --csv).
    assert too_many[0] == 400 and "top must be an integer from 1 to 1000" in too_many[1]["message"]


async def test_a_client_is_its_token_however_many_user_agents_it_sends(upstream: RecordingUpstream,
                                                                       tmp_path: Path) -> None:
    """One token seen with two User-Agents is one client with two User-Agent variants (before: "2 clients"), in
    `gateway usage` and in the report."""
    proc = await start(_config(upstream.url, f"sqlite:///{tmp_path}/usage.sqlite3"), tmp_path)
    try:
        async with aiohttp.ClientSession() as client:
            for agent in ("sdk/1.0", "sdk/1.0", "sdk/2.0"):
                async with client.put(proc.url + "/api/v1/cards/1/files", data=b"x",
                                      headers={"Authorization": "Bearer one-token", "User-Agent": agent}) as resp:
                    assert resp.status == 403
        report = (await proc.get_json("/deprecations?since=1h"))["behaviours"]["legacy_uploads"]
    finally:
        proc.stop()
    assert (report["clients"], report["variants"], len(report["top_clients"])) == (1, 2, 2)
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _usage(proc.config_path, "--since", "1h", "--top", "1"))
    assert out.returncode == 0, out.stderr
    assert "legacy_uploads: 3 requests (blocked 3), 1 client, 2 User-Agent variants" in out.stdout
    assert "... 1 more: --top 0 lists every one" in out.stdout


async def test_every_parameter_s_extremes_are_a_bad_query_never_an_unavailable_ledger(
        ledger_url: str, upstream: RecordingUpstream, start_gateway: Any, start_admin: Any) -> None:
    """Before, `since=999999w` (19,000 years ago) and other values the database or the dates could not take reached
    them and came back as `503 LEDGER_UNAVAILABLE`: now `400 BAD_QUERY` naming the parameter, on /deprecations and
    on the status page."""
    from tests.gateway_testlib import make_config

    gw = await start_gateway(make_config(upstream.url, routes=guarded_routes(), usage={"ledger": {"url": ledger_url}}))
    admin = await start_admin(gw)
    bad = {
        "since=999999w": "outside the years 1970 to 9998",
        "since=999999h&until=999998h": "outside the years 1970 to 9998",
        "since=0001-01-01": "outside the years 1970 to 9998",
        "since=0001-01-01T00:00:00%2B14:00": "outside the years 1970 to 9998",
        "until=9999-12-31T23:59:59-14:00": "outside the years 1970 to 9998",
        "since=" + "9" * 5000: "neither a duration",
        "top=" + "9" * 5000: "top must be an integer from 1 to 1000",
        "top=0": "top must be an integer from 1 to 1000",
        "top=-1": "top must be an integer from 1 to 1000",
        "order=oldest": "order must be requests or recent",
        "tenant=acme%00": "tenant must be a name",
        "tenant=" + "a" * 65: "tenant must be a name of at most 64 characters",
        "behaviour=Legacy%20Uploads": "behaviour must be a name",
    }
    async with aiohttp.ClientSession() as client:
        for query, message in bad.items():
            for path in ("/deprecations", "/status.json"):
                async with client.get(f"{admin}{path}?{query}") as resp:
                    body = await resp.json()
                    assert (resp.status, body["code"]) == (400, "BAD_QUERY"), (path, query, body)
                    assert message in body["message"], (path, query, body)
        # The extremes that are fine: the epoch, the last year, the most clients, a long tenant name.
        for query in ("since=1970-01-01T00:00:00Z", "until=9998-12-31", "top=1000", "tenant=" + "a" * 64):
            async with client.get(f"{admin}/deprecations?{query}") as resp:
                assert resp.status == 200, (query, await resp.text())


async def test_rows_the_database_refuses_do_not_hold_back_every_company_s_usage(
        postgres: Any, postgres_url: str, upstream: RecordingUpstream, tmp_path: Path) -> None:
    """A PostgreSQL ledger whose encoding (LATIN1) lacks a character one client sends in its User-Agent: the
    database refuses that client's row, for what it holds, as it refuses a name longer than a column. The row is
    left out (its requests still in the totals, as untracked), counted as dropped (refused) and logged once; every
    other request is written, then and later. Before, the whole batch was refused at every retry and every
    company's usage was held in memory until it was lost."""
    url = postgres.url(postgres.create_database(encoding="LATIN1"))
    proc = await start(_config(upstream.url, url, flush_interval=0.2), tmp_path)
    try:
        async with aiohttp.ClientSession() as client:
            for token, agent, host, count in (("snowman", "legacy-uploader/2.1 \u2603", "127.0.0.1", 3),
                                              ("plain", UA, "127.0.0.1", 4), ("oldco-client", UA, "old.test", 2)):
                for _ in range(count):
                    async with client.put(proc.url + "/api/v1/cards/1/files", data=b"x",
                                          headers={"Authorization": f"Bearer {token}", "User-Agent": agent,
                                                   "Host": host}) as resp:
                        assert resp.status == (200 if host == "old.test" else 403)

        async def settled(refused: float) -> bool:
            metrics = await proc.metrics()
            return metrics.get(("gateway_usage_ledger_pending_requests", ())) == 0.0 and \
                metrics.get(("gateway_usage_ledger_dropped_requests_total", (("reason", "refused"),))) == refused

        await wait_for(lambda: settled(3.0), 15)
        await _uploads(proc, "plain", 2)  # written as ever, the refused row being gone
        await wait_for(lambda: settled(3.0), 15)
        metrics = await proc.metrics()
        report = (await proc.get_json("/deprecations?since=1h"))["behaviours"]["legacy_uploads"]
        status = await proc.get_json("/status.json")
    finally:
        proc.stop()
    assert metrics[("gateway_usage_ledger_up", ())] == 1.0
    assert (report["requests"], report["untracked_clients_requests"], report["clients"]) == (11, 3, 2)
    assert report["by_tenant"] == {"acme": {"blocked": 9}, "oldco": {"allowed": 2}}
    assert {(r["client"], r["requests"]) for r in report["top_clients"]} == {
        (token_fingerprint("Bearer plain"), 6), (token_fingerprint("Bearer oldco-client"), 2)}
    assert status["ledger"]["state"] == "ok" and "refused" in status["ledger"]["refused"]
    log = proc.log.read_text()
    assert log.count("the database refused the rows of 3 counted request(s)") == 1, log[-3000:]
    assert "cannot write" not in log


async def test_a_ledger_file_deleted_under_load_is_made_again_at_its_path(upstream: RecordingUpstream,
                                                                         tmp_path: Path) -> None:
    """The SQLite file deleted while the gateway counts under load: the next write notices (the file at the path is
    not the one open), makes a new file there and writes what it held into it; one log line, a metric and the status
    page say so, and `gateway usage` reads every request counted since the last write to the deleted file. Before,
    the gateway kept writing the unlinked file: nothing at the path, `gateway usage` found nothing, a restart started
    empty. (Writes here are those reads make, which write first: the test knows what went to each file.)"""
    path = tmp_path / "usage.sqlite3"
    proc = await start(_config(upstream.url, f"sqlite:///{path}", flush_interval=3600), tmp_path)
    sent = 0
    stop = asyncio.Event()

    async def load() -> None:
        nonlocal sent
        async with aiohttp.ClientSession() as client:
            while not stop.is_set():
                async with client.put(proc.url + "/api/v1/cards/1/files", data=b"x",
                                      headers={"Authorization": f"Bearer client-{sent % 5}", "User-Agent": UA}) as resp:
                    assert resp.status == 403
                sent += 1

    async def written() -> int:
        report = await proc.get_json("/deprecations?since=1h")  # this process's counts written first
        return int(report["behaviours"].get("legacy_uploads", {}).get("requests", 0))

    try:
        task = asyncio.create_task(load())
        await asyncio.sleep(0.5)
        before = await written()  # in the file that is about to go
        path.unlink()
        await asyncio.sleep(1.0)  # the load goes on
        after = await written()  # this write notices, and makes a new file
        stop.set()
        await task
        metrics = await proc.metrics()
        status = await proc.get_json("/status.json")
    finally:
        proc.stop()  # its last write: what was counted since, into the new file
    assert before > 0 and path.exists()
    assert metrics[("gateway_usage_ledger_reopened_total", ())] == 1.0 and metrics[("gateway_usage_ledger_up", ())]
    assert status["ledger"]["state"] == "ok" and "the file was deleted while in use" in status["ledger"]["notice"]
    log = proc.log.read_text()
    assert log.count("the file was deleted while in use; a new one was made at its path") == 1, log[-2000:]
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, lambda: _usage(proc.config_path, "--since", "1h", "--json"))
    assert out.returncode == 0, out.stderr
    in_new = json.loads(out.stdout)["behaviours"]["legacy_uploads"]["requests"]
    print(f"{sent} requests: {before} in the deleted file, {in_new} in the new one ({after} at the first read)")
    assert 0 < after <= in_new == sent - before
