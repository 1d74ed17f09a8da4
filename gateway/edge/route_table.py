"""The route step of the edge: the route table (first match wins, the catch-all answers the rest), built whole from
a config: each route with its chain's policy names and whether a security policy guards it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..config import LoadedConfig
from ..core.route import Route
from ..policies import PolicySpec

__all__ = ("RouteTable",)


class RouteTable:
    """Routes in declaration order; the first match wins, and the catch-all answers the rest."""

    def __init__(self, routes: Sequence[Route], catch_all: Route) -> None:
        self.routes = tuple(routes)
        self.catch_all = catch_all
        # The guarded routes, each with the methods an override would need to reach it (any method: PUT stands for
        # them), worked out once.
        self._guarded = tuple((r, tuple(r.methods) if r.methods is not None else ("PUT",)) for r in self.routes
                              if r.guarded)

    @classmethod
    def of(cls, config: LoadedConfig, policies: Mapping[str, PolicySpec[Any]]) -> RouteTable:
        """The config's routes and its catch-all, each built whole: its chain's policy names, and whether one of them
        enforces a security behaviour (``policies``: the registry)."""

        def route(name: str, methods: Iterable[str] | None, paths: Sequence[str], prefixes: Sequence[str]) -> Route:
            chain = [policy for policy, _ in config.chains[name]]
            guarded = any(behaviour.security for policy in chain for behaviour in policies[policy].behaviours)
            return Route.build(name, methods, paths, prefixes, policies=chain, guarded=guarded)

        routes = [route(r.name, r.methods, r.paths, r.prefixes) for r in config.model.routes]
        return cls(routes, route("catch_all", None, (), ()))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        for route in self.routes:
            params = route.match(method, path)
            if params is not None:
                return route, params
        return self.catch_all, {}

    def override_reaches_guard(self, route: Route, path: str) -> bool:
        """Whether a method override could take a request for ``path``, classified on ``route``, to another route
        whose chain is guarded."""
        for other, methods in self._guarded:
            # Its own paths first (a regex or two): most requests are for paths no guarded route has.
            if other is route or not other.matches_path(path):
                continue
            if any(self.match(method, path)[0] is other for method in methods):
                return True
        return False
