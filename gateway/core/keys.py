"""A configuration key that no section knows: its problem names the nearest known key when one is close (a
misspelling, ``crated`` for ``created``), whichever step of loading finds it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ("UNKNOWN_KEY", "did_you_mean")

# pydantic's words for a key a model does not have: every unknown key is reported the same way, whoever finds it.
UNKNOWN_KEY = "Extra inputs are not permitted"
# Longer keys are no misspelling of a known one (and are not compared: difflib's cost grows with their length).
_LONGEST = 64
# How alike a key and a known one must be (difflib's ratio) to be offered: "crated" and "created" are 0.92, "colour" and
# "rollout" 0.62 (no misspelling of it).
_CUTOFF = 0.75


def did_you_mean(key: object, known: Iterable[str]) -> str:
    """`` (did you mean 'created'?)`` for the known key nearest to ``key``, or "" when none is close."""
    if not isinstance(key, str) or not 0 < len(key) <= _LONGEST:
        return ""
    close = difflib.get_close_matches(key, sorted(set(known)), n=1, cutoff=_CUTOFF)
    return f" (did you mean {close[0]!r}?)" if close else ""
