"""Per-company metric series that cost nothing for an idle company: a series appears with a company's first count,
and at most ``Companies.limit`` companies get series of their own in a process; the counts of the others go to
``tenant="_other"`` (a name no company can have: names begin with a letter), so that every family's totals stay
whole. One ``Companies`` is shared by every per-company family of a process: the bound is on companies, whatever
families they appear in (docs/operations.md, "What a company costs")."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ("OTHER", "Companies", "CompanyCounter")

OTHER = "_other"


class Companies:
    """The companies that have series of their own, in the order they were first counted, up to ``limit``."""

    __slots__ = ("limit", "named")

    def __init__(self, limit: int = 1000) -> None:
        self.limit = limit
        self.named: dict[str, None] = {}  # a dict: ordered, and as quick as a set to test

    def label(self, tenant: str) -> str:
        """``tenant`` if it has, or may now take, series of its own; else ``OTHER``."""
        if tenant in self.named:
            return tenant
        if len(self.named) < self.limit:
            self.named[tenant] = None
            return tenant
        return OTHER


class CompanyCounter:
    """A counter family whose first label is the company: ``inc((tenant, *labels))``. A child is made with the
    first count of its labels and kept; a company over the bound is counted under ``OTHER``."""

    __slots__ = ("family", "companies", "children")

    def __init__(self, family: Counter, companies: Companies) -> None:
        self.family = family
        self.companies = companies
        self.children: dict[tuple[str, ...], Counter] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        child = self.children.get(key)
        if child is None:
            child = self._child(key)
        child.inc(amount)

    def _child(self, key: tuple[str, ...]) -> Counter:
        if self.companies.label(key[0]) == OTHER:
            key = (OTHER, *key[1:])  # kept once under OTHER, not once per company over the bound
            child = self.children.get(key)
            if child is not None:
                return child
        child = self.children[key] = self.family.labels(*key)
        return child
