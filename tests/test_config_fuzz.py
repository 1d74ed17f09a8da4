"""The shipped config, mutated (types, values, keys) by Hypothesis: `check-config`, `rollout` and `serve` each exit
0 or 2, with a message on 2; never a traceback, never exit 1.

The three commands run in-process through `gateway.cli.main` (fast enough for many examples); `serve` runs all of
its start-up (the config, the gateway, its chains and policies, the admin app) and is stopped where it would bind
its listening socket. A few real `gateway` processes run the same commands on hand-picked mutations at the end.
`GATEWAY_FUZZ=explore` runs many more, random examples (the default is a fixed, quick set for CI).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import cli, lifecycle

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "config/gateway.yaml"

settings.register_profile("ci", max_examples=50, deadline=None, database=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("explore", max_examples=3000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PROFILE = "explore" if os.environ.get("GATEWAY_FUZZ") == "explore" else "ci"


class Plain(str):
    """Written as a plain (unquoted) YAML scalar, as an operator types it: `2026-02-30` reaches the loader as YAML
    would read it from a file, not as a quoted string."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(Plain, lambda d, v: d.represent_scalar("tag:yaml.org,2002:timestamp", str(v)))


def shipped() -> dict[str, Any]:
    data = yaml.safe_load(SHIPPED.read_text())  # dates as YAML reads them: written back unquoted
    assert isinstance(data, dict)
    return data


def paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key and item of the config, parents before children."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i))


PATHS = list(paths(shipped()))

_DATEISH = [
    "2026-12-32", "2026-13-01", "2026-02-30", "2026-02-29", "2028-02-29", "2026-10-01T25:00:00", "2026-10-01T23:60:00",
    "2026-10-01 10:00:00", "2026-10-01T10:00:00Z", "2026-10-01T10:00:00+25:00", "0001-01-01", "9999-12-31",
    "1969-12-31", "2026-1-1", "2026/12/01", "tomorrow", "2026-10-01T10:00:00.123456789+02:00",
]
# Values YAML can hold, each as an operator could write it where another kind of value is meant.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", " ", "${NOT_SET_ANYWHERE}", "$$", "http://u:p w@h", "*.", "[::1]:80", "../..", "UTC",
                     "Etc/GMT+14", "a" * 300, "\x00", "\u202e", "GET", "/boards/{board_id}", "remove_key"]),
    st.sampled_from(_DATEISH).map(Plain),
    st.dates().map(lambda d: Plain(d.isoformat())),
    st.datetimes(timezones=st.sampled_from([None, dt.UTC, dt.timezone(dt.timedelta(hours=14))])).map(
        lambda d: Plain(d.isoformat())),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=6)


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    data = shipped()
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = data
        try:
            for part in path[:-1]:
                parent = parent[part]
            here = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation changed this part of the tree
        kind = draw(st.sampled_from(["value", "value", "value", "delete", "add_key", "rename", "wrap", "date"]))
        key = path[-1]
        if kind == "value":
            parent[key] = draw(VALUES)
        elif kind == "date":
            parent[key] = Plain(draw(st.sampled_from(_DATEISH)))
        elif kind == "delete":
            del parent[key]
        elif kind == "wrap":
            parent[key] = [here]
        elif kind == "add_key" and isinstance(here, dict):
            here[draw(st.text(min_size=1, max_size=12))] = draw(VALUES)
        elif kind == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = parent.pop(key)
    return data


class Reached(Exception):
    """`serve` got past every config check and start-up step: it was about to bind its listening socket."""


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except Reached:
            code = 0
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture
def no_clock_override(monkeypatch: pytest.MonkeyPatch, workdir: Path) -> Iterator[None]:
    monkeypatch.delenv("GATEWAY_NOW", raising=False)
    # `serve` starts the usage ledger, at its default a file in the working directory: the test's, not the repository.
    monkeypatch.chdir(workdir)

    def reached(*args: Any, **kwargs: Any) -> Any:
        raise Reached

    monkeypatch.setattr(lifecycle, "listening_socket", reached)
    yield


def check(code: int, out: str, err: str, what: str) -> None:
    assert code in (0, 2), f"{what}: exit {code}\n{err}"
    assert "Traceback" not in out + err, f"{what}:\n{err}"
    if code == 2:
        assert err.strip(), f"{what}: exit 2 without a message"


@settings.get_profile(PROFILE)  # type: ignore[misc]
@given(data=mutations())
def test_mutated_shipped_config_exits_0_or_2(data: dict[str, Any], workdir: Path, no_clock_override: None) -> None:
    path = workdir / "mutated.yaml"
    try:
        text = yaml.dump(data, Dumper=_Dumper, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:
        return  # not every Python value has a YAML spelling (a key YAML cannot write)
    path.write_text(text, encoding="utf-8")
    for argv in (["check-config", str(path)], ["rollout", "--config", str(path)],
                 ["serve", "--config", str(path), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]):
        code, out, err = run(argv)
        check(code, out, err, f"{argv[0]} on\n{text}")
        if argv[0] == "check-config" and code == 2:
            # Every problem of a file names where it is: a line and a path; only a top-level key the file lacks
            # (or the file's whole shape) has no line to name.
            for line in err.rstrip("\n").split("\n")[1:]:
                path = line.strip().partition(": ")[0]
                assert line.startswith("  line ") or path == "(top level)" or (
                    path.isidentifier() and path not in data), err


# --- the same, as real processes ---------------------------------------------------------------------------------

_BY_HAND: list[tuple[str, str, str]] = [
    ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-12-32", "rollout.board_cards_cap"),
    ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-02-30T25:00:00", "rollout.board_cards_cap"),
    ("created: 2026-06-01", "created: 99999999999999999999999999", "tenants[0].created"),
    ("brownouts: []", "brownouts: [{start: 2026-10-20T10:00:00, end: 2026-10-20T24:30:00}]", "rollout.brownouts[0].end"),
]


@pytest.mark.parametrize(("old", "new", "where"), _BY_HAND, ids=[n for _, n, _ in _BY_HAND])
def test_real_commands_exit_2_with_the_path_and_line(tmp_path: Path, old: str, new: str, where: str) -> None:
    text = SHIPPED.read_text()
    assert old in text
    path = tmp_path / "gateway.yaml"
    path.write_text(text.replace(old, new, 1))
    line = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if new.split(":")[0] + ":" in row
                and new.split(": ", 1)[1] in row)
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_NOW"}
    for argv in (["check-config", str(path)], ["rollout", "--config", str(path)],
                 ["serve", "--config", str(path), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]):
        proc = subprocess.run([sys.executable, "-m", "gateway", *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert f"line {line}: {where}:" in proc.stderr, proc.stderr
