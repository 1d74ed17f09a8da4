"""Helpers of the deployment tests: paths, PromQL selectors, kustomize rendering (kubectl or a file-level fallback)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "gateway-rules.yml"
PROMETHEUS_RULE = PROMETHEUS / "prometheusrule.yaml"
RULE_TESTS = PROMETHEUS / "tests" / "gateway-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "deprecation-gateway.json"
DOCKERFILE = DEPLOY / "Dockerfile"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
KUSTOMIZATIONS = (KUBERNETES / "base", KUBERNETES / "overlays" / "example")


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


# --- PromQL: just enough to find the metric selectors of an expression -------------------------------------------

_TOKEN = re.compile(
    r"""
      "(?:[^"\\]|\\.)*"            # string
    | '(?:[^'\\]|\\.)*'
    | \[[^\]]*\]                   # range or subquery
    | \{[^}]*\}                    # label matchers
    | (?:\d+(?:ms|[smhdwy]))+      # duration (after offset)
    | [A-Za-z_:][A-Za-z0-9_:]*     # identifier: metric, function, keyword
    | \d+(?:\.\d+)?(?:[eE][+-]?\d+)?
    | \S
    """,
    re.VERBOSE,
)
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                           "bottomk", "topk", "quantile", "limitk", "limit_ratio"})
_KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2"}) | _LABEL_LISTS | _AGGREGATIONS
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)


def selectors(expr: str) -> list[Selector]:
    """The instant and range vector selectors of a PromQL expression (Grafana variables may appear in values)."""
    tokens = _TOKEN.findall(expr)
    found: list[Selector] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", token):
            if token in _LABEL_LISTS and nxt == "(":
                depth, i = 0, i + 1
                while i < len(tokens):
                    depth += {"(": 1, ")": -1}.get(tokens[i], 0)
                    if depth == 0:
                        break
                    i += 1
            elif nxt == "(" or token in _KEYWORDS:
                pass  # a function, an aggregation or a keyword
            else:
                matchers: tuple[tuple[str, str, str], ...] = ()
                if nxt.startswith("{"):
                    matchers = _parse_matchers(nxt[1:-1])
                    i += 1
                found.append(Selector(token, matchers))
        elif token.startswith("{"):
            raise AssertionError(f"a selector without a metric name in {expr!r}")
        i += 1
    return found


def grouping_labels(expr: str) -> set[str]:
    """Labels named in by (...), without (...), on (...), ignoring (...), group_left/right (...)."""
    out: set[str] = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        out.update(name.strip() for name in m.group(1).split(",") if name.strip())
    return out


def _parse_matchers(text: str) -> tuple[tuple[str, str, str], ...]:
    out = []
    pos = 0
    while pos < len(text.strip()):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise AssertionError(f"cannot read label matchers {text!r}")
        out.append((m.group(1), m.group(2), m.group(3)))
        pos = m.end()
    return tuple(out)


def literal_values(op: str, value: str) -> list[str]:
    """Label values a matcher names literally: "x" for = and !=, the alternatives of "a|b" for =~ and !~ (none for
    other regular expressions and for Grafana variables)."""
    if "$" in value:
        return []
    if op in ("=", "!="):
        return [value]
    if re.fullmatch(r"[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*", value):
        return value.split("|")
    return []


# --- Alerting rules and the dashboard's queries -------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", ()):
                yield f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert m, f"variable {variable['name']}: unexpected query {query!r}"
            yield f"variable {variable['name']}", m.group(1)


# --- kustomize ----------------------------------------------------------------------------------------------------


def kubectl() -> str | None:
    return shutil.which("kubectl")


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` (kustomize as built into kubectl): the resources exactly as they would be applied."""
    exe = kubectl()
    assert exe is not None
    proc = subprocess.run([exe, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None]


def kustomization(directory: Path) -> dict[str, Any]:
    # A kustomization is a mapping.
    return cast("dict[str, Any]", yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8")))


def file_level_resources(directory: Path) -> list[dict[str, Any]]:
    """Without kustomize: the resources a kustomization lists (recursively) and its generated ConfigMaps, unpatched
    and without name suffixes. Enough for the structural checks; patches and hashes are checked with kubectl."""
    k = kustomization(directory)
    docs: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        path = (directory / entry).resolve()
        docs.extend(file_level_resources(path) if path.is_dir() else load_yaml_documents(path))
    for generator in k.get("configMapGenerator", []):
        data = {}
        for item in generator.get("files", []):
            key, _, name = item.rpartition("=") if "=" in item else (Path(item).name, "", item)
            data[key] = (directory / name).read_text(encoding="utf-8")
        generated = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        if generator.get("behavior") == "replace":
            docs = [d for d in docs if not (d["kind"] == "ConfigMap" and d["metadata"]["name"] == generator["name"])]
        docs.append(generated)
    # The transformers the checks depend on: labels on metadata, and image names and tags.
    for group in k.get("labels", []):
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(group["pairs"])
    for image in k.get("images", []):
        for doc in docs:
            for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                name = container["image"].split("@")[0].rsplit(":", 1)[0] if ":" in container["image"] else container["image"]
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = find(docs, kind, name)
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]
