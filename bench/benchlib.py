"""What every benchmark script needs of the machine: free ports, waiting for a listener, and a process's memory
and CPU from /proc. Imported as ``benchlib`` (the scripts run as ``.venv/bin/python bench/NAME.py``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ("HOST", "cpu_seconds", "free_port", "percentile", "proc_status", "stop_all", "tool", "wait_port")

HOST = "127.0.0.1"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until something accepts connections on ``port``; RuntimeError after ``timeout``, or at once if ``proc`` (the
    process that should listen) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited early with {proc.returncode}: {proc.args!r}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def tool(name: str, install: str = "nginx-light wrk curl") -> str:
    """The path of a program the benchmark runs (nginx is in /usr/sbin, often not on PATH); exits, naming the Debian
    packages to install, when it is missing."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if path is None:
        raise SystemExit(f"{name} not found: apt-get install -y {install}")
    return path


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_status(pid: int, key: str) -> int | None:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM), in bytes; None when the process or the field is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def family_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` of a process and its children (nginx's master and its workers): live children only, so read it
    before and after a run of processes that stay up."""
    total = cpu_seconds(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += cpu_seconds(int(child))
    return total


def stop_all(procs: list[subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    """SIGTERM to every process still running, then each waited for (killed after ``timeout`` seconds)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
