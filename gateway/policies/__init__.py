"""The registry of route policies: config name -> ``PolicySpec``, and the config step that checks against it.

An explicit mapping, no import-time discovery: adding a policy is its module (or folder), one line here, its docs
and its tests (docs/architecture.md, "Adding a policy"). Chains fold first-listed-outermost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config import ChainEntry, ConfigError, GatewayConfig, LoadedConfig, loc, pydantic_problems
from ..rollout.behaviour import Behaviour
from ..rollout.checks import rollout_problems
from . import board_cards, legacy_upload_guard, request_id
from .base import BuildContext, Families, PolicySpec

__all__ = ("BEHAVIOURS", "POLICIES", "BuildContext", "Families", "PolicySpec", "check_config")

POLICIES: Mapping[str, PolicySpec[Any]] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            request_id.SPEC,
            legacy_upload_guard.SPEC,
            board_cards.SPEC,
        )
    }
)
# Every dated behaviour, from the policies that own them.
BEHAVIOURS: Mapping[str, Behaviour] = MappingProxyType(
    {behaviour.name: behaviour for spec in POLICIES.values() for behaviour in spec.behaviours}
)


def check_config(model: GatewayConfig, source: str = "config") -> LoadedConfig:
    """The registry's step of loading a config: every chain entry's policy and options, and the rollout sections
    against the declared behaviours. Raises ConfigError with every problem, each with its path."""
    problems: list[str] = []
    chains: dict[str, tuple[tuple[str, BaseModel], ...]] = {}
    global_names = [e.name for e in model.global_chain]

    def options_of(
        entries: Sequence[ChainEntry], where: list[int | str], outer: Sequence[str] = ()
    ) -> tuple[tuple[str, BaseModel], ...]:
        parsed = []
        seen = set(outer)
        for j, entry in enumerate(entries):
            spec = POLICIES.get(entry.name)
            if spec is None:
                problems.append(f"{loc([*where, j])}: unknown policy {entry.name!r}"
                                f" (known: {', '.join(sorted(POLICIES))})")
                continue
            if entry.name in seen:
                problems.append(f"{loc([*where, j])}: policy {entry.name!r} is listed twice in this chain"
                                + (" (it is in global_chain)" if entry.name in outer else ""))
            seen.add(entry.name)
            try:
                parsed.append((entry.name, spec.options.model_validate(entry.options)))
            except ValidationError as err:
                problems.extend(pydantic_problems(err, [*where, j, entry.name], spec.options))
        return tuple(parsed)

    global_chain = options_of(model.global_chain, ["global_chain"])
    for i, route in enumerate(model.routes):
        chains[route.name] = global_chain + options_of(route.chain, ["routes", i, "chain"], global_names)
    chains["catch_all"] = global_chain + options_of(model.catch_all.chain, ["catch_all", "chain"], global_names)
    tenants = [(t.resolve(), t.rollout) for t in model.tenants]
    problems.extend(rollout_problems(model.rollout, tenants, BEHAVIOURS))
    if problems:
        raise ConfigError(problems, source)
    return LoadedConfig(model, chains, source, BEHAVIOURS)
