"""The per-request families: prometheus-client's classes in one process and under --workers (its multiprocess mode),
exporting the same samples either way."""

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
    ("acme", "board", "GET", 200, 0.0012, 0.0009),
    ("acme", "board", "GET", 204, 0.001, None),  # exactly on a bucket bound
    ("oldco", "board", "GET", 200, 0.002, 0.001),
    ("acme", "catch_all", "PROPFIND", 404, 0.3, 0.2),
    ("acme", "catch_all", "POST", 503, 301.0, 300.5),  # above the largest bound
    ("none", "other", "HEAD", 99, 0.0, 0.0),
    ("none", "other", "GET", 799, 5, 10),
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
metrics.requests.labels("acme", "board", "GET", "2xx").inc(2.5)
print(metrics.scrape().decode())
"""


def _exercise(metrics: Metrics) -> None:
    for observation in _OBSERVATIONS:
        metrics.in_flight.inc()
        metrics.observe_request(*observation)
        metrics.in_flight.dec()
    metrics.in_flight.inc()
    metrics.requests.labels("acme", "board", "GET", "2xx").inc(2.5)


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
    labels = {"tenant": "acme", "route": "board", "method": "GET", "status_class": "2xx"}
    assert registry.get_sample_value("gateway_requests_total", labels) == 4.5
    assert registry.get_sample_value("gateway_requests_total", {**labels, "tenant": "oldco"}) == 1
    assert registry.get_sample_value("gateway_request_duration_seconds_count", {"route": "catch_all"}) == 2
    assert registry.get_sample_value("gateway_request_duration_seconds_bucket", {"route": "board", "le": "0.001"}) == 1
    assert registry.get_sample_value("gateway_request_duration_seconds_count", {"route": "board"}) == 3
    assert registry.get_sample_value("gateway_upstream_duration_seconds_sum", {"route": "other"}) == 10


def test_created_samples_follow_prometheus_clients_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import metrics as prometheus_metrics

    for created in (True, False):
        monkeypatch.setattr(prometheus_metrics, "_use_created", created)
        metrics = Metrics(multiprocess=False)
        _exercise(metrics)
        assert ("gateway_requests_created" in generate_latest(metrics.registry).decode()) is created


def test_a_counter_refuses_to_go_down() -> None:
    metrics = Metrics(multiprocess=False)
    with pytest.raises(ValueError):
        metrics.requests.labels("acme", "board", "GET", "2xx").inc(-1)
    with pytest.raises(ValueError):
        metrics.request_duration.labels("board", "extra")
