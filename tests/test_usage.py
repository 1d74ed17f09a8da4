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
