"""``gateway serve --workers N``: N worker processes sharing one port (SO_REUSEPORT), under a small supervisor.

The supervisor owns the signals: SIGTERM/SIGINT and SIGHUP are passed to every worker; a worker that dies on its
own is restarted (at most once a second). Metrics are aggregated across workers with prometheus-client's
multiprocess mode: every worker writes to one directory, and whichever worker answers /metrics reads them all.

Each worker writes its own share of the usage it counted to the usage ledger (``gateway.ops.ledger``), so the
usage report (admin /deprecations, the status page), read from the ledger, is the whole process's whichever worker
answers.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

__all__ = ("supervise",)

log = logging.getLogger("gateway.workers")


def supervise(workers: int, worker_argv: Sequence[str], shutdown_timeout: float) -> int:
    own_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="gateway-metrics-")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    command = [sys.executable, "-m", "gateway", *worker_argv]
    stopping = False
    pending: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        pending.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    prepare = functools.partial(_prepare_worker, os.getpid())

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, preexec_fn=prepare)

    procs = [start() for _ in range(workers)]
    last_restart = 0.0
    try:
        while procs:
            while pending:
                signum = pending.pop(0)
                if signum in (signal.SIGTERM, signal.SIGINT):
                    stopping = True
                for proc in procs:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)
            for proc in list(procs):
                code = proc.poll()
                if code is None:
                    continue
                _mark_dead(proc.pid, metrics_dir)
                if stopping:
                    procs.remove(proc)
                    continue
                log.error("worker %s exited with %s; starting another", proc.pid, code)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - last_restart)))
                last_restart = time.monotonic()
                procs[procs.index(proc)] = start()
            if stopping and procs:
                deadline = time.monotonic() + shutdown_timeout + 5
                for proc in procs:
                    try:
                        proc.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        log.error("worker %s did not stop in time; killing it", proc.pid)
                        proc.kill()
                        proc.wait()
                codes = [proc.returncode for proc in procs]
                procs = []
                return 0 if all(code == 0 for code in codes) else 1
            time.sleep(0.1)
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _prepare_worker(supervisor: int) -> None:
    """Runs in the worker between fork and exec; ``supervisor``: the supervisor's pid."""
    # A reload during start-up must not kill the worker: SIGHUP is ignored until its own handler is installed.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # If the supervisor dies without stopping it (SIGKILL, OOM), the worker is told to stop too (Linux).
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != supervisor:
        os._exit(1)  # the supervisor died between fork and prctl: nobody would ever stop this worker


_PR_SET_PDEATHSIG = 1


def _mark_dead(pid: int, metrics_dir: str) -> None:
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - cleanup of a dead worker's gauge files is best effort
        log.debug("could not mark worker %s dead", pid, exc_info=True)
