"""Host -> tenant: exact names, then the longest wildcard suffix, then the default; spellings remembered, bounded."""

from __future__ import annotations

from yarl import URL

from gateway.core.tenants import Tenant
from gateway.edge import tenancy as tenants
from gateway.edge.tenancy import TenantResolver


def _tenant(name: str, *hosts: str) -> Tenant:
    return Tenant(name, hosts, URL("http://up.test:8080/base"), None, False, False, False)


def _resolver() -> TenantResolver:
    acme, wild, deep, default = (_tenant("acme", "acme.test"), _tenant("wild", "*.example.test"),
                                 _tenant("deep", "*.eu.example.test"), _tenant("default", "default.test"))  # fmt: skip
    return TenantResolver([acme, wild, deep, default], default)


def test_resolution_order_and_spellings() -> None:
    resolver = _resolver()
    for _ in range(2):  # the second pass answers from the remembered spellings
        assert resolver.resolve("acme.test").name == "acme"  # type: ignore[union-attr]
        assert resolver.resolve("ACME.test.:443").name == "acme"  # type: ignore[union-attr]
        assert resolver.resolve("a.example.test").name == "wild"  # type: ignore[union-attr]
        assert resolver.resolve("a.eu.example.test").name == "deep"  # type: ignore[union-attr]
        assert resolver.resolve("unknown.test").name == "default"  # type: ignore[union-attr]
        assert resolver.resolve(None).name == "default"  # type: ignore[union-attr]


def test_no_default_means_no_tenant_for_an_unknown_host() -> None:
    resolver = TenantResolver([_tenant("acme", "acme.test")], None)
    assert resolver.resolve("other.test") is None
    assert resolver.resolve("other.test") is None


def test_remembered_spellings_are_bounded() -> None:
    resolver = _resolver()
    for i in range(tenants._SEEN_MAX + 10):
        assert resolver.resolve(f"h{i}.example.test").name == "wild"  # type: ignore[union-attr]
    assert len(resolver._seen) <= tenants._SEEN_MAX


def test_configured_names_take_no_place_among_the_remembered_spellings() -> None:
    """Issue 38: a request of each of 10,000 companies in turn, each Host as configured, evicted one spelling each
    from a cache of 4,096 (and canonicalised its name again); a configured name is now found in the host map."""
    companies = [_tenant(f"c{i}", f"c{i}.example.test") for i in range(10_000)]
    resolver = TenantResolver(companies, None)
    for _ in range(2):
        for i, company in enumerate(companies):
            assert resolver.resolve(f"c{i}.example.test") is company
    assert len(resolver._seen) == 0
    assert resolver.resolve("C1.example.test:443") is companies[1] and len(resolver._seen) == 1


def test_upstream_prefix_and_host_header_are_derived_once() -> None:
    tenant = _tenant("acme", "acme.test")
    assert tenant.upstream_prefix == "http://up.test:8080/base"
    assert tenant.upstream_host_header == "up.test:8080"
    assert tenant == _tenant("acme", "acme.test")
