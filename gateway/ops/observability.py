"""Metric families on a registry owned by the app, and the JSON access log with redaction.

Labels are route names, methods, status classes, decisions and phases: never raw paths, ids, hosts or tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sys
import time
from typing import Any, Protocol, TextIO

from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .. import __version__
from .local_metrics import LocalCounter, LocalGauge, LocalHistogram
from ..core.exchange import CTX, REFUSAL
from .usage import UsageTracker

__all__ = ("AccessLogWriter", "AccessLogger", "LineSink", "Metrics", "token_fingerprint")

_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """Every metric family of the gateway, created once on the given registry.

    The families updated on every request (requests, the two durations, in flight) are plain numbers read at scrape
    time (``local_metrics``) in one process; with ``--workers N`` (prometheus-client's multiprocess mode) they are
    prometheus-client's own, which write every update to the shared directory the scraped worker reads.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, multiprocess: bool | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        if multiprocess is None:
            multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.multiprocess = multiprocess
        requests = ("gateway_requests", "Requests answered, by route, method and status class.")
        duration = ("gateway_request_duration_seconds", "Time from request head to the last response byte, by route.")
        upstream = ("gateway_upstream_duration_seconds", "Time from sending upstream to its response head, by route.")
        in_flight = ("gateway_requests_in_flight", "Requests being handled now.")
        self.requests: Counter | LocalCounter
        self.request_duration: Histogram | LocalHistogram
        self.upstream_duration: Histogram | LocalHistogram
        self.in_flight: Gauge | LocalGauge
        if multiprocess:
            self.requests = Counter(*requests, ("route", "method", "status_class"), registry=r)
            self.request_duration = Histogram(*duration, ("route",), buckets=_BUCKETS, registry=r)
            self.upstream_duration = Histogram(*upstream, ("route",), buckets=_BUCKETS, registry=r)
        else:
            self.requests = LocalCounter(*requests, ("route", "method", "status_class"), registry=r)
            self.request_duration = LocalHistogram(*duration, ("route",), _BUCKETS, registry=r)
            self.upstream_duration = LocalHistogram(*upstream, ("route",), _BUCKETS, registry=r)
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Upstream failures, by kind (connect, timeout, reset, other).",
            ("kind",), registry=r,
        )
        if multiprocess:
            self.in_flight = Gauge(*in_flight, registry=r, multiprocess_mode="livesum")
        else:
            self.in_flight = LocalGauge(*in_flight, registry=r)
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
            # With --workers: each sample from the worker that wrote it last (every scrape rewrites them all), so a
            # worker that has not answered a scrape since a date passed cannot keep an old phase at 1.
            ("tenant", "behaviour", "phase"), registry=r, multiprocess_mode="livemostrecent",
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
        # Children are cached: labels() builds a label tuple (and takes a lock in prometheus-client) per call.
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
            tenant, route, method, path, upstream = None, "none", request.method, None, None
            rid = refusal[1] if refusal else None
        else:
            # aiohttp's time_taken comes from the loop's clock, which ticks in milliseconds under uvloop.
            time_taken = time.monotonic() - ctx.start
            metrics.in_flight.dec()
            tenant, route, method, path = ctx.tenant.name, ctx.route.name, ctx.method, ctx.path
            upstream, rid = ctx.upstream_seconds, ctx.request_id
            if ctx.client_aborted:
                status = 499
        if self.observe:
            metrics.observe_request(route, method, status, time_taken, upstream)
        client = token_fingerprint(request.headers.get(hdrs.AUTHORIZATION))
        if ctx is not None and ctx.decisions and self.usage is not None:
            self.usage.record(ctx.decisions, client, request.headers.get(hdrs.USER_AGENT))
        sink = self.sink
        if sink is None:
            return
        # The line json.dumps(record, separators=(",", ":"), ensure_ascii=False) would write for the record
        # {time, request_id, tenant, route, method, path, status, bytes_in, bytes_out, duration, upstream_duration,
        # client[, refused][, effective_method][, decisions][, upstream_error]}, without building the dict and
        # running the encoder's generic machinery: strings go through the encoder's own escaping.
        bytes_in = request.content_length
        line = (
            f'{{"time":{_timestamp(time.time())},"request_id":{"null" if rid is None else _json_string(rid)},'
            f'"tenant":{"null" if tenant is None else _json_string(tenant)},"route":{_json_string(route)},'
            f'"method":{_json_string(request.method)},"path":{"null" if path is None else _json_string(path)},'
            f'"status":{int(status)},"bytes_in":{"null" if bytes_in is None else int(bytes_in)},'
            f'"bytes_out":{int(response.body_length)},"duration":{_seconds(time_taken)},'
            f'"upstream_duration":{"null" if upstream is None else _seconds(upstream)},'
            f'"client":{"null" if client is None else _json_string(client)}'
        )
        if refusal is not None:
            line += f',"refused":{_json_string(refusal[0])}'
        if ctx is not None:
            if ctx.method != request.method:
                line += f',"effective_method":{_json_string(ctx.method)}'
            if ctx.decisions:
                line += f',"decisions":{_json_encode(ctx.decisions)}'
            if ctx.upstream_error:
                line += f',"upstream_error":{_json_string(ctx.upstream_error)}'
        sink.write(line + "}")


_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
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
