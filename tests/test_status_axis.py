"""The status page's time axis, at any span: what it covers, where far events go, and ticks whose labels cannot
overlap (the browser test, tests/integration/test_status_page.py, measures them in Chromium on the demo's config)."""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.app import parse_config
from gateway.config import LoadedConfig
from gateway.ops.status import ConfigHistory, _chart, _Range, _range, _ticks, status_data
from gateway.ops.status_page import render_page
from gateway.rollout import FixedClock, parse_instant
from tests.gateway_testlib import make_config

DAY = 86400.0


def _ts(text: str) -> float:
    return parse_instant(text).timestamp()


@pytest.mark.parametrize("days", [1, 10, 45, 60, 73, 100, 200, 400, 800, 1500, 3000, 10_000, 30_000, 365_000])
def test_at_most_eight_round_ticks_at_any_span(days: int) -> None:
    start = _ts("2026-10-03T05:00:00Z")
    ticks = _ticks(_Range(start, start + days * DAY))
    positions = [t["pct"] for t in ticks]
    assert 1 <= len(ticks) <= 8 or days < 2
    assert positions == sorted(positions) and all(0 <= p <= 100 for p in positions)
    # Evenly enough spaced that labels a ninth of the axis wide never meet (months are 28 to 31 days long).
    gaps = [b - a for a, b in zip(positions, positions[1:], strict=False)]
    assert all(gap >= 100 / 9 * 28 / 31 for gap in gaps), (days, gaps)
    labels = [t["label"] for t in ticks]
    assert len(set(labels)) == len(labels)
    assert all(len(label) <= 10 for label in labels)


def _config(**rollout: object) -> LoadedConfig:
    return parse_config(make_config("http://127.0.0.1:1", rollout=rollout))


def test_the_axis_covers_the_rollout_and_leaves_far_events_at_its_edge() -> None:
    config = _config(exemptions=[{"name": "far", "until": "2099-01-01", "phase": "full",
                                  "token_fingerprint": "0123456789ab"}])
    plan = config.rollout_plan()
    now = _ts("2026-11-25T12:00:00Z")
    scale = _range(plan, now)
    # The default dates (cap 2026-10-01, removal 2026-11-01) and now: a few months, not 2026 to 2103.
    assert _ts("2026-09-01T00:00:00Z") < scale.start < _ts("2026-10-01T00:00:00Z")
    assert _ts("2026-11-25T12:00:00Z") < scale.end < _ts("2027-01-01T00:00:00Z")
    assert scale.far(_ts("2099-01-01T00:00:00Z")) == "after" and scale.pct(_ts("2099-01-01T00:00:00Z")) == 100
    # An event within one span of the rollout widens the axis instead; the days with usage are part of it.
    near = _range(_config(exemptions=[{"name": "near", "until": "2027-01-10", "phase": "full",
                                       "token_fingerprint": "0123456789ab"}]).rollout_plan(), now)
    assert near.end > _ts("2027-01-10T00:00:00Z") and near.far(_ts("2027-01-10T00:00:00Z")) is None
    with_usage = _range(plan, now, [_ts("2026-06-01T00:00:00Z")])
    assert with_usage.start < _ts("2026-06-01T00:00:00Z")


def test_a_chart_bins_by_day_week_or_month_as_the_axis_grows() -> None:
    days = {int(_ts("2026-10-01T00:00:00Z") + i * DAY): 10 + i for i in range(60)}
    short = _chart(days, _Range(_ts("2026-09-20T00:00:00Z"), _ts("2026-12-10T00:00:00Z")))
    assert short is not None and short["unit"] == "day" and len(short["bars"]) == 60
    assert short["total"] == sum(days.values()) and short["peak"] == 69
    assert short["bars"][-1]["height_pct"] == 100 and short["bars"][0]["label"] == "2026-10-01: 10 requests"
    weeks = _chart(days, _Range(_ts("2026-01-01T00:00:00Z"), _ts("2027-06-01T00:00:00Z")))
    assert weeks is not None and weeks["unit"] == "week" and sum(b["requests"] for b in weeks["bars"]) == weeks["total"]
    assert weeks["bars"][0]["label"].startswith("week of 2026-09-28")  # a Monday
    months = _chart(days, _Range(_ts("2022-01-01T00:00:00Z"), _ts("2030-01-01T00:00:00Z")))
    assert months is not None and months["unit"] == "month" and [b["label"] for b in months["bars"]] == [
        "2026-10: 775 requests", "2026-11: 1,595 requests"]  # October's 31 days, then November's 29
    assert _chart({}, short and _Range(0, 1)) is None


def test_the_page_says_when_the_ledger_is_off_or_cannot_be_read() -> None:
    config = parse_config(make_config("http://127.0.0.1:1"))
    clock = FixedClock(dt.datetime(2026, 11, 25, tzinfo=dt.UTC))
    off = status_data(config=config, plan=config.rollout_plan(), clock=clock, history=ConfigHistory(), usage=None,
                      usage_problem="the usage ledger is off (usage.ledger.enabled: false): no usage is recorded")
    page = render_page(off)
    assert "off (usage.ledger.enabled: false): no usage is recorded" in page
    assert off["ledger"] is None and off["usage"]["policies"] == []
    failing = status_data(config=config, plan=config.rollout_plan(), clock=clock, history=ConfigHistory(), usage=None,
                          usage_problem="the usage ledger cannot be read: OperationalError: connection refused",
                          ledger={"database": "sqlite://", "state": "failing", "since": 0.0, "error": "refused",
                                  "last_written": None, "pending": 7, "dropped": 0, "flush_interval": 10,
                                  "retention_days": 400})
    page = render_page(failing)
    assert "failing" in page and "7 request(s) held in memory, retrying" in page
    assert "the usage ledger cannot be read: OperationalError: connection refused" in page


def test_a_timeline_draws_shadows_hatched_ramps_as_their_share_and_a_freeze() -> None:
    """Issue 35 on the status page: a shadow window (recorded, not applied) beside brownouts, a ramp's steps as the
    share of clients each gives the later phase until its date, a freeze as a marker and an event."""
    data = {
        "tenants": [{"name": "staged", "hosts": ["staged.test"], "upstream": "http://127.0.0.1:1",
                     "created": "2025-01-01", "restricted_file_access": True, "forbid_legacy_uploads": False,
                     "rollout": {"forbid_legacy_uploads": "2027-01-01", "board_cards_cap": "2026-12-20",
                                 "board_cards_removal": "2027-02-01"}}],
        "rollout": {
            "shadows": [{"behaviour": "legacy_uploads", "start": "2026-12-01T00:00:00Z",
                         "end": "2026-12-15T00:00:00Z"}],
            "ramps": [{"behaviour": "board_cards", "phase": "capped",
                       "steps": [{"share": 10, "from": "2026-12-01"}, {"share": 50, "from": "2026-12-10"}]}],
            "ramp_key": "k1",
            "freezes": [{"behaviour": "board_cards", "from": "2026-12-05"}],
        },
        "usage": {"ledger": {"url": "sqlite:////tmp/never-opened.db"}},
    }
    config = parse_config({**make_config("http://127.0.0.1:1"), **data})
    status = status_data(config=config, plan=config.rollout_plan(), history=ConfigHistory(), usage=None,
                         clock=FixedClock(parse_instant("2026-12-08T12:00:00Z")))
    (staged,) = status["tenants"]
    uploads, board = (next(b for b in staged["behaviours"] if b["name"] == name)
                      for name in ("legacy_uploads", "board_cards"))
    (shadow,) = uploads["shadows"]
    assert (shadow["phase"], shadow["state"]) == ("forbidden", "now") and "not applied" in shadow["label"]
    assert 0 < shadow["from_pct"] < shadow["to_pct"] < 100 and uploads["ramps"] == [] and board["shadows"] == []
    # The ramp's two steps: 10% until the second, 50% until the cap's date (2026-12-20), when everyone is capped.
    ramps = board["ramps"]
    assert [(r["share"], r["state"], r["phase"]) for r in ramps] == [(10, "now", "capped"), (50, "ahead", "capped")]
    assert ramps[0]["to_pct"] == ramps[1]["from_pct"] and "until 2026-12-20" in ramps[1]["label"]
    assert [m["kind"] for m in board["markers"]].count("freeze") == 1
    assert any(e["kind"] == "freeze" and e["phase"] == "removed" and e["state"] == "past" for e in board["events"])
    assert [e["kind"] for e in uploads["events"]].count("shadow") == 1
    page = render_page(status)
    assert page.count('class="shadow s2 st-now"') == 1 and 'title="ramp: 50% of clients capped from' in page
    assert 'class="ramp s1 st-now"' in page and "height:10%" in page and "height:50%" in page
    assert 'class="marker freeze"' in page
