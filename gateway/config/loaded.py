"""A config checked whole (``LoadedConfig``): the schema's model, each chain's policies with their options parsed,
the dated behaviours they declare, the secrets to redact; its tenants resolved and its rollout plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..core.tenants import Tenant
from ..rollout.behaviour import Behaviour
from ..rollout.plan import RolloutPlan
from .schema import GatewayConfig
from .secrets import Secrets

__all__ = ("LoadedConfig",)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class LoadedConfig:
    """A config checked whole: the schema, and every chain entry's options parsed by its policy's model (built by
    the policy registry, ``gateway.policies.check_config``)."""

    model: GatewayConfig
    chains: Mapping[str, tuple[tuple[str, BaseModel], ...]]  # route name (and "catch_all") -> policies and options
    source: str
    behaviours: Mapping[str, Behaviour]  # the dated behaviours the policies declare, by name
    secrets: Secrets = dataclasses.field(default_factory=Secrets)

    def tenants(self) -> list[Tenant]:
        return [t.resolve() for t in self.model.tenants]

    def shown(self) -> dict[str, Any]:
        """The config as loaded, for people: secrets shown as their references, credentials in URLs masked. Dumped
        a company at a time: pydantic's dump of 10,000 companies in one call holds the GIL (so the event loop, from
        whichever thread) for tens of ms."""
        model = self.model
        rest = model.model_dump(mode="json", exclude={"tenants"})
        tenants = [tenant.model_dump(mode="json") for tenant in model.tenants]
        dumped = {name: tenants if name == "tenants" else rest[name] for name in type(model).model_fields}
        data: dict[str, Any] = self.secrets.redact_data(dumped)
        return data

    def rollout_plan(self, tenants: list[Tenant] | None = None) -> RolloutPlan:
        """Every tenant's schedule of every dated behaviour, from this config; ``tenants``: ``tenants()``, when the
        caller has them already (at 10,000 companies, resolving them again is 10,000 objects more)."""
        resolved = self.tenants() if tenants is None else tenants
        pairs = [(tenant, t.rollout) for tenant, t in zip(resolved, self.model.tenants, strict=True)]
        return RolloutPlan.build(self.model.rollout, pairs, self.behaviours)
