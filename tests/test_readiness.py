"""Migration readiness from the ledger's per-client rollups, without a database: each client's state (ready, calling,
overdue, blocked), trend, name, and what changes for it next (the rollout plan, for that client); the urgency
order and the totals that leave internal clients out. Through real processes: tests/integration/test_readiness.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gateway.app import parse_config
from gateway.config.ledger import ClientNames
from gateway.core.http import token_fingerprint
from gateway.ops.ledger.readiness import LedgerClient, build, days_from, plan_changes

DAY = 86400
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC).timestamp()
TODAY = int(NOW) // DAY * DAY
MOBILE = token_fingerprint("Bearer mobile-token") or ""  # a credential always has a fingerprint
CONFIG: dict[str, Any] = {
    "tenants": [
        # acme: the default dates (capped from 2026-10-01, removed from 2026-11-01), uploads forbidden by setting.
        {"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"},
        # oldco: cards removed on 2026-12-01 (its own date), a brownout ahead; uploads forbidden from 2027-01-15.
        {"name": "oldco", "hosts": ["old.test"], "upstream": "http://127.0.0.1:1", "created": "2025-01-01",
         "restricted_file_access": True, "forbid_legacy_uploads": False,
         "rollout": {"board_cards_removal": "2026-12-01", "forbid_legacy_uploads": "2027-01-15",
                     "brownouts": [{"start": "2026-11-25T10:00:00Z", "end": "2026-11-25T12:00:00Z"}]}},
    ],
    "usage": {"clients": [
        {"name": "mobile-app", "owner": "mobile-team@example.com", "token_fingerprint": MOBILE},
        {"name": "nightly-sync", "owner": "data platform", "internal": True, "user_agent": {"prefix": "LegacySync/"}},
    ]},
    "rollout": {"exemptions": [{"name": "mobile-3x", "phase": "full", "until": "2026-12-15",
                                "token_fingerprint": MOBILE}]},
}


def _row(tenant: str, client: str, behaviour: str, decision: str, *, last: float, first: float | None = None,
         requests: int = 10, agent: str = "sdk/1.0", example: str = "GET /api/latest/boards/{board_id}",
         rule: str = "date", refused: float = 0.0) -> tuple[Any, ...]:
    return (tenant, client, behaviour, first if first is not None else last - 30 * DAY, last, requests, decision,
            agent, example, rule, refused)


def _build(rows: list[tuple[Any, ...]], days: list[tuple[Any, ...]] = ()) -> Any:  # type: ignore[assignment]
    config = parse_config(CONFIG)
    return build(rows, days, plan=config.rollout_plan(), names=ClientNames(config.model.usage.clients), wall=NOW,
                 now=NOW, quiet_days=14, window_days=90)


ROWS = [
    _row("acme", "quiet000000a", "board_cards", "capped:capped", last=NOW - 20 * DAY),
    _row("acme", "refused0000b", "board_cards", "removed:removed", last=NOW - 3600, refused=NOW - 3600),
    _row("acme", MOBILE, "board_cards", "full(exemption):untouched", last=NOW - 7200, rule="exemption:mobile-3x"),
    _row("oldco", "calling0000c", "board_cards", "capped:capped", last=NOW - 600),
    _row("oldco", "calling0000c", "legacy_uploads", "allowed", last=NOW - 600, rule="setting",
         example="PUT /api/v1/cards/{card_id}/files"),
    _row("acme", "internal000d", "board_cards", "removed:removed", last=NOW - 60, agent="LegacySync/2.1",
         refused=NOW - 60),
    _row("oldco", "preview0000e", "board_cards", "removed(preview):removed", last=NOW - 60, rule="preview"),
    _row("oldco", "shadow00000f", "legacy_uploads", "would_block", last=NOW - 60, rule="shadow"),
    _row("gone", "nobody000000", "board_cards", "capped:capped", last=NOW - 60),  # a company no longer configured
]


def test_each_client_s_state_follows_its_calls_and_its_company_s_dates() -> None:
    ready = _build(ROWS)
    states = {(e.tenant, e.client, e.behaviour): e.state for e in ready.clients}
    assert states == {
        ("acme", "quiet000000a", "board_cards"): "ready",  # no call for 20 days (quiet_days 14)
        ("acme", "refused0000b", "board_cards"): "blocked",  # its calls are refused: broken now
        ("acme", MOBILE, "board_cards"): "overdue",  # calls after the removal date, kept working by its exemption
        ("oldco", "calling0000c", "board_cards"): "calling",  # its company's removal (2026-12-01) is ahead
        ("oldco", "calling0000c", "legacy_uploads"): "calling",
        ("acme", "internal000d", "board_cards"): "blocked",
        ("oldco", "preview0000e", "board_cards"): "calling",  # asked for the removal itself: not refused
        ("oldco", "shadow00000f", "legacy_uploads"): "calling",
    }
    by_client = {(e.client, e.behaviour): e for e in ready.clients}
    mobile = by_client[(MOBILE, "board_cards")]
    assert (mobile.named and mobile.named.name, mobile.phase) == ("mobile-app", "full")
    # What changes for it next: its exemption ends, and the company's phase applies.
    assert mobile.next is not None and mobile.next.phase == "removed"
    assert mobile.next.at == dt.datetime(2026, 12, 15, tzinfo=dt.UTC).timestamp()
    assert mobile.next.why.startswith("exemption 'mobile-3x' ends; ")
    calling = by_client[("calling0000c", "board_cards")]
    assert calling.phase == "capped" and calling.next is not None and calling.next.phase == "removed"
    assert calling.next.at == dt.datetime(2026, 11, 25, 10, tzinfo=dt.UTC).timestamp()  # the brownout comes first
    uploads = by_client[("calling0000c", "legacy_uploads")]
    assert uploads.next is not None and uploads.next.phase == "forbidden"
    assert uploads.next.at == dt.datetime(2027, 1, 15, tzinfo=dt.UTC).timestamp()
    assert by_client[("preview0000e", "board_cards")].previewing
    assert by_client[("shadow00000f", "legacy_uploads")].shadowed
    internal = by_client[("internal000d", "board_cards")]
    assert internal.internal and internal.named is not None and internal.named.name == "nightly-sync"


def test_the_most_urgent_come_first_and_internal_clients_stay_out_of_the_totals() -> None:
    ready = _build(ROWS)
    order = [(e.state, e.client, e.behaviour) for e in ready.clients]
    assert order == [
        ("blocked", "refused0000b", "board_cards"),
        ("blocked", "internal000d", "board_cards"),  # internal, after the external ones of its state
        ("overdue", MOBILE, "board_cards"),
        # Calling: the soonest change first (oldco's brownout on 2026-11-25, then uploads forbidden in 2027).
        ("calling", "calling0000c", "board_cards"),
        ("calling", "preview0000e", "board_cards"),
        ("calling", "calling0000c", "legacy_uploads"),
        ("calling", "shadow00000f", "legacy_uploads"),
        ("ready", "quiet000000a", "board_cards"),
    ]
    assert ready.totals() == {
        "acme": {"board_cards": {"blocked": 1, "overdue": 1, "calling": 0, "ready": 1}},
        "oldco": {"board_cards": {"blocked": 0, "overdue": 0, "calling": 2, "ready": 0},
                  "legacy_uploads": {"blocked": 0, "overdue": 0, "calling": 2, "ready": 0}},
    }
    # Tokens of a company that still call (a client on two behaviours counts once); the internal one apart.
    assert ready.still_calling() == 5 and ready.internal_clients() == 1
    shown = ready.to_json(top=2, ready=False)
    assert [c["client"] for c in shown["clients"]] == ["refused0000b", "internal000d"]
    assert shown["to_contact"] == 7 and shown["clients_in_window"] == 8
    mobile = next(c for c in ready.to_json()["clients"] if c["client"] == MOBILE)
    assert mobile["name"] == "mobile-app" and mobile["owner"] == "mobile-team@example.com"
    assert mobile["rule"] == "exemption:mobile-3x" and mobile["example"] == "GET /api/latest/boards/{board_id}"
    assert mobile["next"] == {"at": "2026-12-15T00:00:00+00:00", "phase": "removed", "bridge": False,
                              "why": mobile["next"]["why"]}


def test_the_trend_is_the_last_seven_days_against_the_seven_before() -> None:
    """(The database sums each client's days: tests/test_usage.py.)"""
    assert days_from(NOW) == TODAY - 13 * DAY
    clients = {"rising": (9, 2), "falling": (3, 10), "steady": (5, 5), "new": (1, 0), "stopped": (0, 4), "none": (0, 0)}
    rows = [_row("oldco", c, "board_cards", "capped:capped", last=NOW - 60) for c in clients]
    trend = [("oldco", c, "board_cards", last, before, 0) for c, (last, before) in clients.items()]
    found = {e.client: (e.last_7_days, e.previous_7_days, e.trend) for e in _build(rows, trend).clients}
    assert found == {"rising": (9, 2, "rising"), "falling": (3, 10, "falling"), "steady": (5, 5, "steady"),
                     "new": (1, 0, "new"), "stopped": (0, 4, "stopped"), "none": (0, 0, "quiet")}


def test_a_client_s_own_schedule_lists_every_change_ahead() -> None:
    """What a client's own view lists: the brownout (removed, then capped again), its company's removal; for the
    exempted client, the end of its exemption."""
    plan = parse_config(CONFIG).rollout_plan()
    phase, changes = plan_changes(plan.schedules["oldco"]["board_cards"], LedgerClient("c", "sdk", NOW - DAY), "oldco",
                                  NOW, 20)
    at = [(dt.datetime.fromtimestamp(c.at, dt.UTC).strftime("%Y-%m-%d %H:%M"), c.phase) for c in changes]
    assert phase == "capped" and at == [("2026-11-25 10:00", "removed"), ("2026-11-25 12:00", "capped"),
                                        ("2026-12-01 00:00", "removed")]
    phase, changes = plan_changes(plan.schedules["acme"]["board_cards"], LedgerClient(MOBILE, "", NOW - DAY), "acme",
                                  NOW, 20)
    assert phase == "full" and [(c.phase, c.why.split(";")[0]) for c in changes] == [
        ("removed", "exemption 'mobile-3x' ends")]
