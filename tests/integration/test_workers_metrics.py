"""`gateway serve --workers N`: /metrics never fails a scrape (at start-up, while a worker restarts, at shutdown),
the workers start without prometheus-client's "Clearing labels" warning, and the run leaves nothing in the temporary
directory, however the supervisor ends."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.ops.metrics import Metrics
from tests.gateway_testlib import ADMIN_HEADERS, RecordingUpstream, free_port
from tests.process_testlib import ROOT, config as process_config, samples, wait_for, write_config


def _counter_file(directory: Path, pid: int, value: float) -> None:
    """A worker's counter file, as prometheus-client writes it."""
    # prometheus-client's mmap_dict has no annotations (no-untyped-call).
    data = MmapedDict(str(directory / f"counter_{pid}.db"))  # type: ignore[no-untyped-call]
    key = mmap_key("gateway_refused_requests", "gateway_refused_requests_total", ["code"], ["BAD_PATH"],
                   "Requests refused before routing, by reason code.")
    data.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
    data.close()  # type: ignore[no-untyped-call]


def test_a_scrape_reads_the_files_that_are_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus-client makes a worker's file by opening it (empty), then sizing it and writing its header: a scrape
    that lists the directory in between finds a file its reader cannot unpack. Also: a file listed that is gone by the
    time it is read (a dead worker's live gauge, cleared by the supervisor)."""
    _counter_file(tmp_path, 101, 3)
    _counter_file(tmp_path, 102, 4)
    (tmp_path / "counter_103.db").touch()  # a worker between creating its file and writing the header
    (tmp_path / "gauge_livesum_104.db").symlink_to(tmp_path / "gone.db")  # listed, then removed
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(tmp_path))  # type: ignore[no-untyped-call]  # prometheus-client: unannotated
    with pytest.raises(struct.error):  # what a scrape met before: a 500
        generate_latest(registry)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = Metrics(CollectorRegistry(), multiprocess=True).scrape().decode()
    assert samples(text)[("gateway_refused_requests_total", (("code", "BAD_PATH"),))] == 7.0


def test_a_file_that_vanishes_while_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _counter_file(tmp_path, 101, 3)
    _counter_file(tmp_path, 102, 4)
    read = MmapedDict.read_all_values_from_file

    def vanishing(filename: str) -> Any:
        if filename.endswith("_102.db"):
            os.unlink(filename)  # the worker left between the listing and the read
            raise FileNotFoundError(filename)
        return read(filename)  # type: ignore[no-untyped-call]  # prometheus-client: unannotated

    monkeypatch.setattr(MmapedDict, "read_all_values_from_file", staticmethod(vanishing))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = Metrics(CollectorRegistry(), multiprocess=True).scrape().decode()
    assert samples(text)[("gateway_refused_requests_total", (("code", "BAD_PATH"),))] == 3.0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _native_modules(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {name for name in ("_jsonscan", "_http_parser") if f"/{name}." in maps}


def _listening(pid: int) -> bool:
    try:
        return any(Path(f"/proc/{pid}/fd/{fd}").readlink().name.startswith("socket:")
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _stuck(pid: int, log: Path) -> str:
    """What a failed stop leaves to read: the processes still there, where each waits, and the end of the log."""
    states = []
    for each in [pid, *_children(pid)]:
        try:
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{each}/status").read_text().splitlines()
                          if ":\t" in line)
            wchan = Path(f"/proc/{each}/wchan").read_text()
            threads = len(os.listdir(f"/proc/{each}/task"))
            states.append(f"{each}: {status.get('State')} wchan={wchan} threads={threads} "
                          f"SigIgn={status.get('SigIgn')} SigCgt={status.get('SigCgt')}")
        except OSError as err:
            states.append(f"{each}: {err}")
    return "\n".join(states) + "\n--- log ---\n" + log.read_text(errors="replace")[-4000:]


async def test_scrapes_never_fail_from_start_to_exit(upstream: RecordingUpstream, tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    path = tmp_path / "gateway.yaml"
    write_config(path, process_config(upstream.url, port, admin))
    run_tmp = tmp_path / "tmp"
    run_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"} | {"TMPDIR": str(run_tmp)}
    log = tmp_path / "gateway.log"
    answers: list[int] = []
    done = asyncio.Event()

    async def scrape_all_along() -> None:
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client:
            while not done.is_set():
                try:
                    async with client.get(f"http://127.0.0.1:{admin}/metrics",
                                          headers={"Connection": "close"}) as resp:
                        await resp.read()
                        answers.append(resp.status)
                except (aiohttp.ClientError, OSError):
                    pass  # nothing listens yet, or any more
                await asyncio.sleep(0.005)

    scraper = asyncio.create_task(scrape_all_along())
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        async def both_listening() -> bool:
            assert proc.poll() is None, log.read_text()
            children = _children(proc.pid)
            return len(children) == 2 and all(_listening(c) for c in children)

        async def both_listening_and_scraped() -> bool:
            return await both_listening() and bool(answers)

        await wait_for(both_listening_and_scraped, 20)
        started = len(answers)
        # The supervisor is the same process, become a fresh interpreter that runs only the supervisor: none of the
        # gateway's native modules (its JSON scanner, aiohttp's parser) are loaded in it; they are in each worker.
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"gateway.ops.workers"]
        assert not _native_modules(proc.pid)
        assert all(_native_modules(child) == {"_jsonscan", "_http_parser"} for child in _children(proc.pid))
        victim = _children(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)  # the supervisor restarts it

        async def restarted() -> bool:
            children = _children(proc.pid)
            return victim not in children and len(children) == 2 and all(_listening(c) for c in children)

        await wait_for(restarted, 20)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        try:
            code = await loop.run_in_executor(None, proc.wait, 20)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, _stuck(proc.pid, log)
    finally:
        done.set()
        await scraper
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert started > 0 and len(answers) > started, answers
    assert set(answers) == {200}, [a for a in answers if a != 200]
    text = log.read_text()
    assert "Clearing labels" not in text and "Traceback" not in text, text
    assert list(run_tmp.iterdir()) == [], "the supervisor removes its directories"


async def test_a_killed_supervisor_leaves_nothing_behind(upstream: RecordingUpstream, tmp_path: Path) -> None:
    """SIGKILL: the supervisor cannot clean up; its workers are stopped (PDEATHSIG), and the last to leave removes
    the run's directories. Killed while its workers still start, too."""
    for wait_until_listening in (True, False):
        port, admin = free_port(), free_port()
        path = tmp_path / "gateway.yaml"
        write_config(path, process_config(upstream.url, port, admin))
        run_tmp = tmp_path / f"tmp-{wait_until_listening}"
        run_tmp.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"} | {"TMPDIR": str(run_tmp)}
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        children: list[int] = []

        async def started() -> bool:
            nonlocal children
            children = _children(proc.pid)
            return len(children) == 2 and (not wait_until_listening or all(_listening(c) for c in children))

        try:
            await wait_for(started, 20)
        finally:
            proc.kill()
            proc.wait(5)

        async def gone() -> bool:
            return not any(Path(f"/proc/{c}").exists() and "zombie" not in Path(f"/proc/{c}/status").read_text()
                           for c in children)

        await wait_for(gone, 15)
        await wait_for(lambda: _empty(run_tmp), 5)


async def _empty(directory: Path) -> bool:
    return not list(directory.iterdir())


async def test_a_given_metrics_directory_is_emptied_at_start_and_exit(upstream: RecordingUpstream,
                                                                     tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    path = tmp_path / "gateway.yaml"
    write_config(path, process_config(upstream.url, port, admin))
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    _counter_file(metrics_dir, 4242, 1000)  # a previous run's count: not this run's
    (metrics_dir / "notes.txt").write_text("the operator's own file stays")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def scraped() -> bool:
            try:
                async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client, \
                        client.get(f"http://127.0.0.1:{admin}/metrics") as resp:
                    return resp.status == 200 and "gateway_build_info" in await resp.text()
            except aiohttp.ClientError:
                return False

        await wait_for(scraped, 20)
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as client, \
                client.get(f"http://127.0.0.1:{admin}/metrics") as resp:
            assert ("gateway_refused_requests_total", (("code", "BAD_PATH"),)) not in samples(await resp.text())
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.get_running_loop().run_in_executor(None, proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert sorted(p.name for p in metrics_dir.iterdir()) == ["notes.txt"]
