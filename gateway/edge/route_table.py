"""The route step of the edge: the route table (first match wins, the catch-all answers the rest), built whole from
a config: each route with its chain's policy names and whether a security policy guards it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..config import LoadedConfig
from ..core.route import Route
from ..policies import PolicySpec

__all__ = ("PathMatches", "RouteTable")


class RouteTable:
    """Routes in declaration order; the first match wins, and the catch-all answers the rest."""

    def __init__(self, routes: Sequence[Route], catch_all: Route) -> None:
        self.routes = tuple(routes)
        self.catch_all = catch_all
        # The guarded routes, each with the methods an override would need to reach it (any method: PUT stands for
        # them), worked out once.
        self.guarded = tuple((r, tuple(r.methods) if r.methods is not None else ("PUT",)) for r in self.routes
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

    def lookup(self, path: str) -> PathMatches:
        """``path``'s matches against the table: each route's paths are tried at most once per request, however many
        methods it is looked up by (its own, then an override's)."""
        return PathMatches(self, path)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        return self.lookup(path).route(method)


class PathMatches:
    """One request path against a route table: the route for a method, first match wins, each route's patterns
    tried once (the result kept)."""

    __slots__ = ("_table", "path", "_params")

    def __init__(self, table: RouteTable, path: str) -> None:
        self._table = table
        self.path = path
        self._params: dict[Route, dict[str, str] | None] = {}

    def _of(self, route: Route) -> dict[str, str] | None:
        try:
            return self._params[route]
        except KeyError:
            params = self._params[route] = route.path_params(self.path)
            return params

    def route(self, method: str) -> tuple[Route, dict[str, str]]:
        for route in self._table.routes:
            if route.methods is not None and method not in route.methods:
                continue
            params = self._of(route)
            if params is not None:
                return route, params
        return self._table.catch_all, {}

    def override_reaches_guard(self, route: Route) -> bool:
        """Whether a method override could take this request, classified on ``route``, to another route whose chain
        is guarded."""
        for other, methods in self._table.guarded:
            # Its own paths first (a regex or two): most requests are for paths no guarded route has.
            if other is route or self._of(other) is None:
                continue
            if any(self.route(method)[0] is other for method in methods):
                return True
        return False
