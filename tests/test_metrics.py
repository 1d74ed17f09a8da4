"""The per-request families: the event loop's own numbers in one process (``_LoopSeries``), prometheus-client's classes
under --workers (its multiprocess mode), exporting the same samples and the same text either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gateway.ops.metrics import Metrics
from tests.process_testlib import ROOT, samples

_OBSERVATIONS = [
    ("board", "GET", 200, 0.0012, 0.0009),
    ("board", "GET", 204, 0.001, None),  # exactly on a bucket bound
    ("board", "PUT", 200, 0.002, 0.001),
    ("catch_all", "PROPFIND", 404, 0.3, 0.2),
    ("catch_all", "POST", 503, 301.0, 300.5),  # above the largest bound
    ("other", "HEAD", 99, 0.0, 0.0),
    ("other", "GET", 799, 5, 10),
    ("board", "GET", 201, 0.0, None),
    ("board", "GET", 299, 0.0025000001, None),  # just above a bucket bound
]

# Run as a worker runs: PROMETHEUS_MULTIPROC_DIR set before prometheus-client is imported; prints what a scrape reads.
_WORKER = f"""
from gateway.ops.metrics import Metrics
metrics = Metrics()
assert metrics.multiprocess
for observation in {_OBSERVATIONS!r}:
    metrics.in_flight.inc()
    metrics.observe_request(*observation)
    metrics.in_flight.dec()
metrics.in_flight.inc()
print(metrics.scrape().decode())
"""


def _exercise(metrics: Metrics) -> None:
    for observation in _OBSERVATIONS:
        metrics.in_flight.inc()
        metrics.observe_request(*observation)
        metrics.in_flight.dec()
    metrics.in_flight.inc()


_PER_REQUEST = ("gateway_requests_", "gateway_request_duration_seconds", "gateway_upstream_duration_seconds",
                "gateway_requests_in_flight")


def _per_request(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    # The multiprocess mode writes no _created samples (a worker's start is not the family's).
    return {key: value for key, value in samples(text).items()
            if key[0].startswith(_PER_REQUEST) and not key[0].endswith("_created")}


def test_one_process_and_workers_export_the_same_samples(tmp_path: Path) -> None:
    one = Metrics(multiprocess=False)
    _exercise(one)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    worker = subprocess.run([sys.executable, "-c", _WORKER], env=env, capture_output=True, text=True, timeout=60)
    assert worker.returncode == 0, worker.stderr
    single, workers = _per_request(one.scrape().decode()), _per_request(worker.stdout)
    # 6 request series, 3 routes in both histograms (17 buckets, count, sum), in flight
    assert len(single) == 6 + 3 * 2 * 19 + 1
    assert json.dumps(sorted(single.items())) == json.dumps(sorted(workers.items()))


def test_values_are_readable_from_the_registry() -> None:
    metrics = Metrics(multiprocess=False)
    _exercise(metrics)
    registry = metrics.registry
    assert registry.get_sample_value("gateway_requests_in_flight") == 1
    labels = {"route": "board", "method": "GET", "status_class": "2xx"}
    assert registry.get_sample_value("gateway_requests_total", labels) == 4
    assert registry.get_sample_value("gateway_requests_total", {**labels, "method": "PUT"}) == 1
    assert registry.get_sample_value("gateway_request_duration_seconds_count", {"route": "catch_all"}) == 2
    assert registry.get_sample_value("gateway_request_duration_seconds_bucket", {"route": "board", "le": "0.001"}) == 2
    assert registry.get_sample_value("gateway_request_duration_seconds_bucket", {"route": "board", "le": "0.0025"}) == 4
    assert registry.get_sample_value("gateway_request_duration_seconds_count", {"route": "board"}) == 5
    assert registry.get_sample_value("gateway_upstream_duration_seconds_sum", {"route": "other"}) == 10


def test_no_created_samples_whatever_prometheus_clients_switch_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: a counter's _created twin doubled every series; the gateway turns prometheus-client's switch off."""
    from prometheus_client import metrics as prometheus_metrics

    monkeypatch.setattr(prometheus_metrics, "_use_created", True)
    metrics = Metrics(multiprocess=False)
    _exercise(metrics)
    text = generate_latest(metrics.registry).decode()
    assert "gateway_requests_total" in text and "_created" not in text


def test_the_loop_series_write_the_text_prometheus_clients_classes_write() -> None:
    """Names, help, types, label order, bucket bounds and number formats: byte for byte what prometheus-client's own
    Counter and Histogram (``_SharedSeries``, in one process) write for the same requests."""
    from prometheus_client import CollectorRegistry

    from gateway.ops.metrics import _SharedSeries

    loop = Metrics(multiprocess=False)
    theirs = CollectorRegistry()
    shared = _SharedSeries(theirs)
    for observation in _OBSERVATIONS:
        loop.observe_request(*observation)
        shared.observe(*observation)
    lines = generate_latest(loop.registry).decode().splitlines()
    names = [line.split()[2 if line.startswith("#") else 0] for line in lines]  # a sample's name with its labels
    ours = [line for name, line in zip(names, lines, strict=True)
            if name.startswith(_PER_REQUEST[:3]) and not name.startswith("gateway_requests_in_flight")]
    assert len(ours) == 3 * 2 + 6 + 3 * 2 * 19
    assert ours == generate_latest(theirs).decode().splitlines()


def test_companies_over_the_bound_share_one_series_and_one_child() -> None:
    """Issue 38: per-company series are bounded, in the exposition and in memory; their counts are not lost."""
    from prometheus_client import Counter

    from gateway.core.series import OTHER, CompanyCounter

    metrics = Metrics(multiprocess=False, max_companies=2)
    family = Counter("gateway_test_decisions", "Test.", ("tenant", "decision"), registry=metrics.registry)
    counter = CompanyCounter(family, metrics.companies)
    assert "gateway_test_decisions_total{" not in generate_latest(metrics.registry).decode()  # nobody counted yet
    for i in range(1000):
        counter.inc((f"c{i}", "blocked"))
    counter.inc(("c1", "allowed"), 2)
    sample = metrics.registry.get_sample_value
    assert sample("gateway_test_decisions_total", {"tenant": "c0", "decision": "blocked"}) == 1
    assert sample("gateway_test_decisions_total", {"tenant": "c1", "decision": "allowed"}) == 2
    assert sample("gateway_test_decisions_total", {"tenant": OTHER, "decision": "blocked"}) == 998
    assert len(counter.children) == 4 and list(metrics.companies.named) == ["c0", "c1"]
