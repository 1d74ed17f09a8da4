"""The date-flag engine: phases from dates, overrides, brownouts and exemptions; its config checks; the clock."""

from __future__ import annotations

import copy
import datetime as dt
import zoneinfo
from typing import Any

import pytest

from gateway.app import ConfigError, parse_config
from gateway.core.http import token_fingerprint
from gateway.ops.metrics import Metrics
from gateway.rollout import (
    FixedClock,
    RolloutConfig,
    RolloutPlan,
    SystemClock,
    clock_from_config,
    describe,
    parse_instant,
)

BASE: dict[str, Any] = {
    "tenants": [
        {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"},
        {"name": "oldco", "hosts": ["old.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01"},
        {"name": "staged", "hosts": ["staged.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01",
         "restricted_file_access": True, "forbid_legacy_uploads": False,
         "rollout": {"forbid_legacy_uploads": "2026-12-01"}},
    ],
}


def config(rollout: dict[str, Any] | None = None, **tenant_rollouts: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if rollout is not None:
        data["rollout"] = rollout
    for tenant in data["tenants"]:
        if tenant["name"] in tenant_rollouts:
            tenant["rollout"] = tenant_rollouts[tenant["name"]]
    return data


def plan_of(data: dict[str, Any]) -> RolloutPlan:
    return parse_config(data).rollout_plan()


def forbids(plan: RolloutPlan, tenant: str, when: dt.datetime, headers: dict[str, str] | None = None) -> bool:
    return plan.decide(tenant, "legacy_uploads", when, headers).phase == "forbidden"


def at(text: str, tz: str = "UTC") -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=zoneinfo.ZoneInfo(tz))


def phase(plan: RolloutPlan, tenant: str, when: dt.datetime, behaviour: str = "board_cards",
          headers: dict[str, str] | None = None) -> str:
    return plan.decide(tenant, behaviour, when, headers).phase


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "Asia/Tokyo", "America/New_York"])
def test_dates_begin_at_midnight_in_the_configured_timezone(tz: str) -> None:
    plan = plan_of(config({"timezone": tz}))
    assert phase(plan, "acme", at("2026-09-30T23:59:59", tz)) == "full"
    assert phase(plan, "acme", at("2026-10-01T00:00:00", tz)) == "capped"
    assert phase(plan, "acme", at("2026-10-31T23:59:59", tz)) == "capped"
    assert phase(plan, "acme", at("2026-11-01T00:00:00", tz)) == "removed"


def test_tenant_overrides_and_tenant_timezone() -> None:
    plan = plan_of(config(acme={"timezone": "Asia/Tokyo", "board_cards_cap": "2026-08-01"}))
    assert phase(plan, "acme", at("2026-07-31T23:59:59", "Asia/Tokyo")) == "full"
    decision = plan.decide("acme", "board_cards", at("2026-08-01T00:00:00", "Asia/Tokyo"))
    assert (decision.phase, decision.kind) == ("capped", "override")
    assert "tenant override" in decision.why
    assert phase(plan, "oldco", at("2026-08-15T00:00:00")) == "full"


def test_brownout_windows_apply_a_later_phase_for_a_while() -> None:
    brownout = {"start": "2026-09-10T10:00:00", "end": "2026-09-10T11:00:00", "phase": "capped"}
    plan = plan_of(config({"brownouts": [brownout, {"start": "2026-10-20T10:00:00", "end": "2026-10-20T12:00:00"}]}))
    assert phase(plan, "acme", at("2026-09-10T09:59:59")) == "full"
    decision = plan.decide("acme", "board_cards", at("2026-09-10T10:00:00"))
    assert (decision.phase, decision.kind) == ("capped", "brownout")
    assert phase(plan, "acme", at("2026-09-10T11:00:00")) == "full"
    assert phase(plan, "acme", at("2026-10-20T11:00:00")) == "removed"
    assert phase(plan, "acme", at("2026-10-20T12:00:00")) == "capped"


def test_tenant_brownouts_replace_the_global_ones() -> None:
    data = config({"brownouts": [{"start": "2026-10-20T10:00:00", "end": "2026-10-20T12:00:00"}]}, acme={"brownouts": []})
    plan = plan_of(data)
    assert phase(plan, "acme", at("2026-10-20T11:00:00")) == "capped"
    assert phase(plan, "oldco", at("2026-10-20T11:00:00")) == "removed"


def test_exemptions_by_fingerprint_and_header_until_their_date() -> None:
    token = "Bearer secret"
    data = config({"exemptions": [{"name": "mobile", "until": "2026-12-01", "token_fingerprint": token_fingerprint(token)}]},
                  acme={"exemptions": [{"name": "sync", "phase": "capped", "until": "2027-01-01",
                                        "header": {"name": "X-Client", "value": "sync"}}]})
    plan = plan_of(data)
    when = at("2026-11-15T00:00:00")
    assert phase(plan, "acme", when, headers={"Authorization": token}) == "full"
    assert phase(plan, "acme", when, headers={"Authorization": "Bearer other"}) == "removed"
    assert phase(plan, "acme", when, headers={"X-Client": "sync"}) == "capped"
    assert phase(plan, "oldco", when, headers={"X-Client": "sync"}) == "removed"
    assert phase(plan, "acme", at("2026-12-01T00:00:00"), headers={"Authorization": token}) == "removed"
    decision = plan.decide("acme", "board_cards", when, {"Authorization": token})
    assert decision.kind == "exemption" and "mobile" in decision.why and "secret" not in decision.why
    # An exemption also keeps its client out of a brownout.
    assert plan.schedule("acme", "board_cards").vary == ("Authorization", "X-Client")


def test_forbid_legacy_uploads_by_setting_and_by_date() -> None:
    plan = plan_of(config())
    now = at("2026-11-30T23:59:59")
    assert forbids(plan, "acme", now)  # created after 2026-05-21: on from the start
    assert not forbids(plan, "oldco", now)  # restricted access off: can't be forbidden
    assert not forbids(plan, "staged", now)
    assert forbids(plan, "staged", at("2026-12-01T00:00:00"))
    decision = plan.decide("oldco", "legacy_uploads", now)
    assert decision.kind == "setting" and "restricted file access is off" in decision.why


def test_forbid_brownout_and_fingerprint_exemption() -> None:
    token = "Bearer integrator"
    data = config({"brownouts": [{"behaviour": "legacy_uploads", "start": "2026-11-10T10:00:00",
                                  "end": "2026-11-10T11:00:00"}],
                   "exemptions": [{"name": "integrator", "behaviour": "legacy_uploads", "until": "2027-01-01",
                                   "token_fingerprint": token_fingerprint(token)}]})
    plan = plan_of(data)
    assert forbids(plan, "staged", at("2026-11-10T10:30:00"))
    assert not forbids(plan, "staged", at("2026-11-10T11:00:00"))
    assert not forbids(plan, "staged", at("2026-12-05T00:00:00"), {"Authorization": token})


def test_next_change_and_description() -> None:
    plan = plan_of(config({"brownouts": [{"start": "2026-10-20T10:00:00", "end": "2026-10-20T12:00:00"}]}))
    schedule = plan.schedule("acme", "board_cards")
    upcoming = schedule.next_change(at("2026-10-15T00:00:00").timestamp())
    assert upcoming is not None
    when, decision = upcoming
    assert when == at("2026-10-20T10:00:00").timestamp() and decision.phase == "removed"
    assert schedule.next_change(at("2026-11-02T00:00:00").timestamp()) is None
    text = "\n".join(describe(plan, at("2026-10-15T00:00:00")))
    assert "board_cards: capped [date] board_cards_cap 2026-10-01 (default) reached" in text
    assert "next change: removed at 2026-10-20T10:00:00+00:00" in text
    assert "legacy_uploads: allowed" in text


def test_the_phase_gauge_shows_one_phase_per_behaviour() -> None:
    plan = plan_of(config())
    metrics = Metrics()
    metrics.rollout_phase.source = lambda: (plan, at("2026-10-15T00:00:00").timestamp())
    metrics.companies.label("acme")  # counted in a deprecation family: the company has phase series of its own
    values = [metrics.registry.get_sample_value("gateway_rollout_phase", {"tenant": "acme", "behaviour": "board_cards",
                                                                          "phase": p}) for p in ("full", "capped", "removed")]
    assert values == [0, 1, 0]


def test_phase_series_per_company_only_for_counted_companies_and_a_census_for_all() -> None:
    """Issue 38: gateway_rollout_phase had 5 series per configured company; an idle one now has none, and
    gateway_rollout_companies counts every company per behaviour and phase."""
    plan = plan_of(config())
    metrics = Metrics()
    metrics.rollout_phase.source = lambda: (plan, at("2026-10-15T00:00:00").timestamp())
    sample = metrics.registry.get_sample_value
    assert sample("gateway_rollout_phase", {"tenant": "acme", "behaviour": "board_cards", "phase": "capped"}) is None
    census = {(b, p): sample("gateway_rollout_companies", {"behaviour": b, "phase": p})
              for b, p in [("board_cards", "full"), ("board_cards", "capped"), ("board_cards", "removed"),
                           ("legacy_uploads", "allowed"), ("legacy_uploads", "forbidden")]}
    assert census == {("board_cards", "full"): 0, ("board_cards", "capped"): 3, ("board_cards", "removed"): 0,
                      ("legacy_uploads", "allowed"): 2, ("legacy_uploads", "forbidden"): 1}
    metrics.companies.label("staged")
    metrics.companies.label("gone")  # counted before a reload that dropped it: no phase
    phases = {labels["tenant"] for family in metrics.registry.collect() if family.name == "gateway_rollout_phase"
              for labels in (s.labels for s in family.samples)}
    assert phases == {"staged"}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (config({"board_cards_cap": "2026-11-01", "board_cards_removal": "2026-11-01"}),
         "rollout.board_cards_removal: 2026-11-01 must be after board_cards_cap (2026-11-01)"),
        (config(acme={"board_cards_removal": "2026-09-01"}),
         "tenants[0].rollout.board_cards_removal: 2026-09-01 must be after board_cards_cap (2026-10-01, from rollout)"),
        (config(acme={"board_cards_cap": "2026-12-01"}),
         "tenants[0].rollout.board_cards_cap: 2026-12-01 must be before board_cards_removal (2026-11-01, from rollout)"),
        (config(acme={"board_cards_cap": "2026-12-01", "board_cards_removal": "2026-11-15"}),
         "tenants[0].rollout.board_cards_removal: 2026-11-15 must be after board_cards_cap (2026-12-01)"),
        (config({"board_cards_announcement": "2026-10-02"}),
         "rollout.board_cards_cap: 2026-10-01 must be on or after board_cards_announcement (2026-10-02)"),
        (config(oldco={"forbid_legacy_uploads": "2026-12-01"}),
         "tenants[1].rollout.forbid_legacy_uploads: needs restricted_file_access on for this company"),
        (config(acme={"forbid_legacy_uploads": "2026-12-01"}),
         "tenants[0].rollout.forbid_legacy_uploads: the company's forbid_legacy_uploads setting is already on"),
        (config(acme={"board_cards_removel": "2026-12-01"}),
         "tenants[0].rollout.board_cards_removel: Extra inputs are not permitted"),
        (config({"brownouts": [{"behaviour": "cards", "start": "2026-10-02T00:00:00", "end": "2026-10-03T00:00:00"}]}),
         "rollout.brownouts[0]: unknown behaviour 'cards'"),
        (config({"brownouts": [{"start": "2026-10-03T00:00:00", "end": "2026-10-02T00:00:00"}]}),
         "rollout.brownouts[0]: the window ends (2026-10-02T00:00:00) before it starts"),
        (config({"brownouts": [{"phase": "full", "start": "2026-10-02T00:00:00", "end": "2026-10-03T00:00:00"}]}),
         "rollout.brownouts[0]: phase 'full' is the first one of board_cards"),
        (config({"brownouts": [{"start": "2026-10-02T00:00:00Z", "end": "2026-10-03T00:00:00"}]}),
         "rollout.brownouts[0]: start and end must both have an offset"),
        (config({"exemptions": [{"name": "x", "until": "2026-12-01"}]}),
         "rollout.exemptions[0]: an exemption names its client"),
        (config({"exemptions": [{"name": "x", "until": "2026-12-01", "token_fingerprint": "Bearer abc"}]}),
         "rollout.exemptions[0].token_fingerprint: String should match pattern"),
        (config({"exemptions": [{"name": "x", "behaviour": "legacy_uploads", "until": "2026-12-01",
                                 "header": {"name": "X-A", "value": "1"}}]}),
         "rollout.exemptions[0]: legacy_uploads is a security setting"),
        (config({"exemptions": [{"name": "x", "phase": "removed", "until": "2026-12-01",
                                 "token_fingerprint": "0123456789ab"}]}),
         "rollout.exemptions[0]: phase 'removed' is the last one of board_cards"),
        (config({"exemptions": [{"name": "x", "until": "2026-12-01", "header": {"name": "X-A"}}]}),
         "rollout.exemptions[0].header: give exactly one of value or prefix"),
        (config(acme={"timezone": "Mars/Base"}), "tenants[0].rollout.timezone: unknown timezone 'Mars/Base'"),
    ],
)
def test_config_problems_name_their_path(data: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_every_problem_is_reported_at_once() -> None:
    data = config(acme={"board_cards_removal": "2026-09-01"}, oldco={"forbid_legacy_uploads": "2026-12-01"})
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert len(err.value.problems) == 2


def test_clock_from_config_and_environment() -> None:
    rollout = RolloutConfig(timezone="Europe/Berlin", now=dt.datetime(2026, 10, 1, 0, 0, 1))
    clock = clock_from_config(rollout, environ={})
    assert isinstance(clock, FixedClock)
    assert clock.now() == at("2026-10-01T00:00:01", "Europe/Berlin")
    env_clock = clock_from_config(rollout, environ={"GATEWAY_NOW": "2026-11-01T00:00:00Z"})
    assert env_clock.now() == at("2026-11-01T00:00:00")
    assert isinstance(clock_from_config(RolloutConfig(), environ={}), SystemClock)
    with pytest.raises(ValueError, match="GATEWAY_NOW"):
        clock_from_config(rollout, environ={"GATEWAY_NOW": "tomorrow"})
    assert parse_instant("2026-10-01", zoneinfo.ZoneInfo("Asia/Tokyo")) == at("2026-10-01T00:00:00", "Asia/Tokyo")
