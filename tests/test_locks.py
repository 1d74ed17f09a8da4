"""The two locks: requirements.lock pins what the gateway needs to run and nothing more (the demo's install, the
image's constraint), requirements-test.lock the test tools on top; both exact, both agreeing with pyproject.toml.
scripts/bootstrap.sh installs the first alone, and both with --test (scripts/test.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from importlib.metadata import distribution, requires
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_LOCK = ROOT / "requirements.lock"
TEST_LOCK = ROOT / "requirements-test.lock"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lines(lock: Path) -> list[str]:
    return [line.strip() for line in lock.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _pins(lock: Path) -> dict[str, str]:
    return {_norm(name): version for name, _, version in (line.partition("==") for line in _lines(lock))
            if not name.startswith("-")}


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution ``requirements`` bring, extras followed (psycopg[binary] brings psycopg-binary), by the
    metadata of what is installed (installed from the locks)."""
    todo = [(Requirement(r), "") for r in requirements]
    done: set[tuple[str, str]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        for wanted in ("", *sorted(req.extras)):
            if (_norm(req.name), wanted) not in done:
                done.add((_norm(req.name), wanted))
                todo.extend((Requirement(r), wanted) for r in requires(req.name) or [])
    return {name for name, _ in done}


def test_every_line_of_both_locks_is_an_exact_pin() -> None:
    for lock in (RUNTIME_LOCK, TEST_LOCK):
        for line in _lines(lock):
            if line == "-r requirements.lock" and lock == TEST_LOCK:
                continue
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+", line), f"{lock.name}: {line}"


def test_the_runtime_lock_pins_what_the_gateway_needs_and_nothing_more() -> None:
    needed = _closure(PROJECT["dependencies"])
    pinned = set(_pins(RUNTIME_LOCK))
    assert not needed - pinned, f"needed by the gateway, not pinned: {sorted(needed - pinned)}"
    assert not pinned - needed, f"pinned in requirements.lock, not needed to run: {sorted(pinned - needed)}"


def test_the_test_lock_pins_the_test_tools_on_top_of_the_runtime_lock() -> None:
    assert _lines(TEST_LOCK)[0] == "-r requirements.lock"
    runtime, tools = set(_pins(RUNTIME_LOCK)), set(_pins(TEST_LOCK))
    assert not runtime & tools, f"pinned in both locks: {sorted(runtime & tools)}"
    needed = _closure(PROJECT["optional-dependencies"]["test"]) - runtime
    assert not needed - tools, f"needed by the tests, not pinned: {sorted(needed - tools)}"
    assert not tools - needed, f"pinned in requirements-test.lock, not needed: {sorted(tools - needed)}"


def test_pyproject_admits_every_locked_version_and_the_venv_has_it() -> None:
    pins = {**_pins(RUNTIME_LOCK), **_pins(TEST_LOCK)}
    for line in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["test"]]:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        assert req.specifier.contains(pins[_norm(req.name)], prereleases=True), (line, pins[_norm(req.name)])
    for name, version in pins.items():
        assert distribution(name).version == version, f"{name}: .venv has {distribution(name).version}, lock {version}"


def _bootstrap_copy(tmp_path: Path) -> tuple[Path, Path]:
    """scripts/bootstrap.sh in a copy of what it reads, with a .venv whose python only logs its arguments."""
    for part in ("scripts/bootstrap.sh", "requirements.lock", "requirements-test.lock", "pyproject.toml", "setup.py",
                 "gateway/policies/board_cards/_jsonscan.c"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / part, tmp_path / part)
    (tmp_path / "gateway/policies/board_cards/_jsonscan.so").touch()  # built already: not a reason to install again
    log = tmp_path / "pip.log"
    python = tmp_path / ".venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    python.chmod(0o755)
    return tmp_path / "scripts/bootstrap.sh", log


def test_bootstrap_installs_the_runtime_alone_and_the_test_tools_only_when_asked(tmp_path: Path) -> None:
    script, log = _bootstrap_copy(tmp_path)
    env = {**os.environ, "PYTHON": shutil.which("python3") or "python3"}

    def run(*args: str) -> list[str]:
        """What each pip install of the run installed (its arguments after pip's own options)."""
        log.unlink(missing_ok=True)
        out = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=30, env=env)
        assert out.returncode == 0, out.stderr
        lines = log.read_text().splitlines() if log.exists() else []
        prefix = "-m pip install --quiet --disable-pip-version-check "
        assert all(line.startswith(prefix) for line in lines), lines
        return [line.removeprefix(prefix) for line in lines]

    assert run() == ["-r requirements.lock", "--no-deps -e ."]
    assert run() == []  # nothing changed
    assert run("--test") == ["-r requirements-test.lock"]
    assert run("--test") == [] and run() == []
    (tmp_path / "requirements.lock").write_text(RUNTIME_LOCK.read_text() + "# changed\n")
    assert run("--test") == ["-r requirements.lock", "--no-deps -e .", "-r requirements-test.lock"]
