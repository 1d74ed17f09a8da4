"""The walk-through in docs/architecture.md ("Adding a policy") is code that works: its module is run as a policy
package would be, registered beside the shipped behaviours, built, and driven before and after its date."""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
import textwrap
import types
from pathlib import Path
from typing import Any

from gateway.app import parse_config
from gateway.ops.metrics import Metrics
from gateway.policies import BEHAVIOURS, BuildContext
from gateway.rollout import FixedClock, RolloutConfig, RolloutPlan, rollout_problems
from tests.gateway_testlib import make_config
from tests.policy_testlib import Terminal, exchange_for, mocked_request, with_rollout

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def _walkthrough_module() -> types.ModuleType:
    text = DOC.read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match is not None, "docs/architecture.md has no python block"
    spec = importlib.util.spec_from_loader("gateway.policies.expand_guard", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "gateway.policies"
    exec(compile(textwrap.dedent(match.group(1)), str(DOC), "exec"), module.__dict__)  # noqa: S102 - our own doc
    return module


async def test_the_documented_policy_runs_as_documented() -> None:
    module: Any = _walkthrough_module()
    behaviours = {**BEHAVIOURS, module.EXPAND.name: module.EXPAND}
    config = parse_config(make_config("http://127.0.0.1:1"))
    tenants = [(t.resolve(), t.rollout) for t in config.model.tenants]
    rollout = RolloutConfig.model_validate({"expand_all_removal": "2027-02-01"})
    assert rollout_problems(rollout, tenants, behaviours) == []  # its date flag is a known key once registered
    assert rollout_problems(rollout, tenants, BEHAVIOURS) == ["rollout.expand_all_removal: Extra inputs are not permitted"]
    plan = RolloutPlan.build(rollout, tenants, behaviours)
    metrics = Metrics()

    async def run(at: str) -> tuple[str, dict[str, str]]:
        clock = FixedClock(dt.datetime.fromisoformat(at))
        ctx = BuildContext(route="card_list", params=frozenset(), clock=clock, timezone=dt.UTC, rollout=plan,
                           families=metrics.families)
        policy = module.SPEC.make(module.Options(), ctx)
        request = mocked_request("GET", "/api/latest/cards?board_id=1&expand=all")
        exchange = with_rollout(exchange_for(config, request, "card_list", {}), plan, clock)
        exchange.query = "board_id=1&expand=all"
        core = Terminal()
        reply = await policy(exchange, core)
        assert reply.headers["Deprecation"] == "@1788220800"
        return core.seen[-1].query, exchange.decisions

    assert await run("2027-01-15T00:00:00+00:00") == ("board_id=1&expand=all", {"expand_guard": "accepted"})
    assert await run("2027-02-02T00:00:00+00:00") == ("board_id=1", {"expand_guard": "stripped"})
    sample = metrics.registry.get_sample_value
    assert sample("gateway_expand_all_total", {"tenant": "acme", "phase": "accepted"}) == 1
    assert sample("gateway_expand_all_total", {"tenant": "acme", "phase": "stripped"}) == 1


# The package map: one line a package (its path by indentation, two spaces a level), then the modules named on that
# line and the lines under it that are indented further without naming a package.
_PACKAGE = re.compile(r"^( *)([a-z_]+/)(?= |$)")
_MODULE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*\.(?:py|pyi|c))\b")


def _package_map() -> dict[str, set[str]]:
    text = DOC.read_text()
    section = text[text.index("## The package map"):]
    match = re.search(r"```\n(.*?)```", section, re.S)
    assert match is not None, "docs/architecture.md's package map has no block"
    found: dict[str, set[str]] = {}
    path: list[str] = []
    current = ""
    for line in match.group(1).splitlines():
        head = _PACKAGE.match(line)
        if head:
            depth = len(head.group(1)) // 2
            path = path[:depth] + [head.group(2).rstrip("/")]
            current = "/".join(path)
            assert current not in found, f"{current} has two lines in the map"
            found[current] = set()
        found[current] |= set(_MODULE.findall(line))
    return found


def _tree() -> dict[str, set[str]]:
    root = DOC.parent.parent
    found: dict[str, set[str]] = {}
    for init in sorted((root / "gateway").rglob("__init__.py")):
        package = init.parent
        if package.name == "versions":
            continue  # the migrations' revisions: "versions/ (one module a revision)" on their package's line
        found[str(package.relative_to(root))] = {p.name for p in package.iterdir() if p.is_file()
                                                 and p.suffix in (".py", ".pyi", ".c") and p.name != "__init__.py"}
    return found


def test_the_package_map_names_every_package_and_module_of_the_tree_and_nothing_else() -> None:
    assert _package_map() == _tree()


def test_the_package_map_check_sees_a_missing_module_and_a_stale_one() -> None:
    tree, drawn = _tree(), _package_map()
    assert "gateway/edge" in drawn and "method.py" in drawn["gateway/edge"] and "gateway/ops/ledger/migrations" in drawn
    stale = {**drawn, "gateway/proxy": drawn["gateway/proxy"] | {"body_override.py"}}
    missing = {**drawn, "gateway/edge": drawn["gateway/edge"] - {"method.py"}}
    assert stale != tree and missing != tree
