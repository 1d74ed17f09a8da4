"""Injected faults: which requests answer an error (or answer late) instead
of being served."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Fault", "FaultTable"]


@dataclass(slots=True)
class Fault:
    """Answer ``status`` (or, without one, the real answer) after ``delay``
    seconds to the next ``remaining`` requests that match.

    A request matches when its method and decoded path are equal to the
    fault's (a path segment ``*`` matches any one segment) and each of the
    fault's query parameters has that value (the first value when repeated);
    other parameters are ignored.
    """

    id: int
    method: str
    path: str
    query: dict[str, str]
    status: int | None
    delay: float
    times: int
    remaining: int

    def matches(self, method: str, path: str, query: Mapping[str, str]) -> bool:
        return (
            method == self.method
            and _path_matches(self.path, path)
            and all(query.get(name) == value for name, value in self.query.items())
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "method": self.method,
            "path": self.path,
            "query": dict(self.query),
            "status": self.status,
            "delay": self.delay,
            "times": self.times,
            "remaining": self.remaining,
        }


def _path_matches(pattern: str, path: str) -> bool:
    if pattern == path:
        return True
    if "*" not in pattern:
        return False
    wanted, got = pattern.split("/"), path.split("/")
    return len(wanted) == len(got) and all(w in ("*", g) for w, g in zip(wanted, got, strict=True))


class FaultTable:
    """Registered faults, oldest first: the oldest matching one applies."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._next_id = 1

    def add(self, *, method: str, path: str, query: dict[str, str], status: int | None, delay: float,
            times: int) -> Fault:
        fault = Fault(id=self._next_id, method=method, path=path, query=query, status=status, delay=delay,
                      times=times, remaining=times)
        self._next_id += 1
        self._faults.append(fault)
        return fault

    def take(self, method: str, path: str, query: Mapping[str, str]) -> Fault | None:
        """The fault that applies to this request, used up by one; ``None``
        when none matches. Counting happens on arrival, before any delay, so
        concurrent requests never share one use."""
        for fault in self._faults:
            if fault.matches(method, path, query):
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def entries(self) -> list[Fault]:
        return list(self._faults)

    def clear(self) -> None:
        self._faults.clear()
