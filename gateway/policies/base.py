"""What a policy module provides (``PolicySpec``: its name, options model, builder, and dated behaviours) and what its
builder is given (``BuildContext``), in a module of its own so that the policies can import it while the registry
imports them. docs/architecture.md ("Adding a policy") walks through one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from ..core.exchange import Policy
from ..core.ratelimit import RateLimits
from ..core.series import Companies
from ..core.spool import SpoolArea
from ..rollout.behaviour import Behaviour
from ..rollout.clock import Clock
from ..rollout.plan import RolloutPlan

__all__ = ("BuildContext", "Families", "PolicySpec")

F = TypeVar("F")
O = TypeVar("O", bound=BaseModel)


class Families(Protocol):
    """Gives a policy its metric families: ``make(registry)`` the first time, the same object afterwards."""

    def __call__(self, make: Callable[[CollectorRegistry], F]) -> F: ...


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a builder may use: the route it is built for, and the injected clock, rollout plan and metrics."""

    route: str  # the route's name ("catch_all" for the catch-all)
    params: frozenset[str]  # the path parameters of the route's templates
    clock: Clock
    timezone: dt.tzinfo  # rollout.timezone: the zone in which configured dates begin
    rollout: RolloutPlan  # built once per config: every policy asks this one for phases
    families: Families
    # The companies with series of their own in the per-company families (one bound for the process: core.series).
    companies: Companies = field(default_factory=Companies)
    # The process's spool area (one budget for every policy's spool files; swept of dead processes' files at start).
    spool: SpoolArea = field(default_factory=SpoolArea)
    # The service's limits on each token as the process's bridges learnt them (one for the process: both bridges of a
    # client share what either learnt).
    limits: RateLimits = field(default_factory=RateLimits)


@dataclass(frozen=True, slots=True)
class PolicySpec(Generic[O]):
    """A policy as the registry knows it: its config name, options model, builder and dated behaviours."""

    name: str
    options: type[O]
    build: Callable[[O, BuildContext], Policy]
    behaviours: tuple[Behaviour, ...] = ()

    def make(self, options: BaseModel, ctx: BuildContext) -> Policy:
        """Build from options parsed by this spec's model."""
        if not isinstance(options, self.options):
            raise TypeError(f"{self.name}: options of type {type(options).__name__}, not {self.options.__name__}")
        return self.build(options, ctx)
