"""W3C Trace Context, read and written (``core.tracecontext``): the cases of the W3C test suite (test/test.py, strict
level 2) and of the Recommendation's text, and the trace a request gets at the edge (``ops.tracing.Tracing.begin``)."""

from __future__ import annotations

import collections
import re

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.config.tracing import TracingConfig
from gateway.core.tracecontext import (
    MAX_TRACESTATE,
    TraceContext,
    TraceParent,
    format_traceparent,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    parse_tracestate,
)
from gateway.ops.metrics import Metrics
from gateway.ops.tracing import Tracing, ratio_bound

TID = "12345678901234567890123456789012"
PID = "1234567890123456"
VALID = f"00-{TID}-{PID}-01"


@pytest.mark.parametrize("value", [
    VALID,
    f" {VALID}", f"\t{VALID}", f"{VALID} ", f"{VALID}\t", f"\t {VALID} \t",  # optional whitespace
    f"cc-{TID}-{PID}-01",  # a future version, read as far as 00 goes
    f"cc-{TID}-{PID}-01-what-the-future-will-be-like",
])
def test_a_valid_traceparent_is_continued(value: str) -> None:
    assert parse_traceparent([value]) == TraceParent(TID, PID, True)


@pytest.mark.parametrize("value", [
    f"00-{TID}-{PID}-01.",  # version 00 is exactly 55 characters
    f"00-{TID}-{PID}-01-what-the-future-will-be-like",
    f"cc-{TID}-{PID}-01.what-the-future-will-be-like",  # a longer future version continues with '-'
    f"ff-{TID}-{PID}-01",  # forbidden version
    f".0-{TID}-{PID}-01", f"0.-{TID}-{PID}-01", f"000-{TID}-{PID}-01", f"0000-{TID}-{PID}-01", f"0-{TID}-{PID}-01",
    f"00-{'0' * 32}-{PID}-01",  # all-zero ids
    f"00-{TID}-{'0' * 16}-01",
    f"00-.2345678901234567890123456789012-{PID}-01", f"00-1234567890123456789012345678901.-{PID}-01",
    f"00-{TID}3-{PID}-01", f"00-{TID[:-1]}-{PID}-01",
    f"00-{TID}-.234567890123456-01", f"00-{TID}-123456789012345.-01",
    f"00-{TID}-{PID}7-01", f"00-{TID}-{PID[:-1]}-01",
    f"00-{TID}-{PID}-.0", f"00-{TID}-{PID}-0.", f"00-{TID}-{PID}-001", f"00-{TID}-{PID}-1",
    f"00-{TID.upper().replace('1', 'A')}-{PID}-01",  # upper-case hex
    f"00-{TID}-{PID.replace('1', 'B')}-01",
    "", "00", "garbage",
])
def test_an_invalid_traceparent_is_ignored(value: str) -> None:
    assert parse_traceparent([value]) is None


def test_a_traceparent_given_twice_is_ignored() -> None:
    assert parse_traceparent([f"00-{TID[:-1]}1-{PID}-01", f"00-{TID}-{PID}-01"]) is None
    assert parse_traceparent([VALID, VALID]) is None


@pytest.mark.parametrize(("flags", "sampled"), [("00", False), ("01", True), ("09", True), ("08", False), ("ff", True)])
def test_only_the_sampled_bit_of_the_flags_is_read(flags: str, sampled: bool) -> None:
    assert parse_traceparent([f"00-{TID}-{PID}-{flags}"]) == TraceParent(TID, PID, sampled)


def test_what_is_sent_is_version_00_with_the_sampled_flag_only() -> None:
    assert format_traceparent(TID, PID, True) == VALID
    assert format_traceparent(TID, PID, False) == f"00-{TID}-{PID}-00"


ALL_KEY = "abcdefghijklmnopqrstuvwxyz0123456789_-*/"
ALL_VALUE = "".join(map(chr, [*range(0x20, 0x2C), *range(0x2D, 0x3D), *range(0x3E, 0x7F)]))


@pytest.mark.parametrize(("values", "expected"), [
    (["foo=1,bar=2"], "foo=1,bar=2"),
    (["foo=1,bar=2", "rojo=1,congo=2", "baz=3"], "foo=1,bar=2,rojo=1,congo=2,baz=3"),  # joined in order
    ([""], ""), (["", "foo=1"], "foo=1"), (["foo=1", ""], "foo=1"), ([" , ,\t"], ""),  # empty members
    (["foo=1 \t , \t bar=2, \t baz=3"], "foo=1,bar=2,baz=3"),  # optional whitespace
    (["foo=1\t \t,\t \tbar=2,\t \tbaz=3"], "foo=1,bar=2,baz=3"),
    ([" foo=1"], "foo=1"), (["\tfoo=1"], "foo=1"), (["foo=1 "], "foo=1"), (["foo=1\t"], "foo=1"),
    (["\t foo=1 \t"], "foo=1"),
    (["foo= leading"], "foo= leading"),  # a value's leading spaces are its own
    ([f"{ALL_KEY}={ALL_VALUE}"], f"{ALL_KEY}={ALL_VALUE}"),  # every allowed character
    ([f"{ALL_KEY}@a-z0-9_-*/={ALL_VALUE}"], f"{ALL_KEY}@a-z0-9_-*/={ALL_VALUE}"),
    (["foo=1", "z" * 256 + "=1"], "foo=1," + "z" * 256 + "=1"),  # the longest keys
    (["foo=1", "t" * 241 + "@" + "v" * 14 + "=1"], "foo=1," + "t" * 241 + "@" + "v" * 14 + "=1"),
    (["1tenant@vendor=x"], "1tenant@vendor=x"),  # a tenant id may begin with a digit
])
def test_a_valid_tracestate_is_passed_on(values: list[str], expected: str) -> None:
    if len(expected) > MAX_TRACESTATE:
        pytest.skip("longer than what is sent on: see the truncation test")
    assert parse_tracestate(values) == expected


@pytest.mark.parametrize("values", [
    ["foo=1,foo=1"], ["foo=1,foo=2"], ["foo=1", "foo=1"], ["foo=1", "foo=2"],  # a key given twice
    ["foo =1"], ["FOO=1"], ["foo.bar=1"], ["1foo=1"],  # key grammar
    ["foo@=1,bar=2"], ["@foo=1,bar=2"], ["foo@@bar=1,bar=2"], ["foo@bar@baz=1,bar=2"],  # vendor format
    ["foo=1", "z" * 257 + "=1"], ["foo=1", "t" * 242 + "@v=1"], ["foo=1", "t@" + "v" * 15 + "=1"],  # key length
    ["foo=bar=baz"], ["foo=,bar=3"], ["foo"], ["foo=a\u00e9"], ["foo=" + "x" * 257],  # value grammar and length
    [",".join(f"bar{i:02d}={i:02d}" for i in range(1, 34))],  # 33 members
    ["bar01=01,bar02=02,bar03=03,bar04=04,bar05=05,bar06=06,bar07=07,bar08=08,bar09=09,bar10=10",
     "bar11=11,bar12=12,bar13=13,bar14=14,bar15=15,bar16=16,bar17=17,bar18=18,bar19=19,bar20=20",
     "bar21=21,bar22=22,bar23=23,bar24=24,bar25=25,bar26=26,bar27=27,bar28=28,bar29=29,bar30=30",
     "bar31=31,bar32=32,bar33=33"],
])
def test_an_invalid_tracestate_is_dropped_whole(values: list[str]) -> None:
    assert parse_tracestate(values) == ""


def test_32_members_pass() -> None:
    members = [f"bar{i:02d}={i:02d}" for i in range(1, 33)]
    assert parse_tracestate([",".join(members[:10]), ",".join(members[10:])]) == ",".join(members)


def test_a_long_tracestate_loses_whole_members_long_ones_first_then_from_the_end() -> None:
    long = "big=" + "x" * 200  # over 128 characters: the first to go
    small = [f"k{i:02d}=" + "v" * 40 for i in range(20)]  # 44 characters each
    sent = parse_tracestate([",".join([small[0], long, *small[1:]])])
    assert len(sent) <= MAX_TRACESTATE
    kept = sent.split(",")
    assert "big=" not in sent and kept == small[: len(kept)] and len(kept) == (MAX_TRACESTATE + 1) // 45
    # Under the bound, nothing is cut, long members included.
    assert parse_tracestate([f"a=1,{long}"]) == f"a=1,{long}"


def test_ids_are_random_lower_case_hex_never_zero() -> None:
    traces = {new_trace_id() for _ in range(2000)}
    spans = {new_span_id() for _ in range(2000)}
    assert len(traces) == 2000 and len(spans) == 2000
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) and t != "0" * 32 for t in traces)
    assert all(re.fullmatch(r"[0-9a-f]{16}", s) and s != "0" * 16 for s in spans)
    # Every hex digit about as often as the others (16 x 2000 x 48 draws): not a constant or a counter.
    counts = collections.Counter("".join(traces) + "".join(spans))
    assert set(counts) == set("0123456789abcdef") and max(counts.values()) < 1.2 * min(counts.values())


def test_ids_drawn_as_zeros_are_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """All zeros is not a valid trace or span id: such a draw (once in 2**64 draws at best) is thrown away."""
    from gateway.core import tracecontext

    zeros = [0]

    def draw(digits: int = 32) -> str:
        zeros[0] -= 1
        return ("0" if zeros[0] >= 0 else "1") * digits

    monkeypatch.setattr(tracecontext, "random_hex", draw)
    zeros[0] = 3  # the new trace's draw, then two of new_trace_id's
    trace = tracecontext.new_trace()
    assert (trace.trace_id, trace.span_id) == ("1" * 32, "1" * 16)
    zeros[0] = 1  # the span id drawn ahead with the trace was zeros too: the first upstream request's is drawn again
    assert trace.client_span("GET", None, None).traceparent == f"00-{'1' * 32}-{'1' * 16}-01"  # type: ignore[arg-type]
    zeros[0] = 2
    assert new_trace_id() == "1" * 32
    zeros[0] = 2
    assert new_span_id() == "1" * 16
    parent = parse_traceparent([VALID])
    assert parent is not None
    zeros[0] = 2
    assert tracecontext.continued_trace(parent, "").span_id == "1" * 16


_METRICS = Metrics(multiprocess=False)


def _trace(headers: list[tuple[str, str]], **config: object) -> TraceContext | None:
    tracing = Tracing(TracingConfig.model_validate(config), _METRICS)
    return tracing.begin(make_mocked_request("GET", "/x", headers=CIMultiDict(headers)))


def test_the_edge_continues_a_clients_trace_with_a_span_of_its_own() -> None:
    trace = _trace([("TraceParent", VALID), ("tracestate", "foo=1"), ("TRACESTATE", "bar=2")])
    assert trace is not None
    assert (trace.trace_id, trace.parent_id, trace.sampled, trace.tracestate) == (TID, PID, True, "foo=1,bar=2")
    assert re.fullmatch(r"[0-9a-f]{16}", trace.span_id) and trace.span_id != PID
    spans = {trace.client_span("GET", None, None).traceparent for _ in range(3)}  # type: ignore[arg-type]
    # Each upstream request: the client's trace, a parent id of its own, the flag as received.
    assert len(spans) == 3 and all(re.fullmatch(rf"00-{TID}-[0-9a-f]{{16}}-01", s) for s in spans)
    # The first one's id was drawn with the request's own (one draw): a different slice of it, not the same id.
    assert trace.span_id not in {s.split("-")[2] for s in spans}
    new = _trace([])
    assert new is not None
    first, second = (new.client_span("GET", None, None).traceparent.split("-")[2] for _ in range(2))  # type: ignore[arg-type]
    assert len({new.span_id, first, second, new.trace_id[:16], new.trace_id[16:]}) == 5
    unsampled = _trace([("traceparent", f"00-{TID}-{PID}-00")])
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize("headers", [
    [], [("traceparent", f"00-{'0' * 32}-{PID}-01"), ("tracestate", "foo=1")], [("tracestate", "foo=1")],
    [("traceparent", VALID), ("traceparent", VALID)], [("trace-parent", VALID)],
])
def test_without_a_valid_traceparent_the_edge_starts_a_trace_or_none(headers: list[tuple[str, str]]) -> None:
    trace = _trace(headers)
    assert trace is not None and trace.trace_id != TID and trace.parent_id is None and trace.tracestate == ""
    assert trace.sampled  # sample_ratio 1.0
    assert _trace(headers, new_traces=False) is None


def test_the_sample_ratio_marks_that_share_of_new_traces_by_their_id() -> None:
    tracing = Tracing(TracingConfig(sample_ratio=0.25), _METRICS)
    request = make_mocked_request("GET", "/x")
    traces = [tracing.begin(request) for _ in range(4000)]
    sampled = [t for t in traces if t is not None and t.sampled]
    assert 800 < len(sampled) < 1200
    bound = ratio_bound(0.25)
    assert all((int(t.trace_id[16:], 16) < bound) == t.sampled for t in traces if t is not None)
    never = Tracing(TracingConfig(sample_ratio=0.0), _METRICS)
    assert not any(t is not None and t.sampled for t in (never.begin(request) for _ in range(200)))
    # A client's own decision is followed, whatever the ratio.
    assert all(t is not None and t.sampled for t in (_trace([("traceparent", VALID)], sample_ratio=0.0),))
