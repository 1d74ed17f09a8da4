"""The gateway's own metric families, on a registry owned by the app; policies add theirs through ``families``. Labels
are bounded: tenant and route names from the config, methods, status classes, decisions and phases, never raw paths,
ids, hosts or tokens. Every family is prometheus-client's, in one process and under ``--workers N``, where ``scrape``
reads every worker's files (its multiprocess mode)."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from .. import __version__

__all__ = ("NO_TENANT", "Metrics", "PhaseCollector", "scrape")

F = TypeVar("F")

_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
# The tenant label of a request refused before its tenant was known (no Host, an unknown one, a bad request target).
NO_TENANT = "none"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """Every metric family of the gateway, created once on the given registry.

    ``multiprocess`` (by default: whether ``PROMETHEUS_MULTIPROC_DIR`` is set, as under ``--workers N``) chooses only
    what ``scrape`` reads: this registry, or every worker's files.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, multiprocess: bool | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        if multiprocess is None:
            multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.multiprocess = multiprocess
        self.requests = Counter(
            "gateway_requests", "Requests answered, by tenant, route, method and status class.",
            ("tenant", "route", "method", "status_class"), registry=r,
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
        self.upstream_retries = Counter(
            "gateway_upstream_retries", "Requests sent to the upstream a second time, by reason (unsent: the pooled "
            "connection failed before the request left; safe_method: a bodyless GET, HEAD, OPTIONS or TRACE whose "
            "connection broke before the response head).", ("reason",), registry=r,
        )
        for reason in ("unsent", "safe_method"):
            self.upstream_retries.labels(reason)
        self.upstream_busy = Counter(
            "gateway_upstream_busy", "Requests answered 503 UPSTREAM_BUSY: their tenant had upstream.max_concurrent_"
            "per_tenant requests in flight for all of upstream.queue_timeout.", registry=r,
        )
        self.in_flight = self._live_gauge("gateway_requests_in_flight", "Requests being handled now.")
        self.refused = Counter(
            "gateway_refused_requests", "Requests refused before routing, by reason code.", ("code",), registry=r,
        )
        self.client_timeouts = Counter(
            "gateway_client_timeouts", "Client connections or requests ended by a time limit, by kind (head: the "
            "request head did not arrive in time; idle: a kept-alive connection stayed idle; body: the request body "
            "stopped arriving).", ("kind",), registry=r,
        )
        for kind in ("head", "idle", "body"):
            self.client_timeouts.labels(kind)  # every kind exported from the start, at 0
        self.connections_refused = Counter(
            "gateway_connections_refused", "Client connections answered 503 and closed: max_connections were open.",
            registry=r,
        )
        self.connections_open = self._live_gauge("gateway_connections_open", "Client connections open now.")
        self.accept_backoffs = Counter(
            "gateway_accept_backoffs", "Times a listener stopped accepting for a second because accept() failed (out "
            "of file descriptors, or of kernel memory), by listener (public, admin).", ("listener",), registry=r,
        )
        for listener in ("public", "admin"):
            self.accept_backoffs.labels(listener)
        self.admin_connections_open = self._live_gauge("gateway_admin_connections_open",
                                                       "Connections to the admin listener open now.")
        self.admin_connections_closed = Counter(
            "gateway_admin_connections_closed", "Connections the admin listener closed itself, by reason (evicted: "
            "the oldest one not being served, to make room for a new one over server.admin_max_connections; "
            "refused: a new one over it, every other being served; head: the request head did not arrive in time; "
            "idle: a kept-alive connection stayed idle).", ("reason",), registry=r,
        )
        for reason in ("evicted", "refused", "head", "idle"):
            self.admin_connections_closed.labels(reason)
        # Computed at each scrape from the plan in force and the clock (never stored): a date that passes, a reload
        # that drops a tenant, and a scrape answered by any worker all show the phases of now.
        self.rollout_phase = PhaseCollector()
        r.register(self.rollout_phase)
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
        self._families: dict[Callable[[CollectorRegistry], Any], Any] = {}
        self._request_children: dict[tuple[str, str, str, str], Counter] = {}
        self._duration_children: dict[str, Histogram] = {}
        self._upstream_children: dict[str, Histogram] = {}

    def _live_gauge(self, name: str, documentation: str) -> Gauge:
        """A gauge without labels, updated per request or connection: the sum over the live workers."""
        return Gauge(name, documentation, registry=self.registry, multiprocess_mode="livesum")

    def observe_request(
        self, tenant: str, route: str, method: str, status: int, seconds: float, upstream: float | None
    ) -> None:
        """``tenant``: a tenant name from the config, or ``NO_TENANT``."""
        # Children are cached: labels() builds a label tuple and takes the family's lock per call.
        key = (tenant, route, method if method in _KNOWN_METHODS else "OTHER", _STATUS_CLASSES[min(status // 100, 5)])
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

    def scrape(self) -> bytes:
        """The Prometheus text of this process (or, under --workers, of every worker)."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        _WorkerFiles(registry, os.environ["PROMETHEUS_MULTIPROC_DIR"])
        registry.register(self.rollout_phase)  # the one family no file holds
        return generate_latest(registry)

    def families(self, make: Callable[[CollectorRegistry], F]) -> F:
        """A policy's metric families: ``make(registry)`` the first time, the same object afterwards (a reload that
        builds the chains again must not register them twice)."""
        found = self._families.get(make)
        if found is None:
            found = self._families[make] = make(self.registry)
        return cast(F, found)


class PhaseCollector(Collector):
    """``gateway_rollout_phase``: 1 for the phase in force now per tenant and dated behaviour, 0 for the others;
    ``source`` gives those samples (the gateway sets it to its plan and clock)."""

    name = "gateway_rollout_phase"
    documentation = "1 for the phase in force now per tenant and dated behaviour, 0 for the others."

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[str, str, str, float]]] | None = None

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, "gauge")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "gauge")
        for tenant, behaviour, phase, value in self.source() if self.source is not None else ():
            metric.add_sample(self.name, {"tenant": tenant, "behaviour": behaviour, "phase": phase}, value)
        return [metric]


_HEADER = 8  # prometheus-client's file header: the bytes used (4) and padding (4)


class _WorkerFiles(MultiProcessCollector):
    """prometheus-client's reader of the workers' files, over the files that are whole.

    prometheus-client makes a worker's file by opening it (empty), then sizing it and writing its header: a scrape
    that lists the directory in between finds a file shorter than the header, which its reader cannot unpack
    (``struct.error``, a 500). A file also vanishes while a scrape reads the directory when the supervisor clears a
    dead worker's live gauges, or when the workers leave. So only the files that hold a header are read, and the
    directory is listed again if one vanished: a file without a header holds no sample yet, and a vanished one
    belongs to a worker that is gone."""

    def __init__(self, registry: CollectorRegistry, path: str) -> None:
        super().__init__(registry, path)  # type: ignore[no-untyped-call]
        self._directory = path

    def _files(self) -> Iterator[str]:
        for path in glob.glob(os.path.join(self._directory, "*.db")):
            try:
                if os.stat(path).st_size >= _HEADER:
                    yield path
            except FileNotFoundError:
                continue

    def collect(self) -> Iterable[Metric]:
        for attempt in range(3):
            try:
                return cast(Iterable[Metric], self.merge(list(self._files()), accumulate=True))  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")
