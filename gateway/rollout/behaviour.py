"""A dated behaviour, as the policy that owns it declares it: its phases, the date flags that move it from one
phase to the next, and what a company's own settings say about it.

The rollout engine knows no behaviour by name. A policy module declares its behaviours (``Behaviour``) and the
registry hands them to the engine and to the config checks; adding a dated policy changes neither.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.tenants import Tenant
    from .config import Brownout

__all__ = ("Base", "Behaviour", "DateFlag", "TenantCheck")


@dataclass(frozen=True, slots=True)
class DateFlag:
    """A date in the ``rollout`` section (and each tenant's ``rollout``): its key and its default (None: unset)."""

    name: str
    default: dt.date | None = None
    # For a flag that moves no phase but starts a signal: what it starts, and what applies while it is unset.
    label: str = ""
    unset: str = ""


@dataclass(frozen=True, slots=True)
class Base:
    """A tenant's phase before any date, from its own settings; ``dated`` False: the dates do not apply to it."""

    index: int = 0
    kind: str = "default"  # default | setting
    why: str = ""
    dated: bool = True


# (tenant, its own date overrides of this behaviour's flags, its own brownouts (all), its config path) -> problems
TenantCheck = Callable[["Tenant", Mapping[str, "dt.date | None"], Sequence["Brownout"], str], list[str]]


@dataclass(frozen=True, slots=True)
class Behaviour:
    """Phases in order; ``flags[i]`` moves the behaviour from ``phases[i]`` to ``phases[i + 1]``.

    ``signals`` are date flags that move no phase (the start of a Deprecation header, say); each must fall on or
    before the first flag. ``security``: a client can be exempted by its token fingerprint only, never by a header
    (any client can send a header). ``base`` reads a tenant's settings; ``check_tenant`` adds config problems that
    need the tenant and the behaviour together.
    """

    name: str
    phases: tuple[str, ...]
    flags: tuple[DateFlag, ...]
    signals: tuple[DateFlag, ...] = ()
    security: bool = False
    base: Callable[[Tenant], Base] | None = None
    check_tenant: TenantCheck | None = None
    # The behaviour's migration bridge, if it has one: its name, whether a tenant has it on (an exemption's
    # ``bridge`` decides for one client), and the phases in which it acts for a client (elsewhere it is idle).
    bridge: str | None = None
    bridge_of: Callable[[Tenant], bool] | None = None
    bridge_phases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.flags) != len(self.phases) - 1:
            raise ValueError(f"behaviour {self.name}: one date flag between each two phases")
        if not set(self.bridge_phases) <= set(self.phases) or bool(self.bridge_phases) != (self.bridge is not None):
            raise ValueError(f"behaviour {self.name}: a bridge acts in some of its phases, and only a bridge does")

    def index(self, phase: str) -> int:
        return self.phases.index(phase)

    def base_of(self, tenant: Tenant) -> Base:
        return self.base(tenant) if self.base is not None else Base()

    def all_flags(self) -> tuple[DateFlag, ...]:
        return (*self.signals, *self.flags)
