"""The tenant step of the edge: which company a request's Host names."""

from __future__ import annotations

from collections.abc import Sequence

from cachetools import LRUCache

from ..config import LoadedConfig
from ..core.tenants import Tenant, canonical_host

__all__ = ("TenantResolver",)


class TenantResolver:
    """Exact host names first, then ``*.suffix`` wildcards (longest suffix wins), then the default tenant."""

    @classmethod
    def of(cls, config: LoadedConfig, tenants: Sequence[Tenant] | None = None) -> TenantResolver:
        """Host -> tenant for this config (``default_tenant`` for hosts no tenant names); ``tenants``: its
        ``tenants()``, when the caller has them already."""
        tenants = config.tenants() if tenants is None else tenants
        default = next((t for t in tenants if t.name == config.model.default_tenant), None)
        return cls(tenants, default)

    def __init__(self, tenants: Sequence[Tenant], default: Tenant | None) -> None:
        self.tenants = tuple(tenants)
        self.default = default
        self._exact: dict[str, Tenant] = {}
        wildcards: list[tuple[str, Tenant]] = []
        for tenant in tenants:
            for pattern in tenant.hosts:
                if pattern.startswith("*."):
                    wildcards.append((pattern[1:], tenant))
                else:
                    self._exact[pattern] = tenant
        self._wildcards = sorted(wildcards, key=lambda item: -len(item[0]))
        # Host header as sent -> tenant, so the few spellings clients send are canonicalised and matched once.
        # Bounded (least recently used out), so random Host headers cannot grow memory; a hit costs about 0.1 us.
        self._seen: LRUCache[str, Tenant | None] = LRUCache(maxsize=_SEEN_MAX)

    def resolve(self, host: str | None) -> Tenant | None:
        if not host:
            return self.default
        # A name as configured (the spelling nearly every client sends) is found at once, and takes no place among
        # the remembered spellings: with more companies than those hold, each request would otherwise evict one.
        tenant = self._exact.get(host)
        if tenant is not None:
            return tenant
        try:
            return self._seen[host]
        except KeyError:
            pass
        tenant = self._seen[host] = self._match(canonical_host(host))
        return tenant

    def _match(self, name: str) -> Tenant | None:
        tenant = self._exact.get(name)
        if tenant is not None:
            return tenant
        return next((t for suffix, t in self._wildcards if name.endswith(suffix)), self.default)


_SEEN_MAX = 4096
