"""Tenants (companies) and the resolution of a request's Host to one of them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from cachetools import LRUCache
from yarl import URL

__all__ = ("Tenant", "TenantResolver", "canonical_host")


@dataclass(frozen=True, slots=True)
class Tenant:
    """A company, with the file settings resolved from the spec's defaults and the config."""

    name: str
    hosts: tuple[str, ...]
    upstream: URL
    created: dt.date | None
    restricted_file_access: bool
    forbid_legacy_uploads: bool
    preserve_host: bool
    # The migration bridges this company's clients get (an exemption may say otherwise for one client).
    card_backfill: bool = False
    upload_upgrade: bool = False
    # Derived from ``upstream`` once: the proxy core uses them on every request.
    upstream_prefix: str = field(init=False, repr=False, compare=False)  # str(upstream): a path is appended to it
    upstream_host_header: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream_prefix", str(self.upstream))
        # Host and port only: credentials in the URL never go into a Host header.
        object.__setattr__(self, "upstream_host_header", self.upstream.host_port_subcomponent)


def canonical_host(host: str) -> str:
    """Lower-case host without port or trailing dot: ``Acme.Example.COM.:443`` -> ``acme.example.com``."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end != -1 else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


class TenantResolver:
    """Exact host names first, then ``*.suffix`` wildcards (longest suffix wins), then the default tenant."""

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
