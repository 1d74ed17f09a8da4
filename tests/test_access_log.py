"""One record per request: the access-log line is the record json.dumps would write (the same fields, in the same
order, with the same values), its numbers rounded to the documented digits, and the metrics and the usage report get
one entry."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from gateway.core.exchange import BodyError, Exchange, UpstreamError
from gateway.core.http import token_fingerprint
from gateway.core.route import Route
from gateway.core.tenants import Tenant
from gateway.core.tracecontext import TraceContext, new_span_id, new_trace_id
from gateway.ops.access_log import Recorder
from gateway.ops.metrics import Metrics
from gateway.ops.usage import UsageCounter
from tests.gateway_testlib import LineCollector


@dataclass
class Case:
    request: web.BaseRequest
    exchange: Exchange | None
    refused: str | None = None
    request_id: str | None = None
    trace: TraceContext | None = None


def _expected(case: Case, status: int, taken: float, now: float) -> str:
    """The record as the access log documents it, encoded by json.dumps."""
    request, ex = case.request, case.exchange
    upstream = ex.record.upstream_seconds if ex else None
    record = {
        "time": round(now, 3),
        "request_id": ex.request_id if ex else case.request_id,
        "trace_id": case.trace.trace_id if case.trace else None,
        "span_id": case.trace.span_id if case.trace else None,
        "tenant": ex.tenant.name if ex else None,
        "route": ex.route.name if ex else "none",
        "method": request.method,
        "path": ex.path if ex else None,
        "status": status,
        "bytes_in": request.content_length,
        "bytes_out": request.writer.output_size,
        "duration": round(taken, 6),
        "upstream_duration": round(upstream, 6) if upstream is not None else None,
        "client": token_fingerprint(request.headers.get("Authorization")),
    }
    if case.refused is not None:
        record["refused"] = case.refused
    if ex is not None:
        if ex.method != request.method:
            record["effective_method"] = ex.method
        if ex.decisions:
            record["decisions"] = ex.decisions
        if ex.notes:
            record["notes"] = ex.notes
        if ex.record.upstream_error:
            record["upstream_error"] = ex.record.upstream_error
        if ex.record.upstream_retries:
            record["upstream_retries"] = ex.record.upstream_retries
        if ex.body_error:
            record["body_error"] = ex.body_error
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def _request(headers: dict[str, str], written: int) -> web.BaseRequest:
    request = make_mocked_request("GET", "/p?q=1", headers=headers)
    request.writer.output_size = written  # what the proxy core wrote to the client
    return request


def _cases() -> list[Case]:
    tenant = Tenant('a"cmé\n', ("h",), URL("http://up"), None, False, False, False)
    route = Route.build("bo\\ard", None, (), ())
    out = []
    for headers in ({"Host": "x"}, {"Host": "x", "Authorization": "Bearer t", "Content-Length": "12"}):
        out.append(Case(_request(headers, 0), None))
        out.append(Case(_request(headers, 123), None, "BAD_PATH", "f" * 32,
                        TraceContext("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", True)))
        for odd in (False, True):
            request = _request(headers, 4567)
            ex = Exchange(request, 0.0, tenant, route, {}, '/pä"th', "q=1", "POST" if odd else "GET")
            ex.request_id = "abc" if odd else None
            ex.record.upstream_seconds = 0.000123456789 if odd else 12.5
            if odd:
                ex.decisions = {"board_cards": "capped", 'x"': "é"}
                ex.notes = {"legacy_upload_guard.rule": "line_endings"}
                ex.record.upstream_failed(UpstreamError.RESET, "reset: X\u2028")
                ex.record.upstream_retries = ["safe_method"]
                ex.body.error = BodyError.ABORTED
            trace = TraceContext(new_trace_id(), new_span_id(), odd, "00f067aa0ba902b7" if odd else None) if odd else None
            out.append(Case(request, ex, trace=trace))
    return out


@pytest.mark.parametrize("taken", [0.0012345678, 3.0, 1e-9, 0.00005, 12345.678901234])
def test_the_line_is_what_json_dumps_writes(monkeypatch: pytest.MonkeyPatch, taken: float) -> None:
    now = 1763747611.0005
    monkeypatch.setattr(time, "time", lambda: now)
    monkeypatch.setattr(time, "monotonic", lambda: taken)  # the duration: monotonic() - started (0)
    sink = LineCollector()
    recorder = Recorder(Metrics(multiprocess=False), None, sink)
    for case in _cases():
        for status in (200, 404, 499):
            recorder.record(case.request, case.exchange, status, 0.0, refused=case.refused,
                            request_id=case.request_id, trace=case.trace)
            # orjson writes a few numbers differently (2.5e-7, not 2.5e-07): the same JSON values, fields and order.
            line, expected = json.loads(sink.lines[-1]), json.loads(_expected(case, status, taken, now))
            assert line == expected and list(line) == list(expected)
            assert "\n" not in sink.lines[-1]


def test_one_record_counts_once_in_each_family() -> None:
    metrics = Metrics(multiprocess=False)
    usage = UsageCounter()
    recorder = Recorder(metrics, usage, None)
    cases = _cases()
    refused, odd = cases[5], cases[7]  # refused before routing; routed, with decisions and an upstream error
    recorder.record(refused.request, None, 400, time.monotonic(), refused="BAD_PATH", request_id="r")
    recorder.record(odd.request, odd.exchange, 502, time.monotonic())
    sample = metrics.registry.get_sample_value
    assert sample("gateway_refused_requests_total", {"code": "BAD_PATH"}) == 1
    assert sample("gateway_upstream_errors_total", {"kind": "reset"}) == 1
    assert sample("gateway_requests_total", {"route": "none", "method": "GET", "status_class": "4xx"}) == 1
    assert sample("gateway_requests_total", {"route": "bo\\ard", "method": "POST", "status_class": "5xx"}) == 1
    batch = usage.take()  # what the usage ledger would write: one request, counted under each of its decisions
    assert batch is not None and batch.count == 2
    totals = {(behaviour, decision): n for (_, behaviour, _, decision), (n, _) in batch.totals().items()}
    assert totals[('x"', "é")] == 1 and sum(n for (b, _), n in totals.items() if b == "board_cards") == 1


def test_a_request_is_timed_by_the_monotonic_clock() -> None:
    """Not by the loop's clock, which ticks in milliseconds under uvloop (0.0 for most small requests), which would
    also put them all in the first bucket of the duration histogram."""
    sink = LineCollector()
    recorder = Recorder(Metrics(multiprocess=False), None, sink)
    case = _cases()[2]
    recorder.record(case.request, case.exchange, 200, time.monotonic() - 0.0123)
    duration = json.loads(sink.lines[-1])["duration"]
    assert 0.0123 <= duration < 1.0


def test_numbers_are_the_rounded_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time`` is rounded to 3 decimals, the durations to 6, and the line reads back as exactly those floats."""
    rng = random.Random(7)
    values = [0.0, 1e-4, 9.99999e-5, 0.00010000049, 3.0, 1e9 - 1e-7, 999999999.9999995, 1e12 - 0.0005, 1e20,
              2.5e-7, 0.0000015, 123.4564999999, 1763747611.0005]  # fmt: skip
    for exponent in range(-9, 14):
        values += [rng.random() * 10**exponent for _ in range(400)]
        values += [round(rng.random() * 10**exponent, rng.randint(0, 8)) for _ in range(100)]
    values += [1763747611 + rng.random() * 1000 for _ in range(2000)]
    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the duration: monotonic() - started (0)
    sink = LineCollector()
    recorder = Recorder(Metrics(multiprocess=False), None, sink)
    case = _cases()[2]
    assert case.exchange is not None
    for value in values:
        clock[0] = case.exchange.record.upstream_seconds = value
        recorder.record(case.request, case.exchange, 200, 0.0)
        record = json.loads(sink.lines[-1])
        assert record["time"] == round(value, 3), value
        assert record["duration"] == record["upstream_duration"] == round(value, 6), value


def test_what_orjson_refuses_is_written_by_the_standard_encoder() -> None:
    """A lone surrogate in a string, an integer beyond 64 bits: the line json.dumps writes."""
    sink = LineCollector()
    recorder = Recorder(Metrics(multiprocess=False), None, sink)
    huge = _request({"Host": "x", "Content-Length": str(2**70)}, 10)
    case = _cases()[2]
    assert case.exchange is not None
    odd = Exchange(huge, 0.0, case.exchange.tenant, case.exchange.route, {}, "/a\udcff", "", "GET")
    records = []
    for request, exchange in ((huge, None), (case.request, odd)):
        recorder.record(request, exchange, 200, time.monotonic())
        records.append(json.loads(sink.lines[-1]))
        assert sink.lines[-1] == json.dumps(records[-1], separators=(",", ":"), ensure_ascii=False)
    assert records[0]["bytes_in"] == 2**70 and records[1]["path"] == "/a\udcff"
