"""The access-log line is the one json.dumps would write for the record; its numbers are written as json writes them."""

from __future__ import annotations

import json
import random
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from gateway.ops.observability import AccessLogger, Metrics, _seconds, _timestamp, token_fingerprint
from gateway.core.routing import Route
from gateway.core.tenants import Tenant
from gateway.core.exchange import CTX, REFUSAL, RequestContext


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)


def _logger(sink: Lines) -> AccessLogger:
    cls = type("Logger", (AccessLogger,), {"metrics": Metrics(multiprocess=False), "sink": sink})
    return cls(None, "")  # type: ignore[arg-type]


def _expected(request: web.BaseRequest, response: web.StreamResponse, taken: float, now: float) -> str:
    """The record as the access log documented it before it was built by hand, encoded by json.dumps."""
    ctx = request.get(CTX)
    refusal = request.get(REFUSAL)
    upstream = ctx.upstream_seconds if ctx else None
    record = {
        "time": round(now, 3),
        "request_id": ctx.request_id if ctx else (refusal[1] if refusal else None),
        "tenant": ctx.tenant.name if ctx else None,
        "route": ctx.route.name if ctx else "none",
        "method": request.method,
        "path": ctx.path if ctx else None,
        "status": 499 if ctx and ctx.client_aborted else response.status,
        "bytes_in": request.content_length,
        "bytes_out": response.body_length,
        "duration": round(taken, 6),
        "upstream_duration": round(upstream, 6) if upstream is not None else None,
        "client": token_fingerprint(request.headers.get("Authorization")),
    }
    if refusal is not None and ctx is None:
        record["refused"] = refusal[0]
    if ctx is not None:
        if ctx.method != request.method:
            record["effective_method"] = ctx.method
        if ctx.decisions:
            record["decisions"] = ctx.decisions
        if ctx.upstream_error:
            record["upstream_error"] = ctx.upstream_error
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def _requests() -> list[web.BaseRequest]:
    tenant = Tenant('a"cmé\n', ("h",), URL("http://up"), None, False, False, False)
    route = Route.build("bo\\ard", None, (), ())
    out = []
    for headers in ({"Host": "x"}, {"Host": "x", "Authorization": "Bearer t", "Content-Length": "12"}):
        out.append(make_mocked_request("GET", "/p?q=1", headers=headers))
        refused = make_mocked_request("GET", "/p?q=1", headers=headers)
        refused[REFUSAL] = ("BAD_PATH", "f" * 32)
        out.append(refused)
        for aborted in (False, True):
            request = make_mocked_request("GET", "/p?q=1", headers=headers)
            ctx = RequestContext(0.0, tenant, route, {}, '/pä"th', "q=1", "POST" if aborted else "GET")
            ctx.request_id = "abc" if aborted else None
            ctx.upstream_seconds = 0.000123456789 if aborted else 12.5
            ctx.client_aborted = aborted
            if aborted:
                ctx.decisions = {"board_cards": "capped", 'x"': "é"}
                ctx.upstream_error = "reset: X\u2028"
            request[CTX] = ctx
            out.append(request)
    return out


@pytest.mark.parametrize("taken", [0.0012345678, 3.0, 1e-9, 0.00005, 12345.678901234])
def test_the_line_is_what_json_dumps_writes(monkeypatch: pytest.MonkeyPatch, taken: float) -> None:
    now = 1763747611.0005
    monkeypatch.setattr(time, "time", lambda: now)
    monkeypatch.setattr(time, "monotonic", lambda: taken)  # a proxied request's duration: monotonic() - ctx.start (0)
    sink = Lines()
    logger = _logger(sink)
    for request in _requests():
        for status in (200, 404):
            response = web.Response(status=status, body=b"abc")
            if request.get(CTX) is not None:
                logger.metrics.in_flight.inc()
            logger.log(request, response, taken)
            assert sink.lines[-1] == _expected(request, response, taken, now)


def test_a_proxied_request_is_timed_by_the_monotonic_clock() -> None:
    """Not by aiohttp's time_taken, which comes from the loop's clock: milliseconds under uvloop (0.0 for most
    small requests), which would also put them all in the first bucket of the duration histogram."""
    sink = Lines()
    logger = _logger(sink)
    request = _requests()[2]
    ctx = request[CTX]
    ctx.start = time.monotonic() - 0.0123
    logger.metrics.in_flight.inc()
    logger.log(request, web.Response(status=200), 0.0)
    duration = json.loads(sink.lines[-1])["duration"]
    assert 0.0123 <= duration < 1.0


def test_numbers_are_written_as_repr_of_the_rounded_float() -> None:
    rng = random.Random(7)
    values = [0.0, 1e-4, 9.99999e-5, 0.00010000049, 3.0, 1e9 - 1e-7, 999999999.9999995, 1e12 - 0.0005, 1e20,
              2.5e-7, 0.0000015, 123.4564999999, 1763747611.0005]  # fmt: skip
    for exponent in range(-9, 14):
        values += [rng.random() * 10**exponent for _ in range(2000)]
        values += [round(rng.random() * 10**exponent, rng.randint(0, 8)) for _ in range(500)]
    values += [1763747611 + rng.random() * 1000 for _ in range(10000)]
    for value in values:
        assert _seconds(value) == repr(round(value, 6)), value
        assert _timestamp(value) == repr(round(value, 3)), value
