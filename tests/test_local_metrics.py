"""The per-request families kept as plain numbers export what prometheus-client's own classes export."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest
from prometheus_client import metrics as prometheus_metrics

from gateway.ops.metrics import Metrics


def _exposition(metrics: Metrics) -> str:
    # Times differ between two objects made one after the other; everything else must not.
    text = generate_latest(metrics.registry).decode()
    return re.sub(r"^(\w+(?:_created|_timestamp_seconds)(?:\{[^}]*\})?) \S+$", r"\1 T", text, flags=re.MULTILINE)


def _exercise(metrics: Metrics) -> None:
    observations = [
        ("acme", "board", "GET", 200, 0.0012, 0.0009),
        ("acme", "board", "GET", 204, 0.001, None),  # exactly on a bucket bound
        ("oldco", "board", "GET", 200, 0.002, 0.001),
        ("acme", "catch_all", "PROPFIND", 404, 0.3, 0.2),
        ("acme", "catch_all", "POST", 503, 301.0, 300.5),  # above the largest bound
        ("none", "other", "HEAD", 99, 0.0, 0.0),
        ("none", "other", "GET", 799, 5, 10),
    ]
    for tenant, route, method, status, seconds, upstream in observations:
        metrics.in_flight.inc()
        metrics.observe_request(tenant, route, method, status, seconds, upstream)
        metrics.in_flight.dec()
    metrics.in_flight.inc()
    metrics.requests.labels("acme", "board", "GET", "2xx").inc(2.5)


@pytest.mark.parametrize("created", [True, False])
def test_local_families_export_what_prometheus_client_exports(monkeypatch: pytest.MonkeyPatch, created: bool) -> None:
    monkeypatch.setattr(prometheus_metrics, "_use_created", created)
    # multiprocess=True outside multiprocess mode: prometheus-client's classes with in-memory values, the reference.
    local, reference = Metrics(multiprocess=False), Metrics(multiprocess=True)
    assert type(local.requests) is not type(reference.requests)
    _exercise(local)
    _exercise(reference)
    assert _exposition(local) == _exposition(reference)
    assert ("_created" in _exposition(local)) is created


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


def test_a_counter_refuses_to_go_down() -> None:
    metrics = Metrics(multiprocess=False)
    with pytest.raises(ValueError):
        metrics.requests.labels("acme", "board", "GET", "2xx").inc(-1)
    with pytest.raises(ValueError):
        metrics.request_duration.labels("board", "extra")
