"""The config's secrets: ``${NAME}`` references expanded from the environment (``expand_references``), and every
value taken that way, and the credentials of the config's URLs, shown redacted wherever the config is shown
(``Secrets``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.redaction import MASK, url_credentials, without_query_values, without_userinfo
from .problems import loc

__all__ = ("Secrets", "expand_references")


_REFERENCE_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# A secret value shorter than this is not searched for in text: it would be found inside unrelated words (a password
# "e" in every "gateway"), and what gets masked would confirm a guessed value. It is masked where it stands instead:
# a config string that holds it (shown as written), a URL's userinfo.
_MIN_SEARCHED = 8


def _whole(value: str) -> str:
    """A pattern of ``value`` where it stands whole: not run on from a word (a letter, digit or ``_``) at an edge
    that is itself part of a word."""
    head = r"(?<!\w)" if re.match(r"\w", value[0]) else ""
    tail = r"(?!\w)" if re.match(r"\w", value[-1]) else ""
    return head + re.escape(value) + tail


@dataclass(frozen=True, slots=True)
class Secrets:
    """Values the config took from the environment (``${NAME}``), shown as their reference wherever the config is
    shown: ``check-config``, the admin ``/config``, problems and log lines. Credentials in a URL are masked too: the
    userinfo of any URL (found by the URL parser, ``core.redaction``), and every spelling of the credentials of the
    config's own URLs wherever they appear; and the query values of any URL. In free text a value is searched for
    only when it is 8 characters or longer, and only where it stands whole."""

    shown: Mapping[str, str] = dataclasses.field(default_factory=dict)  # value -> what is shown instead
    # A config string that held a reference, as expanded -> as written: shown as written, whatever its values' length.
    written: Mapping[str, str] = dataclasses.field(default_factory=dict)
    _searched: re.Pattern[str] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Longest first: a secret that contains another is replaced whole.
        values = sorted((value for value in self.shown if len(value) >= _MIN_SEARCHED), key=len, reverse=True)
        object.__setattr__(self, "_searched", re.compile("|".join(map(_whole, values))) if values else None)

    def redact(self, text: str) -> str:
        if self._searched is not None:
            text = self._searched.sub(lambda found: self.shown[found.group(0)], text)
        return without_userinfo(without_query_values(text))

    def reference(self, value: str) -> str | None:
        """The ``${NAME}`` the config took ``value`` from, or None (written in the file)."""
        shown = self.shown.get(value)
        return shown if shown is not None and shown.startswith("${") else None

    def with_values(self, values: Collection[str], shown: str = MASK) -> Secrets:
        """These secrets and more values (credentials of a URL, a token written in the file), shown as ``shown``."""
        added = {value: shown for value in values if value and value not in self.shown}
        return dataclasses.replace(self, shown={**self.shown, **added}) if added else self

    def with_url_credentials(self, urls: Collection[str]) -> Secrets:
        return self.with_values({c for url in urls for c in url_credentials(url)})

    def redact_data(self, data: Any) -> Any:
        """A JSON-ready structure with every string redacted (one that held a reference, as written)."""
        if isinstance(data, str):
            return self.redact(self.written.get(data, data))
        if isinstance(data, dict):
            return {key: self.redact_data(value) for key, value in data.items()}
        if isinstance(data, list):
            return [self.redact_data(value) for value in data]
        return data


def expand_references(data: Any, environ: Mapping[str, str],
                      unneeded: Callable[[Sequence[int | str]], bool] | None = None) -> tuple[Any, Secrets, list[str]]:
    """``${NAME}`` in any string of the config becomes the environment variable's value (``$$`` is a literal ``$``),
    so that a credential need not sit in the file (or a ConfigMap). Returns the data, the secrets to redact, and a
    problem for each variable that is not set. ``unneeded(path)``: whether the key at ``path`` is one the command
    does not use; an unset variable there stays as its reference, not a problem."""
    shown: dict[str, str] = {}
    written: dict[str, str] = {}
    problems: list[str] = []

    def expand(value: Any, where: list[int | str]) -> Any:
        if isinstance(value, dict):
            return {key: expand(item, [*where, str(key)]) for key, item in value.items()}
        if isinstance(value, list):
            return [expand(item, [*where, i]) for i, item in enumerate(value)]
        if not isinstance(value, str) or "$" not in value:
            return value
        took: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "$"
            if name not in environ:
                if unneeded is not None and unneeded(where):
                    return match.group(0)
                problems.append(f"{loc(where)}: environment variable {name} is not set")
                return ""
            secret = environ[name]
            if secret:
                shown[secret] = match.group(0)
                took.append(name)
            return secret

        expanded = _REFERENCE_RE.sub(substitute, value)
        if took:  # shown with its references, its "$$" as the "$" they stand for
            written[expanded] = _REFERENCE_RE.sub(lambda match: match.group(0) if match.group(1) else "$", value)
        return expanded

    try:
        return expand(data, []), Secrets(shown, written), problems
    finally:
        del expand  # it calls itself: function and cell would be a cycle that only a full collection frees
