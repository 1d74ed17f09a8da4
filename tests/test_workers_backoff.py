"""The supervisor's restarts (``gateway serve --workers N``): a lone crash is replaced at once, a crash loop slows
down, and a stop is not held up by a pending restart."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from gateway.ops.workers import _MAX_DELAY, _YOUNG, _Backoff

ROOT = Path(__file__).resolve().parent.parent


def test_a_lone_crash_is_restarted_at_once_and_a_crash_loop_backs_off() -> None:
    backoff = _Backoff(started=100.0)
    delays = []
    now = 100.0
    for _ in range(9):
        now += 0.5  # each worker dies half a second after its start
        delays.append(backoff.died(now))
        now += delays[-1]
        backoff.started = now
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, _MAX_DELAY, _MAX_DELAY, _MAX_DELAY]
    assert backoff.due == now


def test_a_worker_that_ran_a_while_resets_the_backoff() -> None:
    backoff = _Backoff(started=0.0)
    assert [backoff.died(t) for t in (1.0, 2.0, 3.0)] == [0.0, 1.0, 2.0]
    backoff.started = 10.0
    assert backoff.died(10.0 + _YOUNG) == 0.0  # it lived _YOUNG seconds: a lone crash again
    backoff.started = 100.0
    assert backoff.died(101.0) == 0.0  # the first young death after it
    backoff.started = 101.0
    assert backoff.died(102.0) == 1.0


_SUPERVISE = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from gateway.ops.workers import supervise
sys.exit(supervise(1, ["no-such-command"], 1.0))
"""
_LINE = re.compile(r"worker \d+ exited with 2 after [\d.]+ s; starting another in (\d+) s")


def test_a_worker_that_dies_at_start_is_restarted_ever_more_slowly_and_sigterm_does_not_wait(tmp_path: Path) -> None:
    log = tmp_path / "supervisor.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", _SUPERVISE], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(_LINE.findall(log.read_text())) < 3:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        delays = [int(d) for d in _LINE.findall(log.read_text())]
        assert delays[:3] == [0, 1, 2], log.read_text()
        # Now waiting 2 s before the next start (or running the worker started after it): SIGTERM ends it at once.
        time.sleep(0.2)
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) in (0, 1)
        assert time.monotonic() - stopped_at < 1.5, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    text = log.read_text()
    assert "Traceback" not in text, text
    assert len(_LINE.findall(text)) <= 4, text  # no restart after the stop
