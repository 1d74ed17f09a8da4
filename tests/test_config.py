"""Config validation: defaults from the spec, and every problem reported at once with its path."""

from __future__ import annotations

import copy
import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent

MINIMAL: dict[str, Any] = {
    "tenants": [{"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:8081"}],
}


def _with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data.update(changes)
    return data


def _tenant(**fields: Any) -> dict[str, Any]:
    return _with(tenants=[{"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:8081", **fields}])


def test_default_config_file_is_valid_and_names_the_spec_routes() -> None:
    config = load_config(ROOT / "config" / "gateway.yaml")
    names = {r.name for r in config.model.routes}
    assert {"board", "card_list", "card", "legacy_card_file_upload", "legacy_comment_create",
            "legacy_comment_update", "card_file_upload", "comment_file_upload", "property_file_upload"} <= names
    assert config.chains["catch_all"][0][0] == "request_id"


@pytest.mark.parametrize(
    ("created", "restricted", "forbid", "expected"),
    [
        (None, None, None, (False, False)),
        ("2026-05-20", None, None, (False, False)),
        ("2026-05-21", None, None, (True, True)),
        ("2026-09-01", None, False, (True, False)),
        ("2026-09-01", False, None, (False, False)),
        ("2025-01-01", True, None, (True, False)),
        ("2025-01-01", True, True, (True, True)),
    ],
)
def test_file_settings_defaults_follow_the_spec(created: str | None, restricted: bool | None, forbid: bool | None,
                                                expected: tuple[bool, bool]) -> None:
    fields = {k: v for k, v in {"created": created, "restricted_file_access": restricted,
                                 "forbid_legacy_uploads": forbid}.items() if v is not None}
    (tenant,) = parse_config(_tenant(**fields)).tenants()
    assert (tenant.restricted_file_access, tenant.forbid_legacy_uploads) == expected
    if created:
        assert tenant.created == dt.date.fromisoformat(created)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({}, "tenants: Field required"),
        (_with(tenants=[]), "tenants: List should have at least 1 item"),
        (_with(unknown_key=1), "unknown_key: Extra inputs are not permitted"),
        (_with(server={"listen": "nonsense"}), "server.listen: expected 'host:port'"),
        (_with(server={"listen": "127.0.0.1:99999"}), "server.listen: invalid port"),
        (_with(server={"listen": "example.com:80"}), "server.listen: listen host must be an IP address"),
        (_with(upstream={"connect_timeout": 0}), "upstream.connect_timeout: Input should be greater than 0"),
        (_tenant(forbid_legacy_uploads=True, restricted_file_access=False), "tenants[0]: forbid_legacy_uploads requires"),
        (_tenant(forbid_legacy_uploads=True, created="2025-01-01"), "tenants[0]: forbid_legacy_uploads is on"),
        (_tenant(upstream="ftp://x"), "tenants[0].upstream: upstream must be an http:// or https:// URL"),
        (_tenant(hosts=["bad host"]), "tenants[0].hosts: invalid host name"),
        (_tenant(name="none"), 'tenants[0].name: "none" is reserved'),
        (_tenant(created="yesterday"), "tenants[0].created: expected a date (YYYY-MM-DD), got 'yesterday'"),
        (_with(tenants=[MINIMAL["tenants"][0], MINIMAL["tenants"][0]]), "tenant name 'acme' is used twice"),
        (_with(default_tenant="nobody"), "default_tenant 'nobody' is not a tenant name"),
        (_with(routes=[{"name": "r", "paths": ["cards"]}]), "routes[0].paths: 'cards' is not a path template"),
        (_with(routes=[{"name": "r", "paths": ["/a"], "methods": ["G T"]}]), "routes[0].methods: invalid methods"),
        (_with(routes=[{"name": "r", "paths": ["/a"], "chain": ["nope"]}]), "routes[0].chain[0]: unknown policy 'nope'"),
        (_with(routes=[{"name": "r", "paths": ["/a"], "chain": [{"request_id": {"max_length": 2}}]}]),
         "routes[0].chain[0].request_id.max_length: Input should be greater than or equal to 8"),
        (_with(routes=[{"name": "r", "paths": ["/a"], "chain": [{"request_id": {"bogus": 1}}]}]),
         "routes[0].chain[0].request_id.bogus: Extra inputs are not permitted"),
        (_with(global_chain=["request_id", "request_id"]), "global_chain[1]: policy 'request_id' is listed twice"),
        (_with(routes=[{"name": "r", "paths": ["/a"]}, {"name": "r", "paths": ["/b"]}]), "route name 'r' is used twice"),
        (_with(routes=[{"name": "r", "paths": ["/a"], "chain": ["request_id"]}]),
         "routes[0].chain[0]: policy 'request_id' is listed twice in this chain (it is in global_chain)"),
        (_with(rollout={"timezone": "Mars/Olympus"}), "rollout.timezone: unknown timezone 'Mars/Olympus'"),
        # Named clients (usage.clients), readiness and the integrators' own view.
        (_with(usage={"clients": [{"name": "app", "token_fingerprint": "3F9A1C0B2D4E"}]}),
         "usage.clients[0].token_fingerprint: a token fingerprint is 12 lowercase hex digits (the access log's "
         "client), got '3F9A1C0B2D4E'"),
        (_with(usage={"clients": [{"name": "app", "token_fingerprint": "3f9a1c0b2d4"}]}),
         "usage.clients[0].token_fingerprint: a token fingerprint is 12 lowercase hex digits"),
        (_with(usage={"clients": [{"name": "app", "owner": "team"}]}),
         "usage.clients[0]: a named client is matched by token_fingerprint, user_agent, or both"),
        (_with(usage={"clients": [{"name": "app", "user_agent": {"prefix": "a", "value": "a"}}]}),
         "usage.clients[0].user_agent: give exactly one of value or prefix"),
        (_with(usage={"clients": [{"name": "app", "token_fingerprint": "3f9a1c0b2d4e"},
                                  {"name": "app", "token_fingerprint": "9e8d7c6b5a41"}]}),
         "usage.clients[1].name: the name 'app' is used twice (first at usage.clients[0])"),
        (_with(usage={"clients": [{"name": "a", "token_fingerprint": "3f9a1c0b2d4e"},
                                  {"name": "b", "token_fingerprint": "3f9a1c0b2d4e",
                                   "user_agent": {"prefix": "sdk/"}}]}),
         "usage.clients[1]: one client can match both 'b' (token fingerprint 3f9a1c0b2d4e and User-Agent starting "
         "'sdk/') and 'a' at usage.clients[0] (token fingerprint 3f9a1c0b2d4e): make them exclusive"),
        (_with(usage={"clients": [{"name": "a", "user_agent": {"prefix": "LegacySync/"}},
                                  {"name": "b", "user_agent": {"value": "LegacySync/2.1"}}]}),
         "usage.clients[1]: one client can match both 'b' (User-Agent = 'LegacySync/2.1') and 'a' at "
         "usage.clients[0] (User-Agent starting 'LegacySync/')"),
        (_with(usage={"readiness": {"quiet_days": 30, "window_days": 30}}),
         "usage.readiness: window_days (30) must be more than quiet_days (30)"),
        (_with(usage={"self_service": {"prefix": "/_gateway"}}), "usage.self_service.prefix: String should match"),
        (_with(usage={"self_service": {"prefix": "/own/"}},
               routes=[{"name": "r", "paths": ["/own/things"], "prefixes": []}]),
         "routes[0].paths[0]: '/own/things' is under usage.self_service.prefix (/own/), which the gateway answers "
         "itself"),
        (_with(usage={"ledger": {"enabled": False}}, rollout={"freezes": [{"behaviour": "legacy_uploads",
                                                                           "from": "2026-12-01"}]}),
         "rollout.freezes[0]: a freeze needs the usage ledger (who was seen before its date), and "
         "usage.ledger.enabled is false"),
        (_with(usage={"ledger": {"enabled": False}},
               tenants=[{**MINIMAL["tenants"][0], "rollout": {"freezes": [{"from": "2026-12-01"}]}}]),
         "tenants[0].rollout.freezes[0]: a freeze needs the usage ledger"),
    ],
)
def test_config_errors_name_their_path(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(expected in problem for problem in err.value.problems), err.value.problems


def test_named_clients_that_overlap_are_errors_naming_their_lines(tmp_path: Path) -> None:
    """Each problem of usage.clients names the line of the entry it is about; entries of different kinds (a token,
    and a family of User-Agents) do not overlap: the token's entry wins for that token."""
    path = tmp_path / "clients.yaml"
    path.write_text(yaml.safe_dump(_with(usage={"clients": [
        {"name": "mobile", "owner": "mobile@example.com", "token_fingerprint": "3f9a1c0b2d4e"},
        {"name": "sync", "internal": True, "user_agent": {"prefix": "LegacySync/"}},
        {"name": "sync-old", "user_agent": {"prefix": "LegacySync/1."}},
        {"name": "mobile", "token_fingerprint": "9e8d7c6b5a41"},
    ]}), sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = path.read_text().splitlines()
    problems = err.value.problems
    assert len(problems) == 2, problems
    at = {int(p.split(":")[0].removeprefix("line ")): p for p in problems}
    assert {lines[n - 1].strip() for n in at} == {"- name: sync-old", "- name: mobile"}, problems
    ok = load_config_text(tmp_path, _with(usage={"clients": [
        {"name": "mobile", "token_fingerprint": "3f9a1c0b2d4e"},
        {"name": "sync", "user_agent": {"prefix": "LegacySync/"}}]}))
    from gateway.config.ledger import ClientNames

    names = ClientNames(ok.model.usage.clients)
    assert names.find("3f9a1c0b2d4e", "LegacySync/2.0").name == "mobile"  # type: ignore[union-attr]
    assert names.find("0123456789ab", "LegacySync/2.0").name == "sync"  # type: ignore[union-attr]
    assert names.find("0123456789ab", "legacysync/2.0") is None  # case-sensitive, as exemptions
    assert names.find(None, None) is None


def load_config_text(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_every_problem_is_reported_at_once() -> None:
    data = _with(server={"listen": "x"}, upstream={"pool_size": 0}, routes=[{"name": "Bad Name", "paths": ["x"]}])
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    text = str(err.value)
    for path in ("server.listen", "upstream.pool_size", "routes[0].name", "routes[0].paths"):
        assert path in text


def test_yaml_mistakes_are_reported_with_their_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - name: a\n    name: b\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "line 3" in str(err.value) and "duplicate key 'name'" in str(err.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("tenants: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.yaml")


SHIPPED_CONFIGS = [ROOT / "config/gateway.yaml", *sorted((ROOT / "deploy/kubernetes").rglob("gateway.yaml"))]


def _documented_default(section: str, key: str) -> str:
    text = (ROOT / "docs/configuration.md").read_text()
    part = text[text.index(f"## `{section}`"):]
    match = re.search(rf"^\| `{key}` \| `([^`]*)` \|", part[:part.index("\n## ", 1)], re.M)
    assert match is not None, f"docs/configuration.md: no row for {section}.{key}"
    return match.group(1)


def test_the_shipped_configs_close_idle_upstream_connections_before_an_upstream_would() -> None:
    """docs/configuration.md: upstream.keepalive_timeout stays below the upstream's own idle timeout, 4 s by default
    (below Node's and Apache's 5 s). A shipped config does not know its service's (the default one is copied for a
    real service): none may go above the documented default."""
    from gateway.config.upstream import UpstreamConfig

    documented = float(_documented_default("upstream", "keepalive_timeout"))
    assert documented == UpstreamConfig.model_fields["keepalive_timeout"].default == 4
    assert len(SHIPPED_CONFIGS) == 3, SHIPPED_CONFIGS
    for path in SHIPPED_CONFIGS:
        upstream = (yaml.safe_load(path.read_text()) or {}).get("upstream") or {}
        value = upstream.get("keepalive_timeout", documented)
        assert 0 < value <= documented, f"{path.relative_to(ROOT)}: upstream.keepalive_timeout {value}"
