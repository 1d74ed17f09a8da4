"""``gateway serve --workers N``: N worker processes sharing one port (SO_REUSEPORT) under a small supervisor, which
passes on the signals, restarts a worker that dies, and removes its directories however it ends (docs/operations.md,
"Processes and signals"). Metrics are aggregated with prometheus-client's multiprocess mode; each worker writes its
own usage to the ledger. ``python -m gateway.ops.workers`` is the supervisor alone, which ``gateway serve`` becomes
once the config is checked: it imports this module and the log formatter, not the gateway."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from .log_format import setup_logging

__all__ = ("WORKER_DIR_ENV", "Peers", "become_supervisor", "supervise")

log = logging.getLogger("gateway.workers")

WORKER_DIR_ENV = "GATEWAY_WORKER_DIR"
# Set to 1 when the supervisor made the metrics directory (a temporary one) rather than being given it.
_OWN_METRICS_ENV = "GATEWAY_OWN_METRICS_DIR"
_SUPERVISOR_ENV = "GATEWAY_SUPERVISOR_PID"
_STOPPING = "stopping"  # made in the worker directory when the supervisor starts to stop


def become_supervisor(workers: int, worker_argv: Sequence[str], shutdown_timeout: float, log_level: str) -> NoReturn:
    """Replace this process (the same pid, for whoever started it) with a fresh interpreter that runs only the
    supervisor: the gateway this process imported to check the config is not kept for the life of the pod."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", __name__, "--workers", str(workers),
                              "--shutdown-timeout", repr(shutdown_timeout), "--log-level", log_level,
                              "--", *worker_argv])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.ops.workers",
                                     description="the supervisor of gateway serve --workers N (started by it)")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--shutdown-timeout", type=float, required=True, help="each worker's time to stop, seconds")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("worker_argv", nargs="+", help="after --: the workers' arguments to python -m gateway")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    return supervise(args.workers, args.worker_argv, args.shutdown_timeout)


def supervise(workers: int, worker_argv: Sequence[str], shutdown_timeout: float) -> int:
    """Run ``workers`` workers until SIGTERM or SIGINT, then stop them; 0 when every one stopped cleanly."""
    dirs = _Dirs()
    supervisor = _Supervisor(workers, [sys.executable, "-m", "gateway", *worker_argv], dirs)
    try:
        return supervisor.run(shutdown_timeout)
    finally:
        supervisor.kill_all()
        dirs.remove()


class _Dirs:
    """The run's metrics directory (given in the environment, or a temporary one) and its worker directory."""

    def __init__(self) -> None:
        given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.own_metrics = not given
        self.metrics = given or tempfile.mkdtemp(prefix="gateway-metrics-")
        if given:
            remove_metric_files(self.metrics)  # a previous run's counts would be added to this one's
        # Private (mkdtemp makes it 0700): where the supervisor marks that it is stopping.
        self.workers = tempfile.mkdtemp(prefix="gateway-workers-")

    def environ(self) -> dict[str, str]:
        """The workers' environment."""
        return {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self.metrics, WORKER_DIR_ENV: self.workers,
                _OWN_METRICS_ENV: "1" if self.own_metrics else "", _SUPERVISOR_ENV: str(os.getpid())}

    def remove(self) -> None:
        """The run's end: a temporary metrics directory removed, a given one emptied of its files."""
        if self.own_metrics:
            shutil.rmtree(self.metrics, ignore_errors=True)
        else:
            remove_metric_files(self.metrics)
        shutil.rmtree(self.workers, ignore_errors=True)


class _Supervisor:
    """The worker slots, each with its process (None while it waits for its back-off) and the signals to pass on."""

    def __init__(self, workers: int, command: list[str], dirs: _Dirs) -> None:
        self.command = command
        self.dirs = dirs
        self.env = dirs.environ()
        self.stopping = False
        self.pending: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.prepare = functools.partial(_prepare_worker, os.getpid())
        self.procs: list[subprocess.Popen[bytes] | None] = [self._start() for _ in range(workers)]
        self.backoff = [_Backoff(time.monotonic()) for _ in range(workers)]

    def _on_signal(self, signum: int, frame: object) -> None:
        self.pending.append(signum)

    def _start(self) -> subprocess.Popen[bytes]:
        # A worker is born with SIGHUP blocked (the mask survives fork and exec): a reload asked while it starts waits,
        # pending, until its handler is installed (gateway.cli), then reads the file again. Ignored instead, it was
        # lost: the worker served the file as it read it at start, for ever. The supervisor's own SIGHUP that comes
        # meanwhile is delivered when this returns, and passed on to every worker, this one too.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            return subprocess.Popen(self.command, env=self.env, preexec_fn=self.prepare)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})

    def run(self, shutdown_timeout: float) -> int:
        """Pass signals on and replace dead workers until told to stop, then stop the workers."""
        while True:
            self._pass_on_signals()
            self._reap(time.monotonic())
            if self.stopping:
                return self._stop(shutdown_timeout)
            time.sleep(0.1)

    def _alive(self) -> list[subprocess.Popen[bytes]]:
        return [proc for proc in self.procs if proc is not None and proc.poll() is None]

    def _pass_on_signals(self) -> None:
        while self.pending:
            signum = self.pending.pop(0)
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.stopping = True
                # Before the signal: a worker still starting ignores it, and looks for this mark once its own
                # handlers are set (``Peers.stopping``).
                Path(self.dirs.workers, _STOPPING).touch()
            for proc in self._alive():
                proc.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    def _reap(self, now: float) -> None:
        for slot in range(len(self.procs)):
            self._reap_slot(slot, now)

    def _reap_slot(self, slot: int, now: float) -> None:
        proc = self.procs[slot]
        if proc is not None:
            code = proc.poll()
            if code is None:
                return
            self._dead(slot, proc, code, now)
        if not self.stopping and self.backoff[slot].due <= now:  # a slot without a worker, its back-off over
            self.procs[slot] = self._start()
            self.backoff[slot].started = now

    def _dead(self, slot: int, proc: subprocess.Popen[bytes], code: int, now: float) -> None:
        _mark_dead(proc.pid, self.dirs.metrics)
        self.procs[slot] = None
        if not self.stopping:
            delay = self.backoff[slot].died(now)
            log.error("worker %s exited with %s after %.1f s; starting another in %.0f s",
                      proc.pid, code, now - self.backoff[slot].started, delay)

    def _stop(self, shutdown_timeout: float) -> int:
        running = [proc for proc in self.procs if proc is not None]
        deadline = time.monotonic() + shutdown_timeout + 5
        for proc in running:
            _wait_or_kill(proc, deadline)
        self.procs = []
        return 0 if all(proc.returncode == 0 for proc in running) else 1

    def kill_all(self) -> None:
        """Kill the workers still running (the supervisor is leaving without having stopped them)."""
        for proc in self._alive():
            proc.kill()


def _wait_or_kill(proc: subprocess.Popen[bytes], deadline: float) -> None:
    try:
        proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        log.error("worker %s did not stop in time; killing it", proc.pid)
        proc.kill()
        proc.wait()


# A worker that dies within _YOUNG seconds of its start, again, is started anew after a delay that doubles from 1 s up
# to _MAX_DELAY: a crash loop slows down (and its log lines with it); a lone crash is replaced at once.
_YOUNG = 60.0
_MAX_DELAY = 30.0


class _Backoff:
    """When a worker slot is started again after its worker died."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.young_deaths = 0  # deaths in a row of workers that had run less than _YOUNG seconds
        self.due = started

    def died(self, now: float) -> float:
        """The delay before the slot's next start, its worker having just died at ``now``."""
        self.young_deaths = self.young_deaths + 1 if now - self.started < _YOUNG else 0
        delay = 0.0 if self.young_deaths <= 1 else min(_MAX_DELAY, 2.0 ** (self.young_deaths - 2))
        self.due = now + delay
        return delay


_METRIC_FILE_RE = re.compile(r"^[a-z]+(?:_[a-z]+)?_(\d+)\.db$")  # prometheus-client's <kind>[_<mode>]_<pid>.db


def _remove_if_empty(*directories: str | None) -> None:
    """Each directory given, once empty (the last worker to leave removes it)."""
    for directory in directories:
        if directory:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def remove_metric_files(directory: str, *, keep_running: bool = False) -> None:
    """prometheus-client's files in ``directory``; with ``keep_running``, not those of processes still running."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if _removable(name, keep_running):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def _removable(name: str, keep_running: bool) -> bool:
    """Whether ``name`` is a metric file to remove: prometheus-client's, and (``keep_running``) this process's or that
    of a process no longer running."""
    match = _METRIC_FILE_RE.match(name)
    if match is None:
        return False
    pid = int(match.group(1))
    return not (keep_running and pid != os.getpid() and _running(pid))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prepare_worker(supervisor: int) -> None:
    """Runs in the worker between fork and exec; ``supervisor``: the supervisor's pid."""
    # SIGTERM is ignored until the worker's own handler is installed, so that a worker stopped while it starts still
    # leaves through its own exit (its files removed): once its handlers are installed it stops at once if the
    # supervisor has gone or is stopping meanwhile (``Peers``). SIGHUP is blocked, not ignored (``start``).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


class Peers:
    """A worker's view of its run: whether the supervisor is stopping or gone, and the clean-up after it."""

    def __init__(self, directory: str, supervisor: int | None = None) -> None:
        self.directory = Path(directory)
        self.supervisor = os.getppid() if supervisor is None else supervisor

    def stopping(self) -> bool:
        """Whether the supervisor was told to stop (its SIGTERM may have come while this worker ignored it)."""
        return (self.directory / _STOPPING).exists()

    def orphaned(self) -> bool:
        """Whether the supervisor is gone (killed: it could not stop this worker, or clean up after the run)."""
        return os.getppid() != self.supervisor

    def leave(self, environ: Mapping[str, str] = os.environ) -> None:
        """This worker's exit. When the supervisor is gone (killed: nobody else will clean up), each worker removes
        its own metric files and those of workers no longer running, then the directories if they are empty, so
        that the last to leave leaves nothing."""
        if not self.orphaned():
            return  # the supervisor removes the directories when it exits
        metrics_dir = environ.get("PROMETHEUS_MULTIPROC_DIR")
        if metrics_dir:
            remove_metric_files(metrics_dir, keep_running=True)
        (self.directory / _STOPPING).unlink(missing_ok=True)
        _remove_if_empty(str(self.directory), metrics_dir if environ.get(_OWN_METRICS_ENV) == "1" else None)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Peers | None:
        """The worker's peers under ``gateway serve --workers N``; None for a single process."""
        directory = environ.get(WORKER_DIR_ENV)
        supervisor = environ.get(_SUPERVISOR_ENV, "")
        return cls(directory, supervisor=int(supervisor) if supervisor.isdigit() else None) if directory else None


if __name__ == "__main__":
    sys.exit(main())
