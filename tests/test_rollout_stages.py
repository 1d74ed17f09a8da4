"""The staged rollout beyond dates, in the engine alone: ramps (a sticky share of clients early), shadow windows
(the next phase decided, not applied), freezes (new clients get the last phase), the opt-in preview, their order
against dates, brownouts and exemptions, and their configuration errors. Through real processes:
tests/integration/test_rollout_stages.py."""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.app import ConfigError, parse_config
from gateway.core.decision import Kind
from gateway.core.http import token_fingerprint
from gateway.rollout import RolloutPlan
from gateway.rollout.request import parse_preview

BASE: dict[str, Any] = {
    "tenants": [
        {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"},
        {"name": "staged", "hosts": ["staged.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01",
         "restricted_file_access": True, "forbid_legacy_uploads": False,
         "rollout": {"forbid_legacy_uploads": "2027-01-01"}},
    ],
}
RAMP = {"behaviour": "board_cards", "phase": "capped",
        "steps": [{"share": 30, "from": "2026-09-01"}, {"share": 50, "from": "2026-09-15"}]}


def config(rollout: dict[str, Any] | None = None, **tenant_rollouts: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if rollout is not None:
        data["rollout"] = rollout
    for tenant in data["tenants"]:
        if tenant["name"] in tenant_rollouts:
            tenant["rollout"] = {**tenant.get("rollout", {}), **tenant_rollouts[tenant["name"]]}
    return data


def plan_of(data: dict[str, Any]) -> RolloutPlan:
    return parse_config(data).rollout_plan()


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


class Client:
    """A client as the engine reads it, with what the fleet's record says of it."""

    def __init__(self, token: str | None = None, headers: Mapping[str, str] | None = None, *,
                 seen: bool | None = True, preview: str | None = None) -> None:
        self.headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        self.fingerprint = token_fingerprint(self.headers.get("Authorization"))
        self._seen = seen
        self._preview = parse_preview(preview)
        self.asked: list[tuple[str, str, float]] = []

    def previewed(self, behaviour: str) -> str | None:
        return self._preview.get(behaviour, self._preview.get("all"))

    def seen_before(self, tenant: str, behaviour: str, at: float) -> bool | None:
        self.asked.append((tenant, behaviour, at))
        return self._seen


def fingerprints(n: int) -> list[str]:
    return [hashlib.sha256(f"client-{i}".encode()).hexdigest()[:12] for i in range(n)]


class ByFingerprint(Client):
    def __init__(self, fingerprint: str) -> None:
        super().__init__()
        self.fingerprint = fingerprint


def ramped(plan: RolloutPlan, when: str, clients: list[str]) -> set[str]:
    schedule = plan.schedule("acme", "board_cards")
    return {fp for fp in clients if schedule.resolve(ts(when), ByFingerprint(fp), "acme").kind is Kind.RAMP}


# --- ramps ----------------------------------------------------------------------------------------------------------


def test_a_ramp_gives_its_share_of_clients_the_phase_early_and_raising_it_only_adds_clients() -> None:
    plan = plan_of(config({"ramps": [RAMP], "ramp_key": "k1"}))
    clients = fingerprints(10_000)
    assert ramped(plan, "2026-08-31T23:59:59", clients) == set()  # before the first step: nobody
    at_30 = ramped(plan, "2026-09-05T00:00:00", clients)
    assert 2850 <= len(at_30) <= 3150, len(at_30)
    at_50 = ramped(plan, "2026-09-20T00:00:00", clients)
    assert 4750 <= len(at_50) <= 5250, len(at_50)
    assert at_30 <= at_50  # raising the share only adds clients
    # At the phase's own date everyone has it, by the date.
    decision = plan.schedule("acme", "board_cards").resolve(ts("2026-10-01T00:00:00"), ByFingerprint(clients[0]))
    assert (decision.phase, decision.kind) == ("capped", Kind.DATE)


def test_a_ramp_is_sticky_across_builds_and_keyed() -> None:
    clients = fingerprints(2000)
    first = ramped(plan_of(config({"ramps": [RAMP], "ramp_key": "k1"})), "2026-09-05T00:00:00", clients)
    again = ramped(plan_of(config({"ramps": [RAMP], "ramp_key": "k1"})), "2026-09-05T00:00:00", clients)
    other = ramped(plan_of(config({"ramps": [RAMP], "ramp_key": "k2"})), "2026-09-05T00:00:00", clients)
    assert first == again
    assert first != other  # another key chooses other clients: a client cannot work out its place without it


def test_a_request_without_a_token_is_in_no_ramp_and_an_exemption_holds_a_ramped_client_back() -> None:
    fp = next(iter(ramped(plan_of(config({"ramps": [RAMP]})), "2026-09-20T00:00:00", fingerprints(50))))
    exempt = {"name": "slow", "until": "2026-12-01", "token_fingerprint": fp}
    plan = plan_of(config({"ramps": [RAMP], "exemptions": [exempt]}))
    schedule = plan.schedule("acme", "board_cards")
    assert schedule.resolve(ts("2026-09-20T00:00:00"), Client()).phase == "full"
    decision = schedule.resolve(ts("2026-09-20T00:00:00"), ByFingerprint(fp))
    assert (decision.phase, decision.kind) == ("full", Kind.EXEMPTION)
    assert "Authorization" in decision.vary


# --- shadows --------------------------------------------------------------------------------------------------------


def test_a_shadow_window_decides_the_next_phase_without_applying_it() -> None:
    shadow = {"behaviour": "legacy_uploads", "start": "2026-12-01T00:00:00Z", "end": "2026-12-15T00:00:00Z"}
    plan = plan_of(config({"shadows": [shadow]}))
    schedule = plan.schedule("staged", "legacy_uploads")
    inside = schedule.resolve(ts("2026-12-05T00:00:00"), Client("t"))
    assert (inside.phase, inside.shadow) == ("allowed", 1)
    assert schedule.resolve(ts("2026-12-16T00:00:00"), Client("t")).shadow is None
    # A company already past the phase (its setting on) has nothing to shadow.
    assert plan.schedule("acme", "legacy_uploads").resolve(ts("2026-12-05T00:00:00"), Client("t")).shadow is None
    assert plan.decide("staged", "legacy_uploads", dt.datetime(2026, 12, 5, tzinfo=dt.UTC)).shadow == "forbidden"


def test_a_companys_own_shadows_replace_the_global_ones() -> None:
    shadow = {"behaviour": "legacy_uploads", "start": "2026-12-01T00:00:00Z", "end": "2026-12-15T00:00:00Z"}
    plan = plan_of(config({"shadows": [shadow]}, staged={"shadows": []}))
    assert plan.schedule("staged", "legacy_uploads").resolve(ts("2026-12-05T00:00:00"), Client("t")).shadow is None


# --- freezes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seen", "phase", "kind", "unplaced"), [
    (True, "allowed", Kind.SETTING, False),  # known: its schedule (its company setting, before the date)
    (False, "forbidden", Kind.FREEZE, False),
    (None, "forbidden", Kind.FREEZE, True),  # the upload guard cannot place it: the stricter answer
])
def test_a_freeze_gives_a_new_client_the_last_phase_of_a_security_behaviour(
        seen: bool | None, phase: str, kind: Kind, unplaced: bool) -> None:
    plan = plan_of(config({"freezes": [{"behaviour": "legacy_uploads", "from": "2026-12-01"}]}))
    client = Client("t", seen=seen)
    decision = plan.schedule("staged", "legacy_uploads").resolve(ts("2026-12-05T00:00:00"), client, "staged")
    assert (decision.phase, decision.kind, decision.unplaced) == (phase, kind, unplaced)
    assert client.asked == [("staged", "legacy_uploads", ts("2026-12-01T00:00:00"))]


@pytest.mark.parametrize(("seen", "phase", "unplaced"), [(True, "capped", False), (False, "removed", False),
                                                        (None, "capped", True)])  # cards: nothing breaks
def test_a_freeze_of_a_compatibility_behaviour_treats_an_unplaced_client_as_known(
        seen: bool | None, phase: str, unplaced: bool) -> None:
    plan = plan_of(config({"freezes": [{"behaviour": "board_cards", "from": "2026-10-10"}]}))
    decision = plan.schedule("acme", "board_cards").resolve(ts("2026-10-15T00:00:00"), Client("t", seen=seen))
    assert (decision.phase, decision.unplaced) == (phase, unplaced)


def test_before_a_freeze_nobody_is_asked_about() -> None:
    plan = plan_of(config({"freezes": [{"behaviour": "board_cards", "from": "2026-10-10"}]}))
    client = Client("t", seen=False)
    assert plan.schedule("acme", "board_cards").resolve(ts("2026-10-05T00:00:00"), client).phase == "capped"
    assert client.asked == []


# --- preview --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("board_cards", {"board_cards": ""}),
    ("Board_Cards=Removed, legacy_uploads", {"board_cards": "removed", "legacy_uploads": ""}),
    ("all", {"all": ""}),
    ("", {}),
    (" , =x,", {}),
])
def test_a_preview_header_is_read_leniently(value: str, expected: dict[str, str]) -> None:
    assert parse_preview(value) == expected


def test_a_preview_only_ever_moves_a_client_later() -> None:
    plan = plan_of(config({"preview": {"enabled": True}}))
    schedule = plan.schedule("acme", "board_cards")
    assert "Gateway-Preview" in schedule.vary
    early = ts("2026-09-01T00:00:00")
    assert schedule.resolve(early, Client("t", preview="board_cards")).phase == "removed"
    assert schedule.resolve(early, Client("t", preview="board_cards=capped")).phase == "capped"
    assert schedule.resolve(early, Client("t", preview="all")).kind is Kind.PREVIEW
    late = ts("2026-11-05T00:00:00")
    decision = schedule.resolve(late, Client("t", preview="board_cards=capped"))  # never earlier
    assert (decision.phase, decision.kind) == ("removed", Kind.DATE)
    assert plan_of(config()).schedule("acme", "board_cards").resolve(early, Client("t", preview="all")).phase == "full"


def test_schedules_are_built_when_first_asked_for_and_shared_by_companies_alike() -> None:
    data = config()
    data["tenants"] += [{"name": f"t{i}", "hosts": [f"t{i}.test"], "upstream": "http://127.0.0.1:1",
                         "created": "2026-06-01"} for i in range(50)]
    plan = plan_of(data)
    first = plan.schedule("t0", "board_cards")
    assert all(plan.schedule(f"t{i}", "board_cards") is first for i in range(50))
    assert plan.schedule("acme", "board_cards") is first


# --- configuration errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "problem"), [
    (config({"ramps": [{**RAMP, "steps": [{"share": 50, "from": "2026-09-01"}, {"share": 10, "from": "2026-09-15"}]}]}),
     "rollout.ramps[0]: steps: the share must rise with the dates"),
    (config({"ramps": [{**RAMP, "steps": [{"share": 10, "from": "2026-09-15"}, {"share": 50, "from": "2026-09-01"}]}]}),
     "rollout.ramps[0]: steps: 2026-09-01 must be after 2026-09-15"),
    (config({"ramps": [{**RAMP, "steps": [{"share": 100, "from": "2026-09-01"}]}]}),
     "rollout.ramps[0].steps[0].share: Input should be less than 100"),
    (config({"ramps": [{**RAMP, "steps": [{"share": 10, "from": "2026-10-05"}]}]}),
     "rollout.ramps[0]: the ramp's last step (2026-10-05) must come before capped's own date (2026-10-01)"),
    (config(acme={"ramps": [{**RAMP, "steps": [{"share": 10, "from": "2026-09-05"}]}], "board_cards_cap": "2026-09-01"}),
     "tenants[0].rollout.ramps[0]: the ramp's last step (2026-09-05) must come before capped's own date (2026-09-01)"),
    (config({"ramps": [{**RAMP, "phase": "full"}]}), "rollout.ramps[0]: phase 'full' is the first one of board_cards"),
    (config({"ramps": [{**RAMP, "behaviour": "cards"}]}), "rollout.ramps[0]: unknown behaviour 'cards'"),
    (config({"shadows": [{"behaviour": "board_cards", "start": "2026-09-20T00:00:00Z", "end": "2026-10-02T00:00:00Z"}]}),
     "rollout.shadows[0]: the shadow window ends (2026-10-02T00:00:00+00:00) after capped's own date (2026-10-01)"),
    (config(staged={"shadows": [{"behaviour": "legacy_uploads", "start": "2026-12-20T00:00:00",
                                 "end": "2027-01-02T00:00:00"}]}),
     "tenants[1].rollout.shadows[0]: the shadow window ends (2027-01-02T00:00:00) after forbidden's own date"),
    (config({"shadows": [{"phase": "full", "start": "2026-09-01T00:00:00Z", "end": "2026-09-02T00:00:00Z"}]}),
     "rollout.shadows[0]: phase 'full' is the first one of board_cards"),
    (config({"shadows": [{"start": "2026-09-02T00:00:00Z", "end": "2026-09-01T00:00:00Z"}]}),
     "rollout.shadows[0]: the window ends"),
    (config({"freezes": [{"behaviour": "uploads", "from": "2026-12-01"}]}), "rollout.freezes[0]: unknown behaviour"),
    (config({"freezes": [{"from": "2026-12-01"}, {"from": "2026-12-02"}]}),
     "rollout.freezes[1]: a second freeze of board_cards: one per behaviour"),
    (config({"freezes": [{"behaviour": "board_cards", "from": "2026-02-30"}]}), "rollout.freezes[0].from:"),
    (config({"preview": {"header": "Bad Header"}}), "rollout.preview.header: String should match pattern"),
])
def test_staged_rollout_config_problems_name_their_path(data: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems
