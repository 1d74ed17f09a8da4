"""board_cards alone: its options, its helpers, and the policy with a mocked request and a stand-in proxy core."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from multidict import CIMultiDict

from gateway.app import ConfigError, parse_config
from gateway.core.exchange import Exchange, Policy, Reply
from gateway.ops.metrics import Metrics
from gateway.policies.board_cards import json_splice
from gateway.policies.board_cards import policy as board_cards
from tests.gateway_testlib import BASE_CONFIG
from tests.policy_testlib import Terminal, build_policy, exchange_for, mocked_request


def loaded(options: dict[str, Any]) -> Any:
    data = copy.deepcopy(BASE_CONFIG)
    data["routes"][0]["chain"] = [{"board_cards": options}]
    return parse_config(data, "test")


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"cap": 0}, "routes[0].chain[0].board_cards.cap: Input should be greater than or equal to 1"),
        ({"removal": "hide"}, "routes[0].chain[0].board_cards.removal: Input should be 'remove_key' or 'empty_array'"),
        ({"max_body_bytes": 10}, "routes[0].chain[0].board_cards.max_body_bytes"),
        ({"deprecation_link": "not a url"}, "routes[0].chain[0].board_cards.deprecation_link"),
        ({"capp": 5}, "routes[0].chain[0].board_cards.capp: Extra inputs are not permitted"),
    ],
)
def test_option_errors_name_their_path(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        loaded(options)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_phases_and_actions_keep_their_labels() -> None:
    # Phase follows the rollout schedule's order; Action's values are the metric's and the access log's words.
    assert [(p.value, board_cards.BOARD_CARDS.phases[p]) for p in board_cards.Phase] == [
        (0, "full"), (1, "capped"), (2, "removed")]
    assert [a.value for a in board_cards.Action] == [
        "untouched", "capped", "removed", "passed_through_unparsed", "too_large", "not_ok", "not_modified",
        "backfilled", "backfill_failed", "would_cap", "would_remove", "backfill_rate_limited"]
    assert f"{board_cards.Action.NOT_OK}" == "not_ok"


def test_memo_reuses_only_identical_bodies_within_its_budget() -> None:
    memo = board_cards._Memo(100)
    body = b'{"cards":[1,2,3]}'
    entry = board_cards._MemoEntry(body, json_splice.scan(body, "cards"))
    memo.put(("t", "/b/1"), entry)
    assert memo.kept(("t", "/b/1")) is entry and memo.kept(("t", "/b/2")) is None
    # A new body is compared with the kept one as it arrives (json_splice.Reader): only an identical one is "same".
    for new, same in ((bytes(bytearray(body)), True), (b'{"cards":[1,2,4]}', False), (body + b" ", False)):
        reader = json_splice.Reader("cards", same_as=memo.kept(("t", "/b/1")).body)  # type: ignore[union-attr]
        reader.feed(new)
        assert reader.same is same
    for i in range(10):
        memo.put(("t", f"/b/{i}"), board_cards._MemoEntry(body, entry.layout))
        memo.used(("t", "/b/1"))  # the one in use stays
    assert memo.size <= 100 and ("t", "/b/9") in memo.entries and ("t", "/b/0") not in memo.entries
    assert ("t", "/b/1") in memo.entries
    memo.put(("t", "/big"), board_cards._MemoEntry(b"x" * 101, entry.layout))
    assert ("t", "/big") not in memo.entries


def test_memo_counts_the_outputs_it_keeps() -> None:
    memo = board_cards._Memo(100)
    body = b'{"cards":[1,2,3]}'
    entry = board_cards._MemoEntry(body, json_splice.scan(body, "cards"))
    memo.put(("t", "/b/1"), entry)
    memo.render(("t", "/b/1"), entry, (1, False), (b"x" * 40, False))
    assert memo.size == len(body) + 40 and entry.size == memo.size
    memo.render(("t", "/b/1"), entry, (2, True), (b"y" * 50, True))
    # Over the budget with its outputs: the entry goes, and the memo holds nothing it does not count.
    assert ("t", "/b/1") not in memo.entries and memo.size == 0


def policy(at: str, options: dict[str, Any] | None = None) -> tuple[Policy, Metrics, Any]:
    config = loaded(options or {})
    metrics = Metrics()
    return build_policy(config, "board", "board_cards", at, metrics), metrics, config


def exchange(config: Any, method: str = "GET", headers: dict[str, str] | None = None) -> Exchange:
    request = mocked_request(method, "/api/latest/boards/7", headers or {})
    return exchange_for(config, request, "board", {"board_id": "7"})


def responses(metrics: Metrics, phase: str, action: str, tenant: str = "acme") -> float:
    labels = {"tenant": tenant, "phase": phase, "action": action}
    return metrics.registry.get_sample_value("gateway_board_responses_total", labels) or 0.0


async def test_before_the_cap_date_the_response_is_the_upstreams_with_signal_headers() -> None:
    guard, metrics, config = policy("2026-09-01T00:00:00+00:00")

    async def upstream(exchange: Exchange) -> Reply:
        return Reply(200, CIMultiDict({"ETag": '"x"'}), b'{"cards":[1]}')

    ex = exchange(config)
    reply = await guard(ex, Terminal(upstream))
    assert await reply.read(1000) == b'{"cards":[1]}' and reply.headers["ETag"] == '"x"'
    assert reply.headers["Deprecation"] == f"@{int(dt.datetime(2026, 10, 1, tzinfo=dt.UTC).timestamp())}"
    assert reply.headers["Link"] == '</api/latest/cards?board_id=7>; rel="successor-version"'
    assert ex.decisions["board_cards"] == "full:untouched"
    assert ex.upstream_headers == {}
    assert responses(metrics, "full", "untouched") == 1


async def test_rewriting_phase_prepares_the_upstream_request_and_passes_gateway_errors() -> None:
    guard, metrics, config = policy("2026-11-02T00:00:00+00:00")

    async def upstream(exchange: Exchange) -> Reply:
        assert exchange.upstream_method == "GET"  # a HEAD is forwarded as GET
        return Reply.error(502, "UPSTREAM_RESET", "upstream down")

    ex = exchange(config, "HEAD", {"If-None-Match": 'W/"abc", "zzz"', "Range": "bytes=0-1"})
    reply = await guard(ex, Terminal(upstream))
    assert reply.status == 502
    assert ex.method == "HEAD"
    assert ex.upstream_headers["Accept-Encoding"] == "identity"
    assert ex.upstream_headers["Range"] is None and ex.upstream_headers["If-Modified-Since"] is None
    assert ex.upstream_headers["If-None-Match"] is None  # neither tag was issued by this phase
    assert ex.decisions["board_cards"] == "removed:not_ok"
    assert responses(metrics, "removed", "not_ok") == 1


async def test_signal_headers_can_be_turned_off() -> None:
    guard, _, config = policy("2026-09-01T00:00:00+00:00", {"signal": False})

    async def upstream(exchange: Exchange) -> Reply:
        return Reply(200, body=b"{}")

    reply = await guard(exchange(config), Terminal(upstream))
    assert "Deprecation" not in reply.headers and "Link" not in reply.headers


def test_a_missing_c_scanner_is_logged_once_per_build(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="gateway.board_cards"):
        policy("2026-11-15T00:00:00+00:00")
    assert json_splice.NATIVE and not caplog.records  # built here (CI builds it)
    monkeypatch.setattr(json_splice, "NATIVE", False)
    with caplog.at_level("WARNING", logger="gateway.board_cards"):
        policy("2026-11-15T00:00:00+00:00")
    assert [r.getMessage() for r in caplog.records if "gateway.policies.board_cards._jsonscan" in r.getMessage()] and len(caplog.records) == 1
