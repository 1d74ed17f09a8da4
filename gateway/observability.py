"""Metric families on a registry owned by the app, and the JSON access log with redaction.

Labels are route names, methods, status classes, decisions and phases: never raw paths, ids, hosts or tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import time
from typing import Any, Protocol, TextIO

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from . import __version__
from .typedefs import CTX, REFUSAL
from .usage import UsageTracker

__all__ = ("AccessLogWriter", "AccessLogger", "LineSink", "Metrics", "token_fingerprint")

_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """Every metric family of the gateway, created once on the given registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "Requests answered, by route, method and status class.",
            ("route", "method", "status_class"), registry=r,
        )
        self.request_duration = Histogram(
            "gateway_request_duration_seconds", "Time from request head to the last response byte, by route.",
            ("route",), buckets=_BUCKETS, registry=r,
        )
        self.upstream_duration = Histogram(
            "gateway_upstream_duration_seconds", "Time from sending upstream to its response head, by route.",
            ("route",), buckets=_BUCKETS, registry=r,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Upstream failures, by kind (connect, timeout, reset, other).",
            ("kind",), registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests being handled now.", registry=r, multiprocess_mode="livesum"
        )
        self.refused = Counter(
            "gateway_refused_requests", "Requests refused before routing, by reason code.", ("code",), registry=r,
        )
        # Families of the deprecation policies, created here once so that rebuilding chains never re-registers.
        self.legacy_uploads = Counter(
            "gateway_legacy_uploads", "Uploads on deprecated routes, by route and decision (allowed, blocked, refused).",
            ("route", "decision"), registry=r,
        )
        self.board_responses = Counter(
            "gateway_board_responses", "Board responses, by phase and action (untouched, capped, removed, "
            "passed_through_unparsed, too_large, not_ok).", ("phase", "action"), registry=r,
        )
        self.board_cards_removed = Counter(
            "gateway_board_cards_removed", "Cards withheld from board responses.", registry=r,
        )
        self.rollout_phase = Gauge(
            "gateway_rollout_phase", "1 for the phase in force now per tenant and dated behaviour, 0 for the others.",
            ("tenant", "behaviour", "phase"), registry=r, multiprocess_mode="livemax",
        )
        self.config_reloads = Counter(
            "gateway_config_reloads", "Configuration reloads (SIGHUP), by result (success, failure).", ("result",),
            registry=r,
        )
        self.config_last_reload = Gauge(
            "gateway_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully (start-up or reload).", registry=r,
            multiprocess_mode="livemax",
        )
        self.config_last_reload.set_to_current_time()
        # A gauge rather than an Info: it also works in prometheus-client's multiprocess mode.
        self.build_info = Gauge(
            "gateway_build_info", "Always 1; the version is a label.", ("version",), registry=r,
            multiprocess_mode="livemax",
        )
        self.build_info.labels(__version__).set(1)
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._duration_children: dict[str, Any] = {}
        self._upstream_children: dict[str, Any] = {}

    def observe_request(self, route: str, method: str, status: int, seconds: float, upstream: float | None) -> None:
        # Children are cached: labels() costs a lock and a dict build per call.
        key = (route, method if method in _KNOWN_METHODS else "OTHER", _STATUS_CLASSES[min(status // 100, 5)])
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()
        duration = self._duration_children.get(route)
        if duration is None:
            duration = self._duration_children[route] = self.request_duration.labels(route)
        duration.observe(seconds)
        if upstream is not None:
            up = self._upstream_children.get(route)
            if up is None:
                up = self._upstream_children[route] = self.upstream_duration.labels(route)
            up.observe(upstream)


def token_fingerprint(authorization: str | None) -> str | None:
    """A short, stable, non-reversible name for the client's credentials; never the token itself."""
    if not authorization:
        return None
    return hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).hexdigest()[:12]


class AccessLogger(AbstractAccessLogger):
    """Runs once per finished request (aiohttp calls it after the last byte): metrics, then one JSON line.

    The path is logged without its query string: signed file links carry their signature there.
    """

    metrics: Metrics
    usage: UsageTracker | None = None
    sink: LineSink | None = None  # None: no lines, metrics only
    observe = True  # False: no per-request metric updates (config metrics.enabled)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time_taken: float) -> None:
        ctx = request.get(CTX)
        metrics = self.metrics
        status = response.status
        refusal = None
        if ctx is None:
            refusal = request.get(REFUSAL)
            route, method, path, upstream = "none", request.method, None, None
            rid = refusal[1] if refusal else None
        else:
            metrics.in_flight.dec()
            route, method, path, upstream, rid = ctx.route.name, ctx.method, ctx.path, ctx.upstream_seconds, ctx.request_id
            if ctx.client_aborted:
                status = 499
        if self.observe:
            metrics.observe_request(route, method, status, time_taken, upstream)
        client = token_fingerprint(request.headers.get("Authorization"))
        if ctx is not None and ctx.decisions and self.usage is not None:
            self.usage.record(ctx.decisions, client, request.headers.get("User-Agent"))
        sink = self.sink
        if sink is None:
            return
        record = {
            "time": round(time.time(), 3),
            "request_id": rid,
            "tenant": ctx.tenant.name if ctx is not None else None,
            "route": route,
            "method": request.method,
            "path": path,
            "status": status,
            "bytes_in": request.content_length,
            "bytes_out": response.body_length,
            "duration": round(time_taken, 6),
            "upstream_duration": round(upstream, 6) if upstream is not None else None,
            "client": client,
        }
        if refusal is not None:
            record["refused"] = refusal[0]
        if ctx is not None:
            if ctx.method != request.method:
                record["effective_method"] = ctx.method
            if ctx.decisions:
                record["decisions"] = ctx.decisions
            if ctx.upstream_error:
                record["upstream_error"] = ctx.upstream_error
        sink.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False))


class LineSink(Protocol):
    def write(self, line: str) -> None: ...


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
