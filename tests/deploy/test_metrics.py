"""The dashboard and the alerting rules query only what the gateway exports: every metric name (and every label
value they name literally) is checked against a live /metrics scrape of a gateway started here and exercised so
that every family has samples, and against the families declared in gateway/observability.py."""

from __future__ import annotations

import re

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.lifecycle import Reloads
from gateway.ops.metrics import Metrics
from gateway.policies.board_cards.backfill import REASONS
from gateway.policies.board_cards.policy import BOARD_CARDS, Action
from gateway.policies.legacy_upload_guard.policy import DECISIONS
from gateway.policies.legacy_upload_guard.upgrade import OUTCOMES
from gateway.rollout import FixedClock, parse_instant
from tests.gateway_testlib import (
    AdminFactory, GatewayFactory, Received, RecordingUpstream, free_port, guarded_routes, make_config,
)

from tests.process_testlib import ROOT

from .deploy_testlib import DASHBOARD, alert_rules, dashboard_queries, grouping_labels, literal_values, selectors

# Labels a scrape adds (prometheus-operator's ServiceMonitor or a plain scrape config), not the gateway.
TARGET_LABELS = frozenset({"namespace", "job", "instance", "pod", "service", "endpoint", "container"})
BOARD = json.dumps({"id": 1, "name": "Board", "cards": [{"id": i, "title": f"card {i}"} for i in range(3)]}).encode()


@dataclass
class Scrape:
    families: set[str] = field(default_factory=set)
    samples: dict[str, list[dict[str, str]]] = field(default_factory=lambda: defaultdict(list))
    probes: dict[str, int] = field(default_factory=dict)


@pytest.fixture
async def scrape(upstream: RecordingUpstream, start_gateway: GatewayFactory, start_admin: AdminFactory,
                 tmp_path: Path) -> AsyncIterator[Scrape]:
    async def responder(request: web.BaseRequest, received: Received) -> web.StreamResponse:
        if "/boards/" in received.raw_path:
            return web.Response(body=BOARD, content_type="application/json")
        return web.json_response({"ok": True})

    upstream.responder = responder
    config = make_config(upstream.url, routes=guarded_routes())
    for route in config["routes"]:
        if route["name"] == "board":
            route["chain"] = [{"board_cards": {"cap": 2}}]
    # A company whose upstream is gone: upstream errors.
    config["tenants"].append({"name": "gone", "hosts": ["gone.test"], "upstream": f"http://127.0.0.1:{free_port()}"})
    # After the removal date: the board route withdraws cards.
    gw = await start_gateway(config, clock=FixedClock(parse_instant("2026-11-15T12:00:00Z")))
    admin_url = await start_admin(gw, access_log=None)
    async with aiohttp.ClientSession() as client:
        async def call(method: str, path: str, **kwargs: Any) -> int:
            async with client.request(method, yarl.URL(gw.url + path, encoded=True), **kwargs) as resp:
                await resp.read()
                return resp.status

        assert await call("GET", "/api/v1/boards/1") == 200
        assert await call("GET", "/api/v1/cards/1") == 200
        # acme (created 2026-06-01) forbids legacy uploads; oldco (2025) does not.
        assert await call("PUT", "/api/v1/cards/1/files", data=b"file bytes") == 403
        assert await call("PUT", "/api/v1/cards/1/files", data=b"file bytes", headers={"Host": "old.test"}) == 200
        assert await call("GET", "/api/v1/cards/%2F1") == 400
        assert await call("GET", "/api/v1/cards/1", headers={"Host": "gone.test"}) == 502
        # A SIGHUP reload of a file that cannot be read: refused, counted.
        await Reloads(gw.gateway, str(tmp_path / "missing.yaml")).reload()
        result = Scrape()
        for path in ("/livez", "/readyz"):
            async with client.get(admin_url + path) as resp:
                result.probes[path] = resp.status
        async with client.get(admin_url + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    for family in text_string_to_metric_families(text):
        result.families.add(family.name)
        for sample in family.samples:
            result.samples[sample.name].append(sample.labels)
    yield result


# The deprecation families' series appear with a company's first count (issue 38): the values they can hold, from the
# code that counts them, for those the exercise above does not reach.
DECLARED: dict[str, dict[str, set[str]]] = {
    "gateway_legacy_uploads_total": {"tenant": set(), "route": set(), "decision": set(DECISIONS)},
    "gateway_board_responses_total": {"tenant": set(), "phase": set(BOARD_CARDS.phases), "action": set(Action)},
    "gateway_board_cards_removed_total": {"tenant": set()},
    "gateway_board_backfills_total": {"tenant": set(), "outcome": {"done", *REASONS}},
    "gateway_legacy_upload_upgrades_total": {"tenant": set(), "outcome": set(OUTCOMES)},
}


def declared_families() -> set[str]:
    """The core's families and every policy's, as the default config (every policy on a route) declares them."""
    from gateway.app import Gateway, build_state, load_config

    async def nowhere(exchange: Any) -> Any:
        raise AssertionError("not called")

    metrics = Metrics()
    config = load_config(ROOT / "config" / "gateway.yaml")
    Gateway(config, metrics=metrics)  # the usage ledger's families (nothing is started)
    build_state(config, nowhere, FixedClock(parse_instant("2026-11-24T00:00:00Z")), metrics)
    return {family.name for family in metrics.registry.collect()}


def check_expression(where: str, expr: str, scrape: Scrape) -> list[str]:
    problems = []
    found = selectors(expr)
    if not found:
        problems.append(f"{where}: no metric in {expr!r}")
    for selector in found:
        declared = DECLARED.get(selector.metric, {})
        if selector.metric not in scrape.samples and not declared:
            problems.append(f"{where}: {selector.metric} is not exported by the gateway")
            continue
        series = scrape.samples.get(selector.metric, [])
        for label, op, value in selector.matchers:
            if label in TARGET_LABELS:
                continue
            present = {labels.get(label) for labels in series} | declared.get(label, set())
            if not present - {None} and label not in declared:
                problems.append(f"{where}: {selector.metric} has no label {label!r}")
                continue
            for literal in literal_values(op, value):
                if literal not in present:
                    problems.append(f"{where}: {selector.metric}{{{label}={literal!r}}}: no such series "
                                    f"(values seen: {sorted(v for v in present if v is not None)})")
    exported = {name for s in found for labels in scrape.samples.get(s.metric, ()) for name in labels}
    exported |= {name for s in found for name in DECLARED.get(s.metric, {})}
    # label_replace(v, "dst", "replacement", "src", "regex") makes its destination label.
    exported |= set(re.findall(r',\s*"([A-Za-z_]\w*)"\s*,\s*"[^"]*"\s*,\s*"[^"]*"\s*,\s*"[^"]*"\s*\)', expr))
    for label in grouping_labels(expr) - TARGET_LABELS - exported:
        problems.append(f"{where}: groups by {label!r}, a label none of its metrics has")
    return problems


def test_admin_probes_answer(scrape: Scrape) -> None:
    """The paths of the image's HEALTHCHECK and of the Deployment's probes."""
    assert scrape.probes == {"/livez": 200, "/readyz": 200}


def test_the_exercise_makes_every_declared_family_appear(scrape: Scrape) -> None:
    missing = declared_families() - scrape.families
    assert not missing, f"families with no sample in the scrape (exercise them in the fixture): {sorted(missing)}"


def test_dashboard_queries_only_exported_metrics(scrape: Scrape) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    problems = [p for where, expr in dashboard_queries(dashboard) for p in check_expression(where, expr, scrape)]
    assert not problems, "\n".join(problems)


def test_alert_rules_query_only_exported_metrics(scrape: Scrape) -> None:
    problems = [p for rule in alert_rules() for p in check_expression(rule["alert"], rule["expr"], scrape)]
    assert not problems, "\n".join(problems)


def test_the_check_reports_unknown_metrics_labels_and_values(scrape: Scrape) -> None:
    assert check_expression("ok", 'sum(rate(gateway_legacy_uploads_total{decision="blocked"}[5m]))', scrape) == []
    assert check_expression("x", "rate(gateway_legacy_upload_total[5m])", scrape)
    assert check_expression("x", 'gateway_legacy_uploads_total{outcome="blocked"}', scrape)
    assert check_expression("x", 'gateway_legacy_uploads_total{decision=~"blocked|forbidden"}', scrape)
    assert check_expression("x", 'gateway_board_responses_total{action!="rewritten"}', scrape)
    assert check_expression("x", "sum by (outcome) (rate(gateway_legacy_uploads_total[5m]))", scrape)


def test_dashboard_shows_every_metric_family() -> None:
    """A family added to gateway/observability.py gets a panel (deploy/grafana/deprecation-gateway.json)."""
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {s.metric for _, expr in dashboard_queries(dashboard) for s in selectors(expr)}
    suffixes = ("", "_total", "_bucket", "_sum", "_count")
    missing = {f for f in declared_families() if not any(f + suffix in queried for suffix in suffixes)}
    assert not missing, f"families no dashboard panel queries: {sorted(missing)}"


def test_dashboard_structure() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "deprecation-gateway" and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] in ("row", "text"):
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert 'namespace=~"$namespace", job=~"$job"' in target["expr"], (panel["title"], target["expr"])
    titles = {p["title"] for p in panels}
    for needed in ("Requests by route", "Upstream errors by kind", "Request duration p99 by route",
                   "Legacy uploads by decision", "Board responses by phase and action", "Rollout phase in force",
                   "Top clients of deprecated behaviour"):
        assert needed in titles
    text = next(p for p in panels if p["type"] == "text")["options"]["content"]
    assert "/deprecations" in text and "gateway usage" in text and "/status" in text and "--csv" in text
    assert "Usage ledger writes by result" in titles


# The families that carry the company (tenant names from the config): the deprecation decisions (issue 38: the
# requests are by route only).
TENANT_FAMILIES = ("gateway_legacy_uploads_total", "gateway_board_responses_total",
                   "gateway_board_cards_removed_total", "gateway_rollout_phase")


def test_the_dashboard_filters_every_per_company_family_by_the_tenant_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    tenant = variables["tenant"]
    assert tenant["type"] == "query" and tenant["includeAll"] and tenant["multi"] and tenant["allValue"] == ".*"
    assert "gateway_rollout_phase" in tenant["query"]["query"]  # every company counted in a deprecation family
    checked = 0
    for where, expr in dashboard_queries(dashboard):
        for selector in selectors(expr):
            if (selector.metric in TENANT_FAMILIES or selector.metric in DECLARED) and where.startswith("panel"):
                assert ("tenant", "=~", "$tenant") in selector.matchers, (where, expr)
                checked += 1
    assert checked >= 10
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Legacy uploads by tenant and decision", "Board responses by tenant and action",
            "Cards withheld per second by tenant", "Companies in each phase"} <= titles


def test_the_deprecation_alerts_fire_per_company() -> None:
    for rule in alert_rules():
        if rule["alert"] in ("GatewayLegacyUploadsAfterForbidDate", "GatewayBoardCardsAfterRemovalDate",
                             "GatewayBoardCardsExemptedAfterRemovalDate"):
            assert "tenant" in grouping_labels(rule["expr"]), rule["alert"]
            assert "$labels.tenant" in rule["annotations"]["summary"], rule["alert"]


def test_every_request_and_deprecation_family_has_a_tenant_label(scrape: Scrape) -> None:
    """Every sample of those families names its company, and only the companies counted in them have series; the
    requests are by route (issue 38)."""
    for family in TENANT_FAMILIES:
        samples = [labels for name, series in scrape.samples.items() if name == family for labels in series]
        assert samples, family
        assert all("tenant" in labels for labels in samples), family
    assert not [labels for labels in scrape.samples["gateway_requests_total"] if "tenant" in labels]
    uploads = {labels["tenant"] for labels in scrape.samples["gateway_legacy_uploads_total"]}
    assert uploads == {"acme", "oldco"}
