"""The registry of route policies: config name -> (options model, builder).

A policy module exports ``NAME``, a frozen pydantic ``Options`` model and ``build(options, ctx) -> Middleware``.
The builder does all parsing once; the middleware it returns only acts. Chains fold first-listed-outermost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..core.exchange import Middleware
from . import board_cards, legacy_upload_guard, request_id

if TYPE_CHECKING:
    from ..ops.observability import Metrics
    from ..rollout import Clock, RolloutPlan

__all__ = ("BuildContext", "POLICIES", "PolicySpec")


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a builder may use: the route it is built for and the injected clock and metrics."""

    route_name: str
    clock: Clock
    metrics: Metrics
    config: Any  # the whole GatewayConfig, for policies that need app-wide settings (rollout dates, tenants)
    rollout: RolloutPlan  # built once per config from ``config``: every policy asks this one for phases


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    options: type[BaseModel]
    build: Callable[[Any, BuildContext], Middleware]


POLICIES: Mapping[str, PolicySpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            PolicySpec(request_id.NAME, request_id.Options, request_id.build),
            PolicySpec(legacy_upload_guard.NAME, legacy_upload_guard.Options, legacy_upload_guard.build),
            PolicySpec(board_cards.NAME, board_cards.Options, board_cards.build),
        )
    }
)
