"""One record per request: its metrics, its count in the usage ledger, and one JSON access-log line.

The edge calls ``Recorder.record`` once per request, from the ``finally`` around everything it does for it
(classification, the chain, writing the answer), however the request ends: answered, refused before routing,
rejected by the HTTP parser, cut off by the client or by the upstream. Nothing here depends on aiohttp calling an
access logger.

The path is logged without its query string (signed file links carry their signature there), and the client as a
fingerprint of its ``Authorization`` header, never the token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Protocol, TextIO

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry, Counter, Histogram

from ..core.exchange import BodyError, Exchange, SubRequest, UpstreamError
from ..core.http import token_fingerprint
from ..core.tracecontext import TraceContext
from .metrics import NO_TENANT, Metrics
from .usage import UsageCounter

__all__ = ("AccessLogWriter", "LineSink", "Recorder", "SubRequestFamilies")

_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class SubRequestFamilies:
    """The requests of a policy's own (a bridge's lookups, pages, uploads), by what the policy named them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gateway_subrequests", "Requests a policy sent upstream of its own (the bridges' lookups, pages, uploads, "
            "deletions), by tenant, purpose and result (the response's status class, or why none came: connect, "
            "timeout, reset, busy, other).", ("tenant", "purpose", "result"), registry=registry,
        )
        self.duration = Histogram(
            "gateway_subrequest_duration_seconds", "Time from sending a policy's own request to its response head, by "
            "purpose.", ("purpose",), buckets=_BUCKETS, registry=registry,
        )


def _result(sub: SubRequest) -> str:
    if sub.error is not None:
        return sub.error
    return _STATUS_CLASSES[min((sub.status or 0) // 100, 5)]


class LineSink(Protocol):
    def write(self, line: str) -> None: ...


class Recorder:
    """Turns a finished request into its metrics, its usage entry and its access-log line."""

    def __init__(self, metrics: Metrics, usage: UsageCounter | None, sink: LineSink | None, *, observe: bool = True):
        self.metrics = metrics
        self.usage = usage
        self.sink = sink  # None: no lines, metrics only
        self.observe = observe  # False: no per-request metric updates (config metrics.enabled)

    def record(
        self,
        request: web.BaseRequest,
        exchange: Exchange | None,
        status: int,
        started: float,
        *,
        refused: str | None = None,
        request_id: str | None = None,
        trace: TraceContext | None = None,
    ) -> None:
        """``status``: what the client was answered (499 when it went away first); ``refused``: the code of a request
        refused before routing (``request_id`` its id); ``trace``: its place in a trace (the gateway's span)."""
        duration = time.monotonic() - started
        metrics = self.metrics
        if exchange is None:
            tenant, route, method, path, upstream, rid = None, "none", request.method, None, None, request_id
            client = token_fingerprint(request.headers.get(hdrs.AUTHORIZATION))
        else:
            tenant, route, method, path = exchange.tenant.name, exchange.route.name, exchange.method, exchange.path
            upstream, rid, client = exchange.upstream_seconds, exchange.request_id, exchange.client
            if exchange.upstream_error_kind is not None:
                metrics.upstream_errors.labels(exchange.upstream_error_kind).inc()
            if exchange.body_error is BodyError.TIMEOUT:
                metrics.client_timeouts.labels("body").inc()
            for reason in exchange.upstream_retries:
                metrics.upstream_retries.labels(reason).inc()
            if exchange.queue_full:
                metrics.upstream_busy.inc()
            if exchange.subrequests:
                self._subrequests(exchange.tenant.name, exchange.subrequests)
            if exchange.decisions and self.usage is not None:
                self.usage.record(exchange.decisions, client, request.headers.get(hdrs.USER_AGENT), tenant)
        if refused is not None:
            metrics.refused.labels(refused).inc()
        if self.observe:
            metrics.observe_request(NO_TENANT if tenant is None else tenant, route, method, status, duration, upstream)
        sink = self.sink
        if sink is None:
            return
        # The line json.dumps(record, separators=(",", ":"), ensure_ascii=False) would write for the record
        # {time, request_id, trace_id, span_id, tenant, route, method, path, status, bytes_in, bytes_out, duration,
        # upstream_duration, client[, refused][, effective_method][, decisions][, notes][, upstream_error]
        # [, upstream_retries][, body_error][, subrequests]}, without building the dict and running the encoder's
        # generic machinery: strings go through the encoder's escaping.
        bytes_in = request.content_length
        bytes_out = request.writer.output_size
        ids = _NO_TRACE if trace is None else f'"{trace.trace_id}","span_id":"{trace.span_id}"'
        line = (
            f'{{"time":{_timestamp(time.time())},"request_id":{"null" if rid is None else _json_string(rid)},'
            f'"trace_id":{ids},'
            f'"tenant":{"null" if tenant is None else _json_string(tenant)},"route":{_json_string(route)},'
            f'"method":{_json_string(request.method)},"path":{"null" if path is None else _json_string(path)},'
            f'"status":{int(status)},"bytes_in":{"null" if bytes_in is None else int(bytes_in)},'
            f'"bytes_out":{int(bytes_out)},"duration":{_seconds(duration)},'
            f'"upstream_duration":{"null" if upstream is None else _seconds(upstream)},'
            f'"client":{"null" if client is None else _json_string(client)}'
        )
        if refused is not None:
            line += f',"refused":{_json_string(refused)}'
        if exchange is not None:
            if exchange.method != request.method:
                line += f',"effective_method":{_json_string(exchange.method)}'
            if exchange.decisions:
                line += f',"decisions":{_json_encode(exchange.decisions)}'
            notes = _notes(exchange)
            if notes:
                line += f',"notes":{_json_encode(notes)}'
            if exchange.upstream_error:
                line += f',"upstream_error":{_json_string(exchange.upstream_error)}'
            if exchange.upstream_retries:
                line += f',"upstream_retries":{_json_encode(exchange.upstream_retries)}'
            if exchange.body_error:
                line += f',"body_error":{_json_string(exchange.body_error)}'
            if exchange.subrequests:
                counts: dict[str, dict[str, int]] = {}
                for sub in exchange.subrequests:
                    per = counts.setdefault(sub.purpose, {})
                    result = str(sub.status) if sub.error is None else sub.error
                    per[result] = per.get(result, 0) + 1
                line += f',"subrequests":{_json_encode(counts)}'
        sink.write(line + "}")

    def _subrequests(self, tenant: str, subrequests: list[SubRequest]) -> None:
        """A policy's own requests: counted as the client's are (upstream errors, busy answers) and by purpose."""
        metrics = self.metrics
        families = metrics.families(SubRequestFamilies)
        for sub in subrequests:
            if sub.error is UpstreamError.BUSY:
                metrics.upstream_busy.inc()
            elif sub.error is not None:
                metrics.upstream_errors.labels(sub.error).inc()
            families.requests.labels(tenant, sub.purpose, _result(sub)).inc()
            families.duration.labels(sub.purpose).observe(sub.seconds)


def _notes(exchange: Exchange) -> dict[str, str]:
    """The line's ``notes``: what the gateway itself noted (an upstream queue that was full, a cut), then the
    policies' own."""
    if not exchange.queue_full and exchange.cut is None:
        return exchange.notes
    own: dict[str, str] = {}
    if exchange.queue_full:
        own["queue"] = "full"
    if exchange.cut is not None:
        own["cut"] = exchange.cut
    return {**own, **exchange.notes}


_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_NO_TRACE = 'null,"span_id":null'  # (trace and span ids are hex digits: written as they are)
_json_string = json.encoder.encode_basestring  # what that encoder does to a str (C implementation)


def _seconds(value: float) -> str:
    """``repr(round(value, 6))``, as json.dumps writes it, without making the rounded float and its repr.

    A decimal of at most 15 significant digits is the shortest text of the float nearest to it, which is its repr;
    repr writes an exponent below 1e-4, and past 15 digits it needs the float itself.
    """
    return _fixed(value, 6, 1e9)


def _timestamp(value: float) -> str:
    """``repr(round(value, 3))``, as json.dumps writes it (see ``_seconds``)."""
    return _fixed(value, 3, 1e12)


def _fixed(value: float, digits: int, upper: float) -> str:
    """``repr(round(value, digits))``; by ``f"{value:.{digits}f}"`` (faster) where that is the same text."""
    if not 1e-4 <= value < upper:
        return repr(round(value, digits))
    text = f"{value:.{digits}f}".rstrip("0")
    return text + "0" if text[-1] == "." else text


class AccessLogWriter:
    """Writes access-log lines to a stream in batches: at most every ``interval`` seconds or ``limit`` bytes.

    One ``write(2)`` per line (what ``logging`` does, with its record, lock and formatter) costs more than the rest
    of a small request's logging; a line is at most ``interval`` late. ``flush()`` runs on shutdown.
    """

    def __init__(self, stream: TextIO | None = None, interval: float = 0.2, limit: int = 64 * 1024) -> None:
        self._stream = stream
        self._interval = interval
        self._limit = limit
        self._lines: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None

    def write(self, line: str) -> None:
        self._lines.append(line)
        self._size += len(line)
        if self._size >= self._limit:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self._interval, self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        self._size = 0
        stream = self._stream or sys.stdout
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            logging.getLogger("gateway").warning("access log: cannot write to stdout", exc_info=True)
