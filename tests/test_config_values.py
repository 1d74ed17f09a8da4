"""Every config value is read as what its key means, not as what YAML made of it, and every problem of a file names
its key's path and line: impossible dates and times, a date where text is meant and the reverse, values of the
wrong YAML type, numbers out of range, huge numbers, and YAML that cannot be a config at all."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path

import pytest

from gateway import cli
from gateway.app import load_config
from gateway.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """\
server:
  listen: "127.0.0.1:8080"
  drain_delay: 1
rollout:
  board_cards_cap: 2026-10-01
  board_cards_removal: 2026-11-01
  brownouts: []
tenants:
  - name: acme
    hosts: [acme.test]
    upstream: "http://127.0.0.1:1"
    created: 2026-06-01
routes:
  - name: board
    paths: ["/boards/{board_id}"]
    chain:
      - board_cards: {cap: 100}
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    return info.value.problems


def with_line(old: str, new: str) -> str:
    assert old in CONFIG
    return CONFIG.replace(old, new, 1)


def test_the_base_config_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    config = load_config(path, environ={})
    assert config.model.tenants[0].created == dt.date(2026, 6, 1)
    assert config.model.rollout.dates()["board_cards_cap"] == dt.date(2026, 10, 1)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # Dates YAML would have made (and failed to make) into dates: the key reads its own text.
        ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-12-32",
         "line 5: rollout.board_cards_cap: '2026-12-32' is not a date: day is out of range for month"),
        ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-13-01",
         "line 5: rollout.board_cards_cap: '2026-13-01' is not a date: month must be in 1..12"),
        ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-02-30",
         "line 5: rollout.board_cards_cap: '2026-02-30' is not a date: day is out of range for month"),
        ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-10-01T25:00:00",
         "line 5: rollout.board_cards_cap: expected a date (YYYY-MM-DD), got '2026-10-01T25:00:00'"),
        ("created: 2026-06-01", "created: 2026-02-29",
         "line 12: tenants[0].created: '2026-02-29' is not a date: day is out of range for month"),
        ("brownouts: []", "brownouts: [{start: 2026-10-20T10:00:00, end: 2026-10-20T25:00:00}]",
         "line 7: rollout.brownouts[0].end: '2026-10-20T25:00:00' is not a date and time (hour must be in 0..23)"),
        ("brownouts: []", "brownouts: [{start: 2026-10-20T10:00:00, end: 2026-10-20T10:00:00+25:00}]",
         "line 7: rollout.brownouts[0].end: '2026-10-20T10:00:00+25:00' is not a date and time"),
        # Malformed ones, as before.
        ("board_cards_cap: 2026-10-01", "board_cards_cap: 2026/12/01",
         "line 5: rollout.board_cards_cap: expected a date (YYYY-MM-DD), got '2026/12/01'"),
        ("board_cards_cap: 2026-10-01", "board_cards_cap: tomorrow",
         "line 5: rollout.board_cards_cap: expected a date (YYYY-MM-DD), got 'tomorrow'"),
        # Dates the gateway cannot place in every timezone.
        ("created: 2026-06-01", "created: 0001-01-01",
         "line 12: tenants[0].created: '0001-01-01' is outside the years 1970 to 9998"),
        ("board_cards_cap: 2026-10-01", "board_cards_cap: 9999-12-31",
         "line 5: rollout.board_cards_cap: '9999-12-31' is outside the years 1970 to 9998"),
        # A date where text is meant, and the wrong YAML type where a date is meant.
        ("name: acme", "name: 2026-01-01", "line 9: tenants[0].name: String should match pattern"),
        # A tenant name longer than the usage ledger's columns hold (PostgreSQL would refuse its every row).
        ("name: acme", "name: " + "a" * 65, "line 9: tenants[0].name: String should have at most 64 characters"),
        ("created: 2026-06-01", "created: 20260601",
         "line 12: tenants[0].created: expected a date (YYYY-MM-DD), got a number (20260601)"),
        ("created: 2026-06-01", "created: true",
         "line 12: tenants[0].created: expected a date (YYYY-MM-DD), got a boolean (true)"),
        # Strict types: YAML's true is not 1, a quoted number is not a number, a float is not an integer.
        ("drain_delay: 1", "drain_delay: true", "line 3: server.drain_delay: Input should be a valid number"),
        ("drain_delay: 1", 'drain_delay: "1"', "line 3: server.drain_delay: Input should be a valid number"),
        ("cap: 100", "cap: 100.5", "line 17: routes[0].chain[0].board_cards.cap: Input should be a valid integer"),
        ("drain_delay: 1", "drain_delay: .nan", "line 3: server.drain_delay: Input should be a finite number"),
        ("drain_delay: 1", "drain_delay: .inf", "line 3: server.drain_delay: Input should be a finite number"),
        # Out of range, however large.
        ("drain_delay: 1", "drain_delay: 100000000000000000000000000000",
         "line 3: server.drain_delay: Input should be less than or equal to 600"),
        ("drain_delay: 1", f"drain_delay: {10**400}", "line 3: server.drain_delay: Input should be a valid number"),
        ("cap: 100", f"cap: {10**30}",
         "line 17: routes[0].chain[0].board_cards.cap: Input should be less than or equal to 100000"),
        # A missing key: the line of the mapping that lacks it.
        ('    upstream: "http://127.0.0.1:1"\n', "", "line 9: tenants[0].upstream: Field required"),
        # Each policy's options as strict as the rest.
        ("{cap: 100}", '{cap: "100"}', "line 17: routes[0].chain[0].board_cards.cap: Input should be a valid integer"),
        ("{cap: 100}", "{cap: 100, signal: 1}",
         "line 17: routes[0].chain[0].board_cards.signal: Input should be a valid boolean"),
        ("{cap: 100}", '{cap: 100, backfill: {concurrency: "4"}}',
         "line 17: routes[0].chain[0].board_cards.backfill.concurrency: Input should be a valid integer"),
        # A key no section has, and a name used twice (named by the key that repeats).
        ("  drain_delay: 1", "  drain_delay: 1\n  drian_delay: 2", "line 4: server.drian_delay: Extra inputs"),
    ],
)
def test_each_problem_names_its_path_and_line(tmp_path: Path, old: str, new: str, expected: str) -> None:
    found = problems(tmp_path, with_line(old, new))
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        # Every section as strict as the server's: the upstream, the ledger, the spool.
        ('upstream:\n  read_timeout: "60"', "line 19: upstream.read_timeout: Input should be a valid number"),
        ("upstream:\n  retry_safe_methods: 1", "line 19: upstream.retry_safe_methods: Input should be a valid boolean"),
        ("upstream:\n  pool_size: 10.5", "line 19: upstream.pool_size: Input should be a valid integer"),
        ("upstream:\n  queue_timeout: .nan", "line 19: upstream.queue_timeout: Input should be a finite number"),
        ('usage:\n  ledger:\n    flush_interval: "5"',
         "line 20: usage.ledger.flush_interval: Input should be a valid number"),
        ('usage:\n  ledger:\n    enabled: "no"', "line 20: usage.ledger.enabled: Input should be a valid boolean"),
        ('spool:\n  max_bytes: "1"', "line 19: spool.max_bytes: Input should be a valid integer"),
        # The tracing section is as strict as the rest: YAML's true is not 1, a quoted number is not a number.
        ("tracing:\n  new_traces: 1", "line 19: tracing.new_traces: Input should be a valid boolean"),
        ('tracing:\n  sample_ratio: "0.5"', "line 19: tracing.sample_ratio: Input should be a valid number"),
        ("tracing:\n  sample_ratio: .nan", "line 19: tracing.sample_ratio: Input should be a finite number"),
        ("tracing:\n  sample_ratio: 1.5", "line 19: tracing.sample_ratio: Input should be less than or equal to 1"),
        ("tracing:\n  export: {enabled: 'yes'}", "line 19: tracing.export.enabled: Input should be a valid boolean"),
        ("tracing:\n  export: {timeout: .inf}", "line 19: tracing.export.timeout: Input should be a finite number"),
        ("tracing:\n  export: {endpoint: 'grpc://collector:4317'}",
         "line 19: tracing.export.endpoint: the endpoint must be an http:// or https:// URL"),
        ("tracing:\n  export: {headers: {'bad header': x}}", "line 19: tracing.export.headers: invalid header"),
        ("tracing:\n  export: {max_queue_size: 8, max_batch_size: 9}",
         "line 19: tracing.export: max_batch_size may not exceed max_queue_size"),
        ("tracing:\n  export: {client_key_file: /k.pem}",
         "line 19: tracing.export: client_certificate_file and client_key_file go together"),
        ("tracing:\n  export: {compression: zstd}",
         "line 19: tracing.export.compression: Input should be 'none' or 'gzip'"),
        ("tracing:\n  sample: 0.5", "line 19: tracing.sample: Extra inputs"),
    ],
)
def test_each_section_problem_names_its_path_and_line(tmp_path: Path, section: str, expected: str) -> None:
    found = problems(tmp_path, f"{CONFIG}{section}\n")
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # Every section: the unknown key, its line, and the known key of that mapping nearest to it.
        ("created: 2026-06-01", "crated: 2026-06-01",
         "line 12: tenants[0].crated: Extra inputs are not permitted (did you mean 'created'?)"),
        ("  drain_delay: 1", "  drian_delay: 1",
         "line 3: server.drian_delay: Extra inputs are not permitted (did you mean 'drain_delay'?)"),
        ("server:", "sever:", "line 1: sever: Extra inputs are not permitted (did you mean 'server'?)"),
        ("{cap: 100}", "{cap: 100, removel: remove_key}",
         "line 17: routes[0].chain[0].board_cards.removel: Extra inputs are not permitted (did you mean 'removal'?)"),
        ("{cap: 100}", "{cap: 100, backfill: {page_sise: 10}}", "line 17: routes[0].chain[0].board_cards.backfill"
         ".page_sise: Extra inputs are not permitted (did you mean 'page_size'?)"),
        ("    paths:", "    path:", "line 15: routes[0].path: Extra inputs are not permitted (did you mean 'paths'?)"),
        # The rollout's date flags are the policies' (checked by the registry's step): the same hint.
        ("  board_cards_cap:", "  board_cards_cpa:",
         "line 5: rollout.board_cards_cpa: Extra inputs are not permitted (did you mean 'board_cards_cap'?)"),
        ("    created: 2026-06-01", "    created: 2026-06-01\n    rollout: {board_cards_removel: 2026-12-01}",
         "line 13: tenants[0].rollout.board_cards_removel: Extra inputs are not permitted (did you mean "
         "'board_cards_removal'?)"),
        ("  brownouts: []", "  brownouts: []\n  exemptions: [{name: x, until: 2027-01-01, token_fingerprnt: abc}]",
         "line 8: rollout.exemptions[0].token_fingerprnt: Extra inputs are not permitted (did you mean "
         "'token_fingerprint'?)"),
        ("    created: 2026-06-01", "    created: 2026-06-01\n    bridges: {card_backfil: true}",
         "line 13: tenants[0].bridges.card_backfil: Extra inputs are not permitted (did you mean 'card_backfill'?)"),
        # Nothing close: no guess.
        ("created: 2026-06-01", "colour: blue", "line 12: tenants[0].colour: Extra inputs are not permitted"),
    ],
)
def test_an_unknown_key_names_the_nearest_known_one(tmp_path: Path, old: str, new: str, expected: str) -> None:
    found = problems(tmp_path, with_line(old, new))
    assert expected in found, found


def test_an_unknown_key_in_a_section_of_its_own_names_the_nearest_known_one(tmp_path: Path) -> None:
    found = problems(tmp_path, f"{CONFIG}upstream:\n  keepalive_timout: 4\nusage:\n  ledger: {{flush_intreval: 1}}\n")
    assert found == [
        "line 19: upstream.keepalive_timout: Extra inputs are not permitted (did you mean 'keepalive_timeout'?)",
        "line 21: usage.ledger.flush_intreval: Extra inputs are not permitted (did you mean 'flush_interval'?)",
    ]


def test_a_quoted_date_is_a_date_and_a_date_in_a_text_key_is_text(tmp_path: Path) -> None:
    text = with_line("created: 2026-06-01", 'created: "2026-06-01"').replace(
        "rollout:\n", "rollout:\n  exemptions: [{name: x, until: 2027-01-01, header: {name: X-Day, value: 2026-01-01}}]\n")
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    config = load_config(path, environ={})
    assert config.model.tenants[0].created == dt.date(2026, 6, 1)
    header = config.model.rollout.exemptions[0].header
    assert header is not None and header.value == "2026-01-01"


def test_a_tenant_name_used_twice_is_named_where_it_repeats(tmp_path: Path) -> None:
    text = CONFIG.replace("routes:", "  - name: acme\n    hosts: [other.test]\n    upstream: \"http://127.0.0.1:1\"\n"
                          "routes:")
    assert problems(tmp_path, text) == ["line 13: tenants[1].name: tenant name 'acme' is used twice"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: &x [*x]\n", "line 1: an alias refers to a mapping or list that contains it"),
        ("a: &x {b: *x}\n", "line 1: an alias refers to a mapping or list that contains it"),
        ("? [a, b]\n: 1\n", "line 1, column 3: invalid YAML: a key must be a plain value, not a list or mapping"),
        ("server: {listen: a}\nserver: {}\n", "line 2, column 1: invalid YAML: duplicate key 'server'"),
        ("a: [" * 2000 + "]" * 2000 + "\n", "invalid YAML: nested too deeply"),
        ("x: \x00\n", "invalid YAML: special characters are not allowed (character 4)"),
    ],
    ids=["list-alias-loop", "map-alias-loop", "list-key", "duplicate", "deep", "nul"],
)
def test_yaml_that_cannot_be_a_config(tmp_path: Path, text: str, expected: str) -> None:
    assert problems(tmp_path, text) == [expected]


def test_aliases_that_expand_without_end_are_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10**9 values
    found = problems(tmp_path, "\n".join(lines) + "\n")
    assert len(found) == 1 and "more than 100000 values (aliases included)" in found[0], found


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_bytes(b"server:\n  listen: \xff\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.problems == ["line 2: the file is not UTF-8 text (byte 19)"]


def test_an_environment_reference_keeps_its_line(tmp_path: Path) -> None:
    found = problems(tmp_path, with_line("created: 2026-06-01", "created: ${CREATED_ON}"))
    assert found == ["line 12: tenants[0].created: environment variable CREATED_ON is not set"]


def _run(*argv: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    return cli.main(list(argv)), err.getvalue()


def test_rollout_names_the_source_of_a_bad_instant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    monkeypatch.delenv("GATEWAY_NOW", raising=False)
    code, err = _run("rollout", "--config", str(path), "--at", "2026-02-30", monkeypatch=monkeypatch)
    assert code == 2 and err.startswith("gateway: --at: '2026-02-30' is not a date and time"), err
    monkeypatch.setenv("GATEWAY_NOW", "2026-10-01T25:00:00")
    code, err = _run("rollout", "--config", str(path), monkeypatch=monkeypatch)
    assert code == 2 and err.startswith("gateway: GATEWAY_NOW: '2026-10-01T25:00:00' is not a date and time"), err
    assert "--at" not in err
    # A bad date in the file is the file's problem, not --at's.
    path.write_text(with_line("board_cards_cap: 2026-10-01", "board_cards_cap: 2026-02-30"))
    monkeypatch.delenv("GATEWAY_NOW")
    code, err = _run("rollout", "--config", str(path), monkeypatch=monkeypatch)
    assert code == 2 and "line 5: rollout.board_cards_cap" in err and "--at" not in err and "GATEWAY_NOW" not in err


def test_an_instant_beyond_what_a_timezone_can_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gateway.yaml"
    monkeypatch.delenv("GATEWAY_NOW", raising=False)
    path.write_text(CONFIG.replace("rollout:\n", "rollout:\n  now: 9999-12-31T23:59:59-12:00\n"))
    code, err = _run("rollout", "--config", str(path), monkeypatch=monkeypatch)
    assert code == 2 and "rollout.now: '9999-12-31T23:59:59-12:00' is outside the years 1970 to 9998" in err, err
    path.write_text(CONFIG.replace("rollout:\n", "rollout:\n  now: 9998-12-31T23:59:59-12:00\n"))
    code, err = _run("rollout", "--config", str(path), monkeypatch=monkeypatch)
    assert code == 0, err
