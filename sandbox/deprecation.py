"""The withdrawal of cards from the board route, on the service's schedule.

Before ``cards_cap_from`` the board routes return every card. From it, at
most the first 100 cards in board order, plus ``cards_deprecation_message``
when cards were left out (a board of 100 cards or fewer is whole, without it).
From ``cards_removal_from``, no ``cards`` key at all, plus the message. The
paginated card list is the replacement and never changes.
"""

from __future__ import annotations

import enum
from datetime import datetime

from sandbox.params import MAX_LIMIT
from sandbox.settings import SandboxSettings

__all__ = ["CARDS_CAP", "CardsPhase", "card_list_request", "cards_phase", "deprecation_message"]

CARDS_CAP = 100


class CardsPhase(enum.Enum):
    FULL = "full"
    CAPPED = "capped"
    REMOVED = "removed"


def cards_phase(settings: SandboxSettings, now: datetime | None = None) -> CardsPhase:
    """Where the schedule stands at ``now`` (default: the sandbox clock).
    Removal wins over the cap when both dates have passed."""
    moment = settings.current_time() if now is None else now
    if settings.cards_removal_from is not None and moment >= settings.cards_removal_from:
        return CardsPhase.REMOVED
    if settings.cards_cap_from is not None and moment >= settings.cards_cap_from:
        return CardsPhase.CAPPED
    return CardsPhase.FULL


def card_list_request(board_id: int) -> str:
    """The first page of the replacement route, as the message spells it."""
    return f"GET /api/latest/cards?board_id={board_id}&limit={MAX_LIMIT}&offset=0"


def deprecation_message(phase: CardsPhase, board_id: int) -> str | None:
    if phase is CardsPhase.CAPPED:
        return (
            f"Cards on the board route are limited to {CARDS_CAP}; "
            f"read them all with {card_list_request(board_id)}"
        )
    if phase is CardsPhase.REMOVED:
        return (
            "Cards are no longer returned by the board route; "
            f"read them with {card_list_request(board_id)}"
        )
    return None
