"""deploy/prometheus: `promtool check rules` on both forms of the rules, `promtool test rules` with a firing and a
quiet case for every alert, the PrometheusRule generated from the plain file, and a runbook paragraph per alert."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .deploy_testlib import PROMETHEUS, PROMETHEUS_RULE, RULE_TESTS, RULES, RUNBOOKS, alert_rules

SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool is not installed (Debian package prometheus; ./scripts/test.sh installs it as root)")
    return exe


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_checks_the_plain_rules() -> None:
    proc = run(promtool(), "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_promtool_checks_the_prometheus_rule(tmp_path: Path) -> None:
    exe = promtool()
    resource = yaml.safe_load(PROMETHEUS_RULE.read_text())
    extracted = tmp_path / "from-prometheusrule.yml"
    extracted.write_text(yaml.safe_dump({"groups": resource["spec"]["groups"]}, sort_keys=False))
    proc = run(exe, "check", "rules", str(extracted))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests_pass() -> None:
    proc = run(promtool(), "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    suite = yaml.safe_load(RULE_TESTS.read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in suite["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts without a test where they fire"
    assert names - quiet == set(), "alerts without a test where they stay quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_prometheus_rule_is_generated_from_the_plain_rules() -> None:
    spec = importlib.util.spec_from_file_location("render_prometheusrule", PROMETHEUS / "render_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = module.render(yaml.safe_load(RULES.read_text()))
    assert PROMETHEUS_RULE.read_text() == expected, (
        "deploy/prometheus/prometheusrule.yaml is out of date: run .venv/bin/python "
        "deploy/prometheus/render_prometheusrule.py")
    assert yaml.safe_load(expected)["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_has_severity_summary_and_a_runbook(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    url = annotations["runbook_url"]
    m = re.fullmatch(r"https://\S+/docs/runbooks\.md#([a-z0-9-]+)", url)
    assert m, url
    assert m.group(1) == rule["alert"].lower(), "the anchor is the alert's name"
    assert m.group(1) in _anchors(RUNBOOKS.read_text()), f"docs/runbooks.md has no heading for #{m.group(1)}"


def test_runbooks_document_no_alert_that_does_not_exist() -> None:
    documented = {m.group(1) for m in re.finditer(r"^## (Gateway\w+)\s*$", RUNBOOKS.read_text(), re.MULTILINE)}
    assert documented == {rule["alert"] for rule in alert_rules()}
