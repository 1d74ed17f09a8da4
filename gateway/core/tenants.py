"""A tenant (a company): its upstream and its file settings, and the canonical form of a Host."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from yarl import URL

__all__ = ("Tenant", "canonical_host")


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
