"""Issue 38: what a company costs the state a config is built into (measured with tracemalloc, the config's own model
aside): its resolved tenant once, shared by the host map and the rollout plan, and nothing per company that could
wait for its first request (its schedules, its metric series)."""

from __future__ import annotations

import gc
import tracemalloc

from gateway.app import build_state, parse_config
from gateway.ops.metrics import Metrics
from gateway.rollout import FixedClock, parse_instant
from tests.bench_testlib import load

tenants = load("tenants")


def _built(companies: int) -> int:
    """Bytes the built state of a config of ``companies`` holds, beside its config."""
    config = parse_config(tenants.config(companies))
    gc.collect()
    tracemalloc.start()
    try:
        state = build_state(config, None, FixedClock(parse_instant("2026-10-20T00:00:00Z")), Metrics())  # type: ignore[arg-type]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert state.rollout.schedules and state.tenants.tenants
    return held


def test_a_company_costs_the_built_state_a_few_hundred_bytes() -> None:
    """A Tenant resolved twice (host map, rollout plan) cost about 600 bytes a company; once, about 360."""
    per_company = (_built(2000) - _built(1)) / 1999
    assert per_company < 450, per_company
