"""Per-request metric families kept as plain numbers in this process, turned into samples when /metrics is read.

prometheus-client takes a lock on every update and finds a histogram bucket by a linear scan. The gateway updates
these families from its event loop only (one thread), so a plain float and a bisection do. They export the same
families, samples and values as prometheus-client's Counter, Histogram and Gauge would. In prometheus-client's
multiprocess mode every update must reach the shared files, so ``Metrics`` uses prometheus-client's own classes
there instead (see ``metrics.Metrics``).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Metric
from prometheus_client import metrics as _prometheus_metrics
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

__all__ = ("LocalCounter", "LocalGauge", "LocalHistogram")

_Child = TypeVar("_Child")
_bucket_label: Callable[[float], str] = floatToGoString  # how prometheus-client writes a bound as the "le" label


def _use_created() -> bool:
    # prometheus-client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES, disable_created_metrics()).
    return bool(getattr(_prometheus_metrics, "_use_created", True))


class _CounterChild:
    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _Labelled(Collector, Generic[_Child]):
    """A labelled family: ``labels(*values)`` finds or makes the child for those values."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}
        registry.register(self)

    def _new_child(self) -> _Child:
        raise NotImplementedError

    def labels(self, *values: object) -> _Child:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError("Incorrect label count")
            child = self._children[key] = self._new_child()
        return child

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]


class LocalCounter(_Labelled[_CounterChild]):
    """A labelled counter: ``labels(*values).inc()``."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)

    def _new_child(self) -> _CounterChild:
        return _CounterChild()

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "counter")
        created = _use_created()
        for key, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, key, strict=True))
            metric.add_sample(self.name + "_total", labels, child.value)
            if created:
                metric.add_sample(self.name + "_created", labels, child.created)
        return [metric]


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bound not below the amount: prometheus-client's "amount <= bound" bucket.
        self.counts[bisect_left(self.bounds, amount)] += 1


class LocalHistogram(_Labelled[_HistogramChild]):
    """A labelled histogram: ``labels(*values).observe(seconds)``."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds[-1] != INF:
            bounds.append(INF)
        self._bounds = bounds
        self._le = [_bucket_label(b) for b in bounds]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self._bounds)

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "histogram")
        created = _use_created()
        for key, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, key, strict=True))
            total = 0.0
            for le, count in zip(self._le, list(child.counts), strict=True):
                total += count
                metric.add_sample(self.name + "_bucket", {**labels, "le": le}, total)
            metric.add_sample(self.name + "_count", labels, total)
            if self._bounds[0] >= 0:
                metric.add_sample(self.name + "_sum", labels, child.sum)
            if created:
                metric.add_sample(self.name + "_created", labels, child.created)
        return [metric]


class LocalGauge(Collector):
    """A gauge without labels: ``inc()``, ``dec()``, ``set()``."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, "gauge")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "gauge")
        metric.add_sample(self.name, {}, self.value)
        return [metric]
