"""The service's limits as the bridges read them (gateway/core/ratelimit.py): what an answer says to wait, and how a
key's window paces the next requests. Through real sockets: tests/integration/test_bridge_limits.py and the upload
upgrade's tests."""

from __future__ import annotations

import email.utils

import pytest

from gateway.core.ratelimit import RateLimited, _Window, limit_wait

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("headers", "status", "wait"), [
    ({"Retry-After": "3"}, 429, 3.0),
    ({"Retry-After": "3"}, 503, 3.0),
    ({}, 503, None),  # a 503 without Retry-After is no limit answer
    ({}, 200, None),
    ({"Retry-After": "2"}, 200, None),
    ({}, 429, 1.0),  # a 429 that says nothing: a second
    ({"X-RateLimit-Reset": "0.25"}, 429, 0.25),
    ({"X-RateLimit-Reset": str(int(NOW) + 7)}, 429, 7.0),  # an epoch second (GitHub's)
    ({"Retry-After": email.utils.formatdate(NOW + 5, usegmt=True)}, 429, 5.0),
    ({"Retry-After": "999999"}, 429, 3600.0),  # no answer blocks for longer than an hour
    ({"Retry-After": "soon"}, 429, 1.0),
    ({"Retry-After": "-1", "X-RateLimit-Reset": "nan"}, 429, 1.0),
])
def test_what_an_answer_says_to_wait(headers: dict[str, str], status: int, wait: float | None) -> None:
    assert limit_wait(headers, status, NOW) == wait


def test_a_cap_counts_each_request_from_its_answer() -> None:
    """The service received a request at the latest when it answered: a cap of 2 a second waits for the answer to
    the second-last request to be a second old (counted from its sending, the third would go at 1.0 and reach a
    service that received the first at 0.3 only 0.7 s later)."""
    window = _Window()
    window.send(0.0)
    window.send(0.05)
    window.stamps.settle(0.0, 0.3)  # the first took 0.3 s (a new connection)
    window.stamps.settle(0.05, 0.35)
    assert window.wait(0.4, 2) == pytest.approx(0.9)
    assert window.wait(1.3, 2) == 0
    window.stamps.settle(7.0, 9.0)  # a request no longer kept (or never added) changes nothing
    assert window.wait(1.3, 2) == 0


def test_a_cap_counts_the_latest_answers_whichever_request_was_sent_first() -> None:
    """Requests in flight together are answered in any order: a cap of 2 a second waits for the second-latest
    answer to be a second old, not for the answer of the second-last request sent (here the first one sent was
    answered last, at 0.9: the service may have received it then, and a third request at 1.2 would make three in
    the second from 0.3)."""
    window = _Window()
    for sent in (0.0, 0.01, 0.02):
        window.send(sent)
    window.stamps.settle(0.01, 0.2)
    window.stamps.settle(0.02, 0.3)
    window.stamps.settle(0.0, 0.9)
    assert window.wait(1.0, 2) == pytest.approx(0.3)
    window.send(1.3)
    assert window.wait(1.3, 2) == pytest.approx(0.6)  # the answer at 0.9 and the request just sent


def test_the_headers_pace_the_window_and_it_renews() -> None:
    window = _Window()
    assert window.wait(0.0, 0) == 0
    seq = window.send(0.0)
    assert window.learn(seq, {"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "0.5"},
                        200, 0.1) is None
    assert window.wait(0.1, 0) == 0  # one more this window
    window.send(0.1)
    assert window.wait(0.2, 0) == pytest.approx(0.4)  # spent: until the reset
    assert window.wait(0.7, 0) == 0  # a new window: the limit again
    for at in (0.7, 0.71, 0.72):
        window.send(at)
    assert window.wait(0.73, 0) > 0


def test_a_429_blocks_the_key_and_teaches_the_window_size() -> None:
    window = _Window()
    for at in (0.0, 0.1, 0.2):
        seq = window.send(at)
        assert window.learn(seq, {}, 200, at + 0.01) is None
    seq = window.send(0.3)
    assert window.learn(seq, {"Retry-After": "1"}, 429, 0.31) == 1.0
    assert window.limit == 3 and window.wait(0.5, 0) == pytest.approx(0.81)
    # After the block: the size learnt, over any window's length.
    for at in (1.4, 1.41, 1.42):
        assert window.wait(at, 0) == 0
        window.send(at)
    assert window.wait(1.43, 0) == pytest.approx(0.97)
    # A second 429 under that pacing (another client shares the token) takes what was taken, or one fewer.
    for at in (2.5, 2.51):
        window.learn(window.send(at), {}, 200, at + 0.01)
    window.learn(window.send(2.6), {"Retry-After": "1"}, 429, 2.61)
    assert window.limit == 2


def test_the_bridges_own_cap() -> None:
    window = _Window()
    for at in (0.0, 0.2):
        window.send(at)
    assert window.wait(0.3, 2) == pytest.approx(0.7) and window.wait(0.3, 3) == 0 and window.wait(0.3, 0) == 0


def test_retry_after_is_whole_seconds() -> None:
    assert RateLimited(0.2, 429).seconds == 1 and RateLimited(2.01, None).seconds == 3
    assert "429" in str(RateLimited(1, 429))
