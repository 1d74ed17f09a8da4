"""``gateway rollout``: the phase per tenant and behaviour at an instant, why, and the next change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main

CONFIG: dict[str, Any] = {
    "rollout": {
        "timezone": "Europe/Berlin",
        "brownouts": [{"start": "2026-10-20T10:00:00", "end": "2026-10-20T12:00:00"}],
        "exemptions": [{"name": "mobile-app", "until": "2026-12-01", "token_fingerprint": "0123456789ab"}],
    },
    "tenants": [
        {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"},
        {"name": "early", "hosts": ["*.early.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01",
         "restricted_file_access": True, "forbid_legacy_uploads": False,
         "rollout": {"board_cards_cap": "2026-09-01", "forbid_legacy_uploads": "2026-12-01", "timezone": "UTC"}},
    ],
}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["rollout", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_tenant_and_behaviour_with_why_and_next_change(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--config", str(config_file), "--at", "2026-09-30T23:59:59")
    assert code == 0
    assert out.startswith("rollout at 2026-09-30T23:59:59+02:00")
    assert "tenant acme (timezone Europe/Berlin" in out
    assert "  board_cards: full [default] before board_cards_cap 2026-10-01 (default)" in out
    assert "    next change: capped at 2026-10-01T00:00:00+02:00" in out
    assert "exemption 'mobile-app' (active): token fingerprint 0123456789ab keeps at most full" in out
    assert "  legacy_uploads: forbidden [setting] company setting forbid_legacy_uploads is on" in out
    assert "tenant early (timezone UTC" in out
    assert "  board_cards: capped [override] board_cards_cap 2026-09-01 (tenant override) reached" in out
    assert "    next change: forbidden at 2026-12-01T00:00:00+00:00 (forbid_legacy_uploads 2026-12-01" in out


def test_host_selects_one_tenant_and_brownouts_are_explained(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--config", str(config_file), "--at", "2026-10-20T11:00:00", "--host", "x.early.test")
    assert code == 0
    assert "tenant acme" not in out
    assert "board_cards: removed [brownout] brownout" in out
    assert "brownout (now): removed" in out


def test_default_instant_comes_from_the_gateway_clock(
    config_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_NOW", "2026-11-01T00:00:01+01:00")
    code, out, _ = run(capsys, "--config", str(config_file), "--host", "acme.test")
    assert code == 0
    assert "board_cards: removed [date] board_cards_removal 2026-11-01 (default) reached" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--at", "not-a-date"], "--at: 'not-a-date' is not a date and time"),
        (["--host", "nobody.test", "--at", "2026-10-01"], "no tenant serves the host 'nobody.test'"),
    ],
)
def test_errors(config_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = run(capsys, "--config", str(config_file), *argv)
    assert code == 2
    assert message in err


def test_invalid_config_lists_problems_with_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = {**CONFIG, "tenants": [{**CONFIG["tenants"][0], "rollout": {"board_cards_removal": "2026-09-01"}}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, _, err = run(capsys, "--config", str(path))
    assert code == 2
    assert "tenants[0].rollout.board_cards_removal: 2026-09-01 must be after board_cards_cap" in err


def test_host_says_when_the_companys_bridges_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "rollout": {"exemptions": [
            {"name": "old-mobile", "phase": "full", "until": "2027-01-01", "token_fingerprint": "0123456789ab",
             "bridge": True},
            {"name": "scripts", "phase": "removed", "until": "2027-01-01", "header": {"name": "User-Agent",
                                                                                      "prefix": "legacy-cli/"},
             "bridge": False},
        ]},
        "tenants": [
            {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01",
             "bridges": {"card_backfill": True}},
            {"name": "other", "hosts": ["other.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"},
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, _ = run(capsys, "--config", str(path), "--at", "2026-11-24T12:00:00Z", "--host", "acme.test")
    assert code == 0
    # Removed: the company's clients get no cards, so the backfill serves only the client kept at full.
    assert "    bridge card_backfill: on for the company, but in its phase removed it acts only for the clients that " \
           "exemption 'old-mobile' keeps at full or capped\n" in out
    assert "exemption 'old-mobile' (active): token fingerprint 0123456789ab keeps at most full, bridge " \
           "card_backfill on until 2027-01-01" in out
    assert "exemption 'scripts' (active): header User-Agent starting 'legacy-cli/' keeps at most removed, bridge " \
           "card_backfill off" in out
    code, out, _ = run(capsys, "--config", str(path), "--at", "2026-11-24T12:00:00Z", "--host", "other.test")
    assert "    bridge card_backfill: off for the company" in out


def test_a_bridge_exemption_may_name_the_last_phase_but_a_plain_one_may_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bridge, ok in ((None, False), (True, True)):
        exemption: dict[str, object] = {"name": "x", "phase": "removed", "until": "2027-01-01",
                                        "token_fingerprint": "0123456789ab"}
        if bridge is not None:
            exemption["bridge"] = bridge
        config = {"rollout": {"exemptions": [exemption]}, "tenants": [
            {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"}]}
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        code, _, err = run(capsys, "--config", str(path))
        assert (code == 0) is ok, err
        if not ok:
            assert "phase 'removed' is the last one of board_cards: nothing to keep" in err


_BRIDGED = {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01",
            "bridges": {"card_backfill": True, "upload_upgrade": True}}


@pytest.mark.parametrize(("tenant", "exemptions", "at", "line"), [
    # The card backfill acts where the phase shows cards.
    ({}, [], "2026-09-01", "bridge card_backfill: on for the company, acting in its phase full"),
    ({}, [], "2026-10-15", "bridge card_backfill: on for the company, acting in its phase capped"),
    ({}, [], "2026-11-24", "bridge card_backfill: on for the company, but idle in its phase removed: it acts in full "
                           "or capped only, where no client is"),
    # In removed, only for exempted clients kept where cards show (not one whose exemption turns the bridge off, nor
    # one kept at removed, nor an expired one).
    ({}, [{"name": "a", "phase": "capped", "until": "2027-01-01", "token_fingerprint": "0123456789ab"},
          {"name": "b", "phase": "full", "until": "2027-01-01", "token_fingerprint": "0123456789ac", "bridge": False},
          {"name": "c", "phase": "full", "until": "2026-11-01", "token_fingerprint": "0123456789ad"},
          {"name": "d", "phase": "full", "until": "2027-01-01", "header": {"name": "User-Agent", "prefix": "d/"}}],
     "2026-11-24", "bridge card_backfill: on for the company, but in its phase removed it acts only for the clients "
                   "that exemptions 'a', 'd' keep at full or capped"),
    # The upload upgrade acts where an upload would be refused.
    ({}, [], "2026-11-24", "bridge upload_upgrade: on for the company, acting in its phase forbidden"),
    ({"created": "2025-01-01", "restricted_file_access": True, "forbid_legacy_uploads": False}, [], "2026-11-24",
     "bridge upload_upgrade: on for the company, but idle in its phase allowed: it acts in forbidden only, where no "
     "client is"),
    ({"bridges": {}}, [], "2026-11-24", "bridge card_backfill: off for the company"),
])
def test_the_bridge_line_says_where_the_bridge_acts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    tenant: dict[str, Any], exemptions: list[dict[str, Any]],
                                                    at: str, line: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"exemptions": exemptions}, "tenants": [{**_BRIDGED, **tenant}]}))
    code, out, err = run(capsys, "--config", str(path), "--at", f"{at}T12:00:00Z")
    assert code == 0, err
    assert f"    {line}\n" in out, out
