"""The deprecated-usage tracker: top clients over a window, in bounded memory."""

from __future__ import annotations

from gateway.ops.usage import UsageTracker


class FakeTime:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_top_clients_by_policy_and_decision() -> None:
    clock = FakeTime()
    tracker = UsageTracker(window_seconds=600, buckets=6, max_clients=100, clock=clock)
    for _ in range(5):
        tracker.record({"legacy_upload_guard": "blocked"}, "aaa", "legacy-client/1.0")
    tracker.record({"legacy_upload_guard": "allowed"}, "aaa", "legacy-client/1.0")
    tracker.record({"legacy_upload_guard": "allowed"}, "bbb", None)
    tracker.record({"board_cards": "capped"}, "bbb", "x" * 500)
    report = tracker.report()
    guard = report["legacy_upload_guard"]
    assert guard["requests"] == 7
    assert guard["by_decision"] == {"blocked": 5, "allowed": 2}
    first = guard["top_clients"][0]
    assert (first["client"], first["user_agent"], first["requests"]) == ("aaa", "legacy-client/1.0", 6)
    assert first["decisions"] == {"blocked": 5, "allowed": 1}
    assert len(report["board_cards"]["top_clients"][0]["user_agent"]) == 200


def test_old_buckets_leave_the_window() -> None:
    clock = FakeTime()
    tracker = UsageTracker(window_seconds=600, buckets=6, clock=clock)
    tracker.record({"p": "d"}, "old", None)
    clock.now += 400
    tracker.record({"p": "d"}, "new", None)
    assert {c["client"] for c in tracker.report()["p"]["top_clients"]} == {"old", "new"}
    clock.now += 300
    assert {c["client"] for c in tracker.report()["p"]["top_clients"]} == {"new"}
    clock.now += 700
    assert tracker.report() == {}


def test_memory_is_bounded_by_max_clients() -> None:
    tracker = UsageTracker(window_seconds=600, buckets=1, max_clients=10, clock=FakeTime())
    for i in range(10_000):
        tracker.record({"p": "d"}, f"client-{i}", None)
    report = tracker.report(top=1000)["p"]
    assert len(report["top_clients"]) == 10
    assert report["untracked_clients_requests"] == 9_990
    assert report["requests"] == 10_000


def test_the_report_says_how_far_its_list_can_be_trusted() -> None:
    tracker = UsageTracker(window_seconds=600, buckets=6, clock=FakeTime())
    for client, n in (("a", 5), ("b", 3), ("c", 3), ("d", 1)):
        for _ in range(n):
            tracker.record({"p": "blocked"}, client, "ua", "acme")
    tracker.record({"p": "allowed"}, "e", None, "globex")
    cut = tracker.report(top=2)["p"]
    assert [(r["client"], r["requests"]) for r in cut["top_clients"]] == [("a", 5), ("b", 3)]  # ties by name
    assert cut["top_clients_complete"] is False and cut["unlisted_max"] == 3 and cut["top_clients_exact"] is True
    assert cut["clients"] == 5 and cut["requests"] == 13
    assert cut["by_tenant"] == {"acme": {"blocked": 12}, "globex": {"allowed": 1}}
    assert cut["top_clients"][0]["tenant"] == "acme"
    whole = tracker.report(top=5)["p"]
    assert whole["top_clients_complete"] is True and whole["unlisted_max"] == 0


def test_totals_count_clients_over_max_clients_too() -> None:
    tracker = UsageTracker(window_seconds=600, buckets=1, max_clients=10, clock=FakeTime())
    for i in range(30):
        tracker.record({"p": "blocked" if i % 2 else "allowed"}, f"client-{i}", None, "acme")
    report = tracker.report(top=100)["p"]
    assert report["by_decision"] == {"allowed": 15, "blocked": 15}
    assert report["by_tenant"] == {"acme": {"allowed": 15, "blocked": 15}}
    assert report["untracked_clients_requests"] == 20 and report["requests"] == 30


# --- merging the reports of several processes (gateway.ops.fleet) ---------------------------------------------------

import asyncio  # noqa: E402
import random  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from gateway.ops import fleet  # noqa: E402
from gateway.ops.fleet import Source, SourceError, collect, local_source  # noqa: E402
from gateway.ops.usage import client_sort_key  # noqa: E402


def _truth(trackers: list[UsageTracker], policy: str) -> dict[tuple[Any, Any, Any], dict[str, int]]:
    """Every client's decisions over all the trackers, from their complete reports."""
    out: dict[tuple[Any, Any, Any], dict[str, int]] = {}
    for tracker in trackers:
        for row in tracker.report(top=1_000_000).get(policy, {"top_clients": []})["top_clients"]:
            key = (row["tenant"], row["client"], row["user_agent"])
            decisions = out.setdefault(key, {})
            for decision, n in row["decisions"].items():
                decisions[decision] = decisions.get(decision, 0) + n
    return out


def _expected_top(truth: dict[tuple[Any, Any, Any], dict[str, int]], top: int) -> list[tuple[Any, ...]]:
    ranked = sorted(truth.items(), key=lambda kv: client_sort_key(sum(kv[1].values()), kv[0]))
    return [(*key, sum(d.values()), d) for key, d in ranked[:top]]


def _rows(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(r["tenant"], r["client"], r["user_agent"], r["requests"], r["decisions"]) for r in report["top_clients"]]


def _replicas(seed: int, count: int, clients: int, requests: int) -> list[UsageTracker]:
    rng = random.Random(seed)
    trackers = [UsageTracker(window_seconds=600, buckets=6, clock=FakeTime()) for _ in range(count)]
    weights = [rng.paretovariate(1.2) for _ in range(clients)]
    for _ in range(requests):
        client = rng.choices(range(clients), weights)[0]
        tracker = trackers[rng.randrange(count)] if rng.random() < 0.7 else trackers[client % count]
        tracker.record({"guard": rng.choice(("blocked", "blocked", "allowed"))}, f"c{client:03d}",
                       f"sdk/{client % 3}", ("acme", "globex")[client % 2])
    return trackers


@pytest.mark.parametrize("seed", range(40))
async def test_the_merge_is_exact_for_counts_and_for_the_top_clients(seed: int) -> None:
    trackers = _replicas(seed, count=2 + seed % 4, clients=5 + seed * 3, requests=300 + seed * 20)
    top = 1 + seed % 7
    collected = await collect([local_source(f"r{i}", t) for i, t in enumerate(trackers)], top)
    merged = collected.report["guard"]
    assert merged["top_clients_exact"] is True and collected.failed == {}
    assert _rows(merged) == [tuple(row) for row in _expected_top(_truth(trackers, "guard"), top)]
    singles = [t.report(top=1)["guard"] for t in trackers if t.report(top=1)]
    assert merged["requests"] == sum(s["requests"] for s in singles)
    by_decision: dict[str, int] = {}
    for single in singles:
        for decision, n in single["by_decision"].items():
            by_decision[decision] = by_decision.get(decision, 0) + n
    assert merged["by_decision"] == by_decision


async def test_a_client_top_on_one_replica_only_and_one_top_nowhere_are_both_found() -> None:
    trackers = [UsageTracker(window_seconds=600, buckets=6, clock=FakeTime()) for _ in range(4)]
    # "spread" makes 8 requests on each replica (32 in all) and is never the first on any of them; "local" makes 30
    # on replica 0 only; every replica also has a local champion with 9 to 12.
    for i, tracker in enumerate(trackers):
        for _ in range(8):
            tracker.record({"guard": "blocked"}, "spread", None, "acme")
        for _ in range(9 + i):
            tracker.record({"guard": "blocked"}, f"champion-{i}", None, "acme")
        for j in range(40):  # a long tail: the lists are cut short
            tracker.record({"guard": "allowed"}, f"tail-{i}-{j}", None, "globex")
    for _ in range(30):
        trackers[0].record({"guard": "blocked"}, "local", None, "acme")
    collected = await collect([local_source(f"r{i}", t) for i, t in enumerate(trackers)], top=2)
    merged = collected.report["guard"]
    assert [(r["client"], r["requests"]) for r in merged["top_clients"]] == [("spread", 32), ("local", 30)]
    assert merged["top_clients_exact"] is True and merged["top_clients_complete"] is False
    assert collected.rounds >= 2  # the first answers (22 clients each) could not decide it
    assert merged["unlisted_max"] <= 30 and merged["requests"] == 4 * 8 + 9 + 10 + 11 + 12 + 4 * 40 + 30


async def test_a_source_that_fails_on_a_later_round_leaves_an_honest_bound() -> None:
    trackers = _replicas(7, count=3, clients=300, requests=3000)
    calls: dict[str, int] = {}

    def flaky(name: str, tracker: UsageTracker) -> Source:
        async def fetch(top: int) -> Any:
            calls[name] = calls.get(name, 0) + 1
            if calls[name] > 1:
                raise SourceError("gone quiet")
            return tracker.report(top)

        return Source(name, fetch)

    collected = await collect([flaky(f"r{i}", t) for i, t in enumerate(trackers)], top=30)
    truth = _truth(trackers, "guard")
    merged = collected.report["guard"]
    assert collected.failed and not merged["top_clients_exact"]
    listed = {(r["tenant"], r["client"], r["user_agent"]): r for r in merged["top_clients"]}
    for key, decisions in truth.items():
        true = sum(decisions.values())
        if key in listed:
            row = listed[key]
            assert row["requests"] <= true <= row.get("requests_max", row["requests"])
        else:
            assert true <= merged["unlisted_max"]


async def test_max_top_bounds_the_questions_and_the_answer_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet, "MAX_TOP", 6)
    trackers = _replicas(3, count=3, clients=80, requests=1500)
    collected = await collect([local_source(f"r{i}", t) for i, t in enumerate(trackers)], top=5)
    merged = collected.report["guard"]
    truth = _truth(trackers, "guard")
    listed = {(r["tenant"], r["client"], r["user_agent"]): r for r in merged["top_clients"]}
    for key, decisions in truth.items():
        true = sum(decisions.values())
        if key in listed:
            assert listed[key]["requests"] <= true <= listed[key].get("requests_max", listed[key]["requests"])
        else:
            assert true <= merged["unlisted_max"]
    assert collected.rounds <= 3


async def test_a_report_from_an_older_gateway_is_read_with_the_bounds_its_list_implies() -> None:
    old = {"guard": {"window_seconds": 600, "requests": 7, "by_decision": {"blocked": 7},
                     "untracked_clients_requests": 0,
                     "top_clients": [{"client": "a", "user_agent": None, "requests": 5, "decisions": {"blocked": 5},
                                      "last_seen": 1.0},
                                     {"client": "b", "user_agent": None, "requests": 2, "decisions": {"blocked": 2},
                                      "last_seen": 2.0}]}}

    async def fetch(top: int) -> Any:
        return old

    collected = await collect([Source("old", fetch), Source("old-2", fetch)], top=1)
    merged = collected.report["guard"]
    assert [(r["client"], r["requests"]) for r in merged["top_clients"]] == [("a", 10)]
    assert merged["requests"] == 14 and merged["top_clients_exact"] is True


async def test_a_worker_that_has_exited_is_left_out_and_one_that_fails_is_named() -> None:
    tracker = UsageTracker(clock=FakeTime())
    tracker.record({"guard": "blocked"}, "a", None, "acme")

    async def gone(top: int) -> Any:
        raise fleet.SourceGone("worker 2")

    async def broken(top: int) -> Any:
        raise SourceError("no answer within 5s")

    collected = await collect([local_source("worker 1", tracker), Source("worker 2", gone)], top=3)
    assert collected.answered == ["worker 1"] and collected.failed == {}
    assert collected.report["guard"]["requests"] == 1
    collected = await collect([local_source("worker 1", tracker), Source("worker 3", broken)], top=3)
    assert collected.failed == {"worker 3": "no answer within 5s"}


def test_name_port_parsing() -> None:
    assert fleet.parse_name_port("deprecation-gateway-admin-pods:9090") == ("deprecation-gateway-admin-pods", 9090)
    assert fleet.parse_name_port("[::1]:9090") == ("::1", 9090)
    for bad in ("pods", "pods:", ":9090", "pods:0", "pods:70000", "pods:x"):
        with pytest.raises(ValueError):
            fleet.parse_name_port(bad)


async def test_discover_returns_one_url_per_address(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    async def fake(host: str, port: int, **kwargs: Any) -> list[Any]:
        assert host == "pods.test" and port == 9090
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::2", 9090, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 9090)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 9090)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 9090))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake)
    assert await fleet.discover("pods.test", 9090) == [
        "http://10.0.0.5:9090", "http://10.0.0.7:9090", "http://[fd00::2]:9090"]


async def test_a_source_whose_answer_is_not_a_usage_report_is_named_as_failed() -> None:
    tracker = UsageTracker(clock=FakeTime())
    tracker.record({"guard": "blocked"}, "a", None, "acme")

    async def odd(top: int) -> Any:
        return {"guard": {"top_clients": "not a list"}}

    collected = await collect([local_source("worker 1", tracker), Source("worker 2", odd)], top=3)
    assert collected.failed == {"worker 2": "the answer is not a usage report (policy 'guard')"}
    assert collected.report["guard"]["requests"] == 1
