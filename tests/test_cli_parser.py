"""The command line is consistent: every subcommand and option says what it is for, every subcommand that reads a
configuration file takes it as --config with the same default, and check-config also keeps its positional form."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli import DEFAULT_CONFIG, _parser, main

ROOT = Path(__file__).resolve().parent.parent


def _subcommands() -> dict[str, tuple[argparse.ArgumentParser, str | None]]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    return {name: (subparser, helps.get(name)) for name, subparser in sub.choices.items()}


def test_every_subcommand_and_option_has_a_help_line() -> None:
    commands = _subcommands()
    assert {"serve", "check-config", "rollout", "usage"} <= set(commands)
    for name, (subparser, help_line) in commands.items():
        assert help_line, f"gateway {name}: no help line in `gateway --help`"
        for action in subparser._actions:
            if action.help == argparse.SUPPRESS and action.option_strings == ["--reuse-port"]:
                continue  # internal: set by `serve --workers` on its workers' command lines
            label = "/".join(action.option_strings) or action.dest
            assert action.help and action.help != argparse.SUPPRESS, f"gateway {name} {label}: no help line"


def test_every_subcommand_reading_a_config_takes_config_with_one_default() -> None:
    for name in ("serve", "check-config", "rollout"):
        subparser = _subcommands()[name][0]
        option = next(a for a in subparser._actions if "--config" in a.option_strings)
        assert option.metavar == "FILE" and DEFAULT_CONFIG in (option.help or "")
        assert subparser.parse_args(["--config", "x.yaml"]) is not None


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _check_config(*args: str) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["check-config", *args])
    finally:
        os.chdir(cwd)
    return Ran(code, out.getvalue(), err.getvalue())


def test_check_config_takes_the_file_either_way_and_defaults_like_serve(tmp_path: Path) -> None:
    positional, option, default = _check_config(DEFAULT_CONFIG), _check_config("--config", DEFAULT_CONFIG), \
        _check_config()
    assert positional.returncode == option.returncode == default.returncode == 0, option.stderr
    assert positional.stdout == option.stdout == default.stdout
    assert positional.stdout.startswith(f"{DEFAULT_CONFIG}: OK")
    # The option reads the file it names, like the positional form (a missing file is exit 2, named).
    missing = _check_config("--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr


@pytest.mark.parametrize("args", [("a.yaml", "--config", "b.yaml"), ("--config", "b.yaml", "a.yaml")])
def test_check_config_refuses_two_different_files(args: tuple[str, ...]) -> None:
    out = _check_config(*args)
    assert out.returncode == 2 and "give the configuration file once" in out.stderr
    assert out.stdout == ""
