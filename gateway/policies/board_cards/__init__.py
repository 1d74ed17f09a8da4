"""board_cards: the policy (``policy``), its byte-level JSON editor (``json_splice``) and the C scanner behind it
(``_jsonscan.c``)."""

from .policy import BOARD_CARDS, NAME, SPEC, Families, Options, build

__all__ = ("BOARD_CARDS", "Families", "NAME", "Options", "SPEC", "build")
