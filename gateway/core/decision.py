"""A request's phase of a dated behaviour, as the rollout decided it once for the whole request (every policy of
it reads the same): which phase applies, what decided it, what a shadow window would apply instead, whether the
behaviour's bridge applies, and which request headers the decision read (a response that depends on it says so in
``Vary``). The rollout engine (``gateway.rollout``) makes them; policies, the access log and the ledger read them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

__all__ = ("Decider", "Decision", "Kind")


class Kind(enum.StrEnum):
    """What put a phase in force for a request."""

    DEFAULT = "default"  # no date reached yet
    SETTING = "setting"  # the company's own setting
    DATE = "date"  # a date of the rollout section
    OVERRIDE = "override"  # a date of the company's own
    BROWNOUT = "brownout"  # a later phase for a window
    RAMP = "ramp"  # the client is in the share that gets the phase before its date
    FREEZE = "freeze"  # the client was first seen after the freeze: the last phase at once
    PREVIEW = "preview"  # the client asked for the later phase itself
    EXEMPTION = "exemption"  # the client is held back until a date

    @property
    def per_client(self) -> bool:
        """Whether this kind decides for one client rather than for the whole company."""
        return self in _PER_CLIENT


_PER_CLIENT = frozenset({Kind.RAMP, Kind.FREEZE, Kind.PREVIEW, Kind.EXEMPTION})
# Kinds a decision's label names (``capped(exemption)``): the ones that are not the company's calendar.
_LABELLED = frozenset({Kind.BROWNOUT, *_PER_CLIENT})


@dataclass(frozen=True, slots=True)
class Decision:
    behaviour: str
    index: int  # the phase applied, in the behaviour's order
    phase: str
    kind: Kind
    shadow: int | None = None  # a later phase a shadow window decides (recorded, not applied)
    bridge: bool = False  # the behaviour's migration bridge applies to this request
    vary: tuple[str, ...] = ()  # the request headers this decision read
    unplaced: bool = False  # a freeze could not tell whether the client is new (the ledger unavailable)

    @property
    def label(self) -> str:
        """The phase as the access log and the metrics name it: ``capped``, ``capped(exemption)``."""
        return f"{self.phase}({self.kind})" if self.kind in _LABELLED else self.phase


class Decider(Protocol):
    """One request's rollout (``gateway.rollout.request.RequestRollout``): each behaviour decided once, at one
    instant (``now``, POSIX seconds)."""

    @property
    def now(self) -> float: ...

    def decide(self, behaviour: str) -> Decision: ...

    def previews(self) -> list[str]:
        """``behaviour=phase`` for each behaviour decided that the client asked to preview."""
