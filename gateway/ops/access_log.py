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
from typing import Any, Protocol, TextIO

import orjson
from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry, Counter, Histogram

from ..config.ledger import ClientNames
from ..core.exchange import BodyError, Exchange, SubRequest, UpstreamError
from ..core.http import token_fingerprint
from ..core.tracecontext import TraceContext
from .metrics import Metrics
from .usage import UsageCounter

__all__ = ("AccessLogWriter", "LineSink", "Recorder", "SubRequestFamilies")

_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class SubRequestFamilies:
    """The requests of a policy's own (a bridge's lookups, pages, uploads), by what the policy named them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gateway_subrequests", "Requests a policy sent upstream of its own (the bridges' lookups, pages, uploads, "
            "deletions), by purpose and result (the response's status class, or why none came: connect, timeout, "
            "reset, busy, other).", ("purpose", "result"), registry=registry,
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

    def __init__(self, metrics: Metrics, usage: UsageCounter | None, sink: LineSink | None, *, observe: bool = True,
                 names: ClientNames | None = None):
        self.metrics = metrics
        self.usage = usage
        self.sink = sink  # None: no lines, metrics only
        self.observe = observe  # False: no per-request metric updates (config metrics.enabled)
        self.names = names or None  # the clients the operator named (usage.clients): the line says the name

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
            upstream, rid, client = exchange.record.upstream_seconds, exchange.request_id, exchange.client
            self._count(request, exchange, client)
        if refused is not None:
            metrics.refused.labels(refused).inc()
        if self.observe:
            metrics.observe_request(route, method, status, duration, upstream)
        sink = self.sink
        if sink is None:
            return
        trace_id, span_id = (None, None) if trace is None else (trace.trace_id, trace.span_id)
        # The fields in their documented order (docs/operations.md, "Access log"); the optional ones after "client".
        record: dict[str, Any] = {
            "time": round(time.time(), 3),
            "request_id": rid,
            "trace_id": trace_id,
            "span_id": span_id,
            "tenant": tenant,
            "route": route,
            "method": request.method,
            "path": path,
            "status": status,
            "bytes_in": request.content_length,
            "bytes_out": request.writer.output_size,
            "duration": round(duration, 6),
            "upstream_duration": None if upstream is None else round(upstream, 6),
            "client": client,
        }
        self._optional_fields(record, request, exchange, refused)
        sink.write(_line(record))

    def _optional_fields(self, record: dict[str, Any], request: web.BaseRequest, exchange: Exchange | None,
                         refused: str | None) -> None:
        """The fields after "client" that a line has only when they apply: its name, why it was refused, and what a
        routed request's policies decided."""
        names = self.names
        if names is not None:
            named = names.find(record["client"], request.headers.get(hdrs.USER_AGENT))
            if named is not None:
                record["client_name"] = named.name
        if refused is not None:
            record["refused"] = refused
        if exchange is not None:
            _exchange_fields(record, request.method, exchange)

    def _count(self, request: web.BaseRequest, exchange: Exchange, client: str | None) -> None:
        """What a routed request adds to the metrics beside its own count, and to the usage ledger."""
        metrics = self.metrics
        seen = exchange.record
        if seen.upstream_error_kind is not None:
            metrics.upstream_errors.labels(seen.upstream_error_kind).inc()
        if exchange.body_error is BodyError.TIMEOUT:
            metrics.client_timeouts.labels("body").inc()
        for reason in seen.upstream_retries:
            metrics.upstream_retries.labels(reason).inc()
        if seen.queue_full:
            metrics.upstream_busy.inc()
        if seen.subrequests:
            self._subrequests(seen.subrequests)
        if exchange.decisions and self.usage is not None:
            self.usage.record(exchange.decisions, client, request.headers.get(hdrs.USER_AGENT), exchange.tenant.name,
                              exchange)

    def _subrequests(self, subrequests: list[SubRequest]) -> None:
        """A policy's own requests: counted as the client's are (upstream errors, busy answers) and by purpose."""
        metrics = self.metrics
        families = metrics.families(SubRequestFamilies)
        for sub in subrequests:
            if sub.error is UpstreamError.BUSY:
                metrics.upstream_busy.inc()
            elif sub.error is not None:
                metrics.upstream_errors.labels(sub.error).inc()
            families.requests.labels(sub.purpose, _result(sub)).inc()
            families.duration.labels(sub.purpose).observe(sub.seconds)


def _notes(exchange: Exchange) -> dict[str, str]:
    """The line's ``notes``: what the gateway itself noted (an upstream queue that was full, a cut), then the
    policies' own."""
    seen = exchange.record
    if not seen.queue_full and seen.cut is None:
        return exchange.notes
    own: dict[str, str] = {}
    if seen.queue_full:
        own["queue"] = "full"
    if seen.cut is not None:
        own["cut"] = seen.cut
    return {**own, **exchange.notes}


def _line(record: dict[str, Any]) -> str:
    try:
        return _dumps(record).decode()
    except TypeError:  # orjson's JSONEncodeError: a lone surrogate in a string, an integer beyond 64 bits
        return _json_encode(record)


def _exchange_fields(record: dict[str, Any], client_method: str, exchange: Exchange) -> None:
    """The optional fields of a routed request's line, those it has, in their documented order."""
    if exchange.method != client_method:
        record["effective_method"] = exchange.method
    if exchange.decisions:
        record["decisions"] = exchange.decisions
    notes = _notes(exchange)
    if notes:
        record["notes"] = notes
    seen = exchange.record
    if seen.upstream_error:
        record["upstream_error"] = seen.upstream_error
    if seen.upstream_retries:
        record["upstream_retries"] = seen.upstream_retries
    if exchange.body_error:
        record["body_error"] = exchange.body_error
    if seen.subrequests:
        record["subrequests"] = _subrequest_counts(seen.subrequests)


def _subrequest_counts(subrequests: list[SubRequest]) -> dict[str, dict[str, int]]:
    """A policy's own requests by purpose, then by status (or why none came)."""
    counts: dict[str, dict[str, int]] = {}
    for sub in subrequests:
        per = counts.setdefault(sub.purpose, {})
        result = str(sub.status) if sub.error is None else sub.error
        per[result] = per.get(result, 0) + 1
    return counts


_dumps = orjson.dumps
_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


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
