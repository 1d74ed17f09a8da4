"""Writes prometheusrule.yaml (prometheus-operator) from gateway-rules.yml (plain Prometheus), the one source.

    .venv/bin/python deploy/prometheus/render_prometheusrule.py           # rewrite prometheusrule.yaml
    .venv/bin/python deploy/prometheus/render_prometheusrule.py --check   # exit 1 if it is out of date

tests/deploy/test_prometheus_rules.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "gateway-rules.yml"
TARGET = HERE / "prometheusrule.yaml"
HEADER = (
    "# Generated from gateway-rules.yml by render_prometheusrule.py: edit that file and run the script again.\n"
    "# The same alerting rules as a prometheus-operator resource; included by deploy/kubernetes/base.\n"
    "# A Prometheus whose ruleSelector wants a label (often `release: <name>`) needs it added by an overlay.\n"
)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line PromQL stays readable as a literal block.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules: dict[str, Any]) -> str:
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "deprecation-gateway", "labels": {"app.kubernetes.io/component": "alerts"}},
        "spec": {"groups": rules["groups"]},
    }
    body = yaml.dump(resource, Dumper=_Dumper, sort_keys=False, width=200, default_flow_style=False)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether prometheusrule.yaml is current")
    args = parser.parse_args(argv)
    text = render(yaml.safe_load(SOURCE.read_text(encoding="utf-8")))
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
