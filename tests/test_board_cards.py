"""board_cards alone: its options, its helpers, and the middleware with a mocked request and next handler."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.policies.board_cards import json_splice
from gateway.rollout import RolloutPlan
from gateway.config import ConfigError, parse_config
from gateway.ops.observability import Metrics
from gateway.policies import BuildContext
from gateway.policies.board_cards import policy as board_cards
from gateway.rollout import FixedClock
from gateway.core.routing import Route
from gateway.core.exchange import CTX, RequestContext
from tests.conftest import BASE_CONFIG


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


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, False), ("", False), ("gzip", True), ("br, gzip;q=0.5", True), ("gzip;q=0", False), ("*", True),
     ("*;q=0", False), ("identity", False), ("x-gzip", True), ("br;q=1, *;q=0.1, gzip;q=0", False)],
)
def test_accepts_gzip(header: str | None, expected: bool) -> None:
    assert board_cards._accepts_gzip(header) is expected


@pytest.mark.parametrize(
    ("value", "tags"),
    [('"a"', [(False, "a")]), ('W/"a", "b,c"', [(True, "a"), (False, "b,c")]), ("*", [(True, "*")]),
     ('"a" "b"', None), ("a", None), ('"a",', [(False, "a")])],
)
def test_parse_etags(value: str, tags: Any) -> None:
    assert board_cards._parse_etags(value) == tags


def test_memo_reuses_only_identical_bodies_within_its_budget() -> None:
    memo = board_cards._Memo(100)
    body = b'{"cards":[1,2,3]}'
    entry = board_cards._MemoEntry(body, json_splice.scan(body, "cards"))
    memo.put(("t", "/b/1"), entry)
    assert memo.get(("t", "/b/1"), bytes(bytearray(body))) is entry
    assert memo.get(("t", "/b/1"), b'{"cards":[1,2,4]}') is None
    for i in range(10):
        memo.put(("t", f"/b/{i}"), board_cards._MemoEntry(body, entry.layout))
    assert memo.size <= 100 and ("t", "/b/9") in memo.entries and ("t", "/b/0") not in memo.entries
    memo.put(("t", "/big"), board_cards._MemoEntry(b"x" * 101, entry.layout))
    assert ("t", "/big") not in memo.entries


def middleware(at: str, options: dict[str, Any] | None = None) -> tuple[Any, Metrics]:
    config = loaded(options or {})
    metrics = Metrics()
    clock = FixedClock(dt.datetime.fromisoformat(at))
    ctx = BuildContext(route_name="board", clock=clock, metrics=metrics, config=config.model,
                       rollout=RolloutPlan.from_config(config.model))
    return board_cards.build(config.chains["board"][-1][1], ctx), metrics


def request(method: str = "GET", headers: dict[str, str] | None = None) -> web.BaseRequest:
    req = make_mocked_request(method, "/api/latest/boards/7", headers=headers or {})
    tenant = parse_config(copy.deepcopy(BASE_CONFIG)).tenants()[0]
    req[CTX] = RequestContext(0.0, tenant, Route.build("board", None, (), ()), {"board_id": "7"},
                              "/api/latest/boards/7", "", method)
    return req


async def test_before_the_cap_date_the_response_is_the_upstreams_with_signal_headers() -> None:
    mw, metrics = middleware("2026-09-01T00:00:00+00:00")
    seen: list[web.BaseRequest] = []

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        seen.append(req)
        return web.Response(body=b'{"cards":[1]}', headers={"ETag": '"x"'})

    req = request()
    resp = await mw(req, handler)
    assert resp.body == b'{"cards":[1]}' and resp.headers["ETag"] == '"x"'
    assert resp.headers["Deprecation"] == f"@{int(dt.datetime(2026, 10, 1, tzinfo=dt.UTC).timestamp())}"
    assert resp.headers["Link"] == '</api/latest/cards?board_id=7>; rel="successor-version"'
    assert req[CTX].decisions["board_cards"] == "full:untouched"
    assert req[CTX].upstream_headers == {}
    assert metrics.board_responses.labels("full", "untouched")._value.get() == 1


async def test_rewriting_phase_prepares_the_upstream_request_and_passes_gateway_errors() -> None:
    mw, metrics = middleware("2026-11-02T00:00:00+00:00")

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        assert req.method == "GET" and req[CTX].method == "GET"  # a HEAD is forwarded as GET
        return web.Response(status=502, text="upstream down")

    req = request("HEAD", {"If-None-Match": 'W/"abc", "zzz"', "Range": "bytes=0-1"})
    resp = await mw(req, handler)
    assert resp.status == 502
    ctx = req[CTX]
    assert ctx.method == "HEAD"
    assert ctx.upstream_headers["Accept-Encoding"] == "identity"
    assert ctx.upstream_headers["Range"] is None and ctx.upstream_headers["If-Modified-Since"] is None
    assert ctx.upstream_headers["If-None-Match"] is None  # neither tag was issued by this phase
    assert ctx.decisions["board_cards"] == "removed:not_ok"
    assert metrics.board_responses.labels("removed", "not_ok")._value.get() == 1


async def test_signal_headers_can_be_turned_off() -> None:
    mw, _ = middleware("2026-09-01T00:00:00+00:00", {"signal": False})

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=b"{}")

    resp = await mw(request(), handler)
    assert "Deprecation" not in resp.headers and "Link" not in resp.headers


def test_a_missing_c_scanner_is_logged_once_per_build(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="gateway.board_cards"):
        middleware("2026-11-15T00:00:00+00:00")
    assert json_splice.NATIVE and not caplog.records  # built here (CI builds it)
    monkeypatch.setattr(json_splice, "NATIVE", False)
    with caplog.at_level("WARNING", logger="gateway.board_cards"):
        middleware("2026-11-15T00:00:00+00:00")
    assert [r.getMessage() for r in caplog.records if "gateway.policies.board_cards._jsonscan" in r.getMessage()] and len(caplog.records) == 1
