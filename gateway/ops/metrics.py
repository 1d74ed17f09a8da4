"""The gateway's own metric families, on a registry owned by the app; policies add theirs through ``families``. Labels
are bounded: route names from the config, methods, status classes, decisions and phases, never raw paths, ids, hosts
or tokens; the company (``tenant``) only in the deprecation families, where a company's series appear with its first
count and at most ``metrics.max_companies`` companies get their own (``core.series``). No ``_created`` twins. Every
family is prometheus-client's, in one process and under ``--workers N``, where ``scrape`` reads every worker's files
(its multiprocess mode); in one process, the three that every request adds to are the event loop's own numbers, made
samples when scraped (``_LoopSeries``)."""

from __future__ import annotations

import glob
import math
import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .. import __version__
from ..core.series import OTHER, Companies
from ..rollout import RolloutPlan

__all__ = ("NO_TENANT", "Metrics", "PhaseCollector")

F = TypeVar("F")

_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
# The tenant of a request refused before its tenant was known (no Host, an unknown one, a bad request target).
NO_TENANT = "none"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    """Every metric family of the gateway, created once on the given registry.

    ``multiprocess`` (by default: whether ``PROMETHEUS_MULTIPROC_DIR`` is set, as under ``--workers N``) chooses only
    what ``scrape`` reads: this registry, or every worker's files.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, multiprocess: bool | None = None,
                 max_companies: int = 1000) -> None:
        # A counter's _created twin doubles its series, and the gateway's counters start with the process: the
        # process's own start time says as much. (prometheus-client's switch is the process's: it is the gateway's.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        if multiprocess is None:
            multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.multiprocess = multiprocess
        # The companies with series of their own in the per-company families (the policies' deprecation families).
        self.companies = Companies(max_companies)
        # The three families every request adds to: numbers of the event loop's own in one process, read when scraped;
        # prometheus-client's, which write to the worker's files, under --workers.
        self._series: _LoopSeries | _SharedSeries = _SharedSeries(r) if multiprocess else _LoopSeries(r)
        self.observe_request = self._series.observe
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
        self.rollout_phase = PhaseCollector(self.companies)
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

    def _live_gauge(self, name: str, documentation: str) -> Gauge:
        """A gauge without labels, updated per request or connection: the sum over the live workers."""
        return Gauge(name, documentation, registry=self.registry, multiprocess_mode="livesum")

    def scrape(self) -> bytes:
        """The Prometheus text of this process (or, under --workers, of every worker)."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        files = _WorkerFiles(None, os.environ["PROMETHEUS_MULTIPROC_DIR"])
        found = list(files.collect())
        # The one family no file holds: the per-company phases of every company the workers counted.
        found += self.rollout_phase.metrics(_companies_in(found))
        registry = CollectorRegistry()
        registry.register(_Found(found))
        return generate_latest(registry)

    def families(self, make: Callable[[CollectorRegistry], F]) -> F:
        """A policy's metric families: ``make(registry)`` the first time, the same object afterwards (a reload that
        builds the chains again must not register them twice)."""
        found = self._families.get(make)
        if found is None:
            found = self._families[make] = make(self.registry)
        return cast(F, found)


# The families every request adds to: (name, help) of each.
_REQUESTS = ("gateway_requests", "Requests answered, by route, method and status class (every company's: the company "
             "is a label of the deprecation families only).")
_REQUEST_DURATION = ("gateway_request_duration_seconds", "Time from request head to the last response byte, by route.")
_UPSTREAM_DURATION = ("gateway_upstream_duration_seconds", "Time from sending upstream to its response head, by route.")
_REQUEST_LABELS = ("route", "method", "status_class")
_BOUNDS = (*_BUCKETS, math.inf)
# The ``le`` label of each bucket, as prometheus-client writes it.
_LE = tuple(floatToGoString(bound) for bound in _BOUNDS)  # type: ignore[no-untyped-call]


def _request_key(route: str, method: str, status: int) -> tuple[str, str, str]:
    return route, method if method in _KNOWN_METHODS else "OTHER", _STATUS_CLASSES[min(status // 100, 5)]


class _Buckets:
    """One histogram series of ``_LoopSeries``: how many observations fell in each bucket (not cumulative), and their
    sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * len(_BOUNDS)
        self.sum = 0.0

    def cumulative(self) -> list[tuple[str, float]]:
        total, buckets = 0, []
        for le, count in zip(_LE, list(self.counts), strict=True):
            total += count
            buckets.append((le, float(total)))
        return buckets


class _LoopSeries(Collector):
    """The families every request adds to, in one process: plain numbers the event loop adds to, made samples when
    scraped (the same names, labels, buckets and text as prometheus-client's ``Counter`` and ``Histogram``).
    prometheus-client's children take a lock for each of the five numbers a request moves and look its bucket up in
    Python: 2.5 µs a request, against 0.6 µs here (docs/benchmarks.md, "The 1 KB request across issues 32 to 38").
    Only the event loop writes; a scrape on another thread reads copies."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests: dict[tuple[str, str, str], int] = {}
        self._durations: dict[str, _Buckets] = {}
        self._upstream: dict[str, _Buckets] = {}
        registry.register(self)

    def observe(self, route: str, method: str, status: int, seconds: float, upstream: float | None) -> None:
        requests = self._requests
        key = _request_key(route, method, status)
        requests[key] = requests.get(key, 0) + 1
        series = self._durations.get(route) or self._durations.setdefault(route, _Buckets())
        series.counts[bisect_left(_BOUNDS, seconds)] += 1  # the first bucket whose bound is >= seconds
        series.sum += seconds
        if upstream is not None:
            series = self._upstream.get(route) or self._upstream.setdefault(route, _Buckets())
            series.counts[bisect_left(_BOUNDS, upstream)] += 1
            series.sum += upstream

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(*_REQUESTS, labels=_REQUEST_LABELS),
                HistogramMetricFamily(*_REQUEST_DURATION, labels=("route",)),
                HistogramMetricFamily(*_UPSTREAM_DURATION, labels=("route",))]

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(*_REQUESTS, labels=_REQUEST_LABELS)
        for key, count in list(self._requests.items()):
            requests.add_metric(key, count)
        found: list[Metric] = [requests]
        for (name, documentation), series in ((_REQUEST_DURATION, self._durations),
                                              (_UPSTREAM_DURATION, self._upstream)):
            family = HistogramMetricFamily(name, documentation, labels=("route",))
            for route, buckets in list(series.items()):
                family.add_metric((route,), buckets.cumulative(), buckets.sum)
            found.append(family)
        return found


class _SharedSeries:
    """The same families as ``_LoopSeries``, prometheus-client's own: under --workers each worker writes them to its
    files, which a scrape reads."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(*_REQUESTS, _REQUEST_LABELS, registry=registry)
        self.request_duration = Histogram(*_REQUEST_DURATION, ("route",), buckets=_BUCKETS, registry=registry)
        self.upstream_duration = Histogram(*_UPSTREAM_DURATION, ("route",), buckets=_BUCKETS, registry=registry)
        # Children are cached: labels() builds a label tuple and takes the family's lock per call.
        self._requests: dict[tuple[str, str, str], Counter] = {}
        self._durations: dict[str, Histogram] = {}
        self._upstream: dict[str, Histogram] = {}

    def observe(self, route: str, method: str, status: int, seconds: float, upstream: float | None) -> None:
        key = _request_key(route, method, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(*key)
        child.inc()
        duration = self._durations.get(route)
        if duration is None:
            duration = self._durations[route] = self.request_duration.labels(route)
        duration.observe(seconds)
        if upstream is not None:
            up = self._upstream.get(route)
            if up is None:
                up = self._upstream[route] = self.upstream_duration.labels(route)
            up.observe(upstream)


class PhaseCollector(Collector):
    """The rollout's phases now, from ``source`` (the plan in force and the instant; the gateway sets it):

    - ``gateway_rollout_companies``: per dated behaviour and phase, how many companies are in it (a few series,
      whatever the number of companies);
    - ``gateway_rollout_phase``: per company, 1 for the phase in force and 0 for the others, for the companies that
      have series of their own (``companies``: those counted in a deprecation family), so that an alert can join a
      company's counts with its phase."""

    documentation = "1 for the phase in force now per company and dated behaviour, 0 for the others; for the " \
        "companies counted in a deprecation family (gateway_rollout_companies counts every company)."
    census_documentation = "Companies in each phase of each dated behaviour, now."

    def __init__(self, companies: Companies) -> None:
        self.companies = companies
        self.source: Callable[[], tuple[RolloutPlan, float] | None] | None = None

    def describe(self) -> Iterable[Metric]:
        return [Metric("gateway_rollout_companies", self.census_documentation, "gauge"),
                Metric("gateway_rollout_phase", self.documentation, "gauge")]

    def collect(self) -> Iterable[Metric]:
        return self.metrics(tuple(self.companies.named))  # (a copy: the event loop adds to it meanwhile)

    def metrics(self, tenants: Iterable[str]) -> list[Metric]:
        census = Metric("gateway_rollout_companies", self.census_documentation, "gauge")
        phases = Metric("gateway_rollout_phase", self.documentation, "gauge")
        found = self.source() if self.source is not None else None
        if found is not None:
            plan, now = found
            for behaviour, phase, count in plan.phase_counts(now):
                census.add_sample("gateway_rollout_companies", {"behaviour": behaviour, "phase": phase}, count)
            for tenant, behaviour, phase, value in plan.phase_samples(now, tenants):
                phases.add_sample("gateway_rollout_phase", {"tenant": tenant, "behaviour": behaviour, "phase": phase},
                                  value)
        return [census, phases]


def _companies_in(found: Iterable[Metric]) -> set[str]:
    """The companies named in the samples of per-company families."""
    return {tenant for metric in found for sample in metric.samples
            if (tenant := sample.labels.get("tenant")) is not None and tenant != OTHER}


class _Found(Collector):
    """Metrics collected already, for one scrape."""

    def __init__(self, found: list[Metric]) -> None:
        self.found = found

    def collect(self) -> Iterable[Metric]:
        return self.found


_HEADER = 8  # prometheus-client's file header: the bytes used (4) and padding (4)


class _WorkerFiles(MultiProcessCollector):
    """prometheus-client's reader of the workers' files, over the files that are whole.

    prometheus-client makes a worker's file by opening it (empty), then sizing it and writing its header: a scrape
    that lists the directory in between finds a file shorter than the header, which its reader cannot unpack
    (``struct.error``, a 500). A file also vanishes while a scrape reads the directory when the supervisor clears a
    dead worker's live gauges, or when the workers leave. So only the files that hold a header are read, and the
    directory is listed again if one vanished: a file without a header holds no sample yet, and a vanished one
    belongs to a worker that is gone."""

    def __init__(self, registry: CollectorRegistry | None, path: str) -> None:
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
