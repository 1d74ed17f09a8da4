"""Credentials out of sight: ``${NAME}`` references in the config come from the environment, and neither their
values nor credentials written in an upstream URL are shown by check-config, the admin /config, or a problem."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import ConfigError, parse_config
from tests.gateway_testlib import AdminFactory, GatewayFactory, make_config

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cr3t-Pa55word"


def _with_upstream(upstream: str) -> dict[str, Any]:
    config = make_config("http://127.0.0.1:1")
    config["tenants"][0]["upstream"] = upstream
    return config


def test_a_reference_takes_its_value_from_the_environment_and_is_shown_as_itself() -> None:
    config = parse_config(_with_upstream("http://gw:${UP_PASS}@upstream.internal:8080"), "t", {"UP_PASS": SECRET})
    tenant = config.tenants()[0]
    assert tenant.upstream.password == SECRET
    assert tenant.upstream_host_header == "upstream.internal:8080"  # never the credentials
    shown = json.dumps(config.shown())
    assert SECRET not in shown and "<redacted>@upstream.internal:8080" in shown


def test_credentials_written_in_a_url_are_masked_where_the_config_is_shown() -> None:
    config = parse_config(_with_upstream(f"http://gw:{SECRET}@upstream.internal"), "t", {})
    assert SECRET not in json.dumps(config.shown())


@pytest.mark.parametrize(
    ("value", "environ", "problem"),
    [
        ("http://${NOPE}@x", {}, "tenants[0].upstream: environment variable NOPE is not set"),
        # A value from the environment that fails validation: the problem names the reference, not the value.
        ("${BAD_URL}", {"BAD_URL": f"gopher://{SECRET}"}, "tenants[0].upstream: upstream must be an http:// or "
                                                          "https:// URL, got '${BAD_URL}'"),
    ],
)
def test_problems_never_show_a_secret(value: str, environ: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_with_upstream(value), "t", environ)
    assert problem in err.value.problems
    assert SECRET not in str(err.value)


def test_a_doubled_dollar_is_a_literal_dollar() -> None:
    config = make_config("http://127.0.0.1:1")
    config["routes"][1]["chain"] = [{"legacy_upload_guard": {"detect": "route", "successor": "/x",
                                                             "message": "costs $$5, not ${FIVE}"}}]
    loaded = parse_config(config, "t", {"FIVE": "five dollars"})
    options = dict(loaded.chains["legacy_card_file_upload"])["legacy_upload_guard"]
    assert options.message == "costs $5, not five dollars"  # type: ignore[attr-defined]


def test_check_config_shows_no_credential(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(_with_upstream("http://gw:${UP_PASS}@upstream.internal")))
    out = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, env={"UP_PASS": SECRET, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr and "<redacted>@upstream.internal" in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_with_upstream("${BAD_URL}")))
    out = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(bad)], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, env={"BAD_URL": f"gopher://{SECRET}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and SECRET not in out.stdout + out.stderr and "${BAD_URL}" in out.stderr


async def test_the_admin_config_shows_no_credential(
    start_gateway: GatewayFactory, start_admin: AdminFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiohttp

    monkeypatch.setenv("UP_PASS", SECRET)
    gw = await start_gateway(_with_upstream("http://gw:${UP_PASS}@127.0.0.1:1"))
    admin = await start_admin(gw)
    async with aiohttp.ClientSession() as client, client.get(admin + "/config") as resp:
        text = await resp.text()
    assert resp.status == 200 and SECRET not in text and "<redacted>@127.0.0.1:1" in text


# --- The diagnostic log: what an exception's text would show is redacted ---------------------------------------

SIGNED = "http://files.test/signed-files/abc?expires=1795550197&signature=a3dba207116a18be"


def test_the_formatter_redacts_queries_credentials_and_userinfo() -> None:
    from gateway.ops.log_format import redact

    line = redact(f"failed: GET {SIGNED} (Authorization: Bearer s3cr3t-t0ken) via http://user:pw@up.test:81/x?k=v")
    assert "signature" not in line and "expires" not in line and "s3cr3t" not in line and "pw@" not in line
    assert line == ("failed: GET http://files.test/signed-files/abc?<redacted> (Authorization: Bearer <redacted>) "
                    "via http://<redacted>@up.test:81/x?<redacted>")
    assert redact("GET /api/v1/boards/1 200 in 3 ms") == "GET /api/v1/boards/1 200 in 3 ms"


def test_the_gateways_log_redacts_tracebacks_too() -> None:
    """Through the setup ``gateway serve`` uses, in a fresh process: the traceback's text is redacted as well."""
    script = (
        "import logging\n"
        "from gateway.cli import setup_logging\n"
        "setup_logging('info')\n"
        "try:\n"
        f"    raise ConnectionError('cannot reach {SIGNED} with Basic dXNlcjpwYXNz')\n"
        "except ConnectionError:\n"
        "    logging.getLogger('gateway').exception('unhandled error on route card_file')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert "unhandled error on route card_file" in out.stderr and "Traceback" in out.stderr
    assert "signature=" not in out.stderr and "dXNlcjpwYXNz" not in out.stderr
    assert "signed-files/abc?<redacted>" in out.stderr and "Basic <redacted>" in out.stderr


# --- Query values of URLs, and short values -----------------------------------------------------------------------

ENDPOINT = "http://127.0.0.1:4318/v1/traces?api_key=K3y-0f-the-vendor&region=eu"


async def test_the_admin_config_masks_the_query_values_of_every_url(
    start_gateway: GatewayFactory, start_admin: AdminFactory
) -> None:
    """A collector's endpoint may carry a vendor's key in its query, a database URL a password: /config showed
    them. Every URL's query values are masked (the names stay)."""
    import aiohttp

    config = make_config("http://127.0.0.1:1", tracing={"export": {"endpoint": ENDPOINT}})
    config["usage"] = {"ledger": {"enabled": False,
                                  "url": "postgresql://gw@db.internal/usage?password=Pa55-in-the-query"}}
    gw = await start_gateway(config)
    admin = await start_admin(gw)
    async with aiohttp.ClientSession() as client:
        for path in ("/config", "/status", "/status.json"):
            async with client.get(admin + path) as resp:
                text = await resp.text()
            assert resp.status == 200, path
            assert "K3y-0f-the-vendor" not in text and "Pa55-in-the-query" not in text, path
        async with client.get(admin + "/config") as resp:
            shown = (await resp.json())["config"]
    assert shown["tracing"]["export"]["endpoint"] == (
        "http://127.0.0.1:4318/v1/traces?api_key=<redacted>&region=<redacted>")
    assert shown["usage"]["ledger"]["url"] == "postgresql://<redacted>@db.internal/usage?password=<redacted>"


def test_a_short_value_is_not_searched_for_in_text() -> None:
    """With a password "e", "gat${PW}way": every "e" of every log line was masked, and what got masked confirmed a
    guessed value. A value under 8 characters is masked where it stands (a URL's userinfo, a string of the config
    that holds it); a longer one wherever it stands whole."""
    from gateway.ops.log_format import RedactingFormatter

    config = _with_upstream("http://gw:${PW}@upstream.internal")
    config["tracing"] = {"export": {"service_name": "${SVC}"}}
    loaded = parse_config(config, "t", {"PW": "e", "SVC": "e1"})
    formatter = RedactingFormatter("%(message)s")
    formatter.use_secrets(loaded.secrets.redact)

    def logged(message: str) -> str:
        return formatter.format(logging.LogRecord("gateway", logging.INFO, __file__, 1, message, None, None))

    for line in ("deprecation gateway ready", "guessed e", "guessed f", "service e1 up"):
        assert logged(line) == line  # nothing masked, so nothing confirmed
    assert logged("cannot reach http://gw:e@up.internal/x") == "cannot reach http://<redacted>@up.internal/x"
    shown = loaded.shown()
    assert shown["tenants"][0]["upstream"] == "http://<redacted>@upstream.internal"
    assert shown["tracing"]["export"]["service_name"] == "${SVC}"
    assert shown["tracing"]["export"]["endpoint"] == "http://127.0.0.1:4318/v1/traces"
    # Eight characters or more: masked where it stands whole, not inside another word.
    redact = parse_config(_with_upstream("http://gw:${PW}@upstream.internal"), "t", {"PW": "postgres"}).secrets.redact
    assert redact("user postgres refused (password postgres)") == "user ${PW} refused (password ${PW})"
    assert redact("a postgresql database") == "a postgresql database"


async def test_a_short_value_is_not_masked_in_the_gateways_log(tmp_path: Path) -> None:
    """Through a real process: its log lines keep their "e"s, and /config masks the value where it stands."""
    from tests.process_testlib import start

    gw = await start(_with_upstream("http://gw:${PW}@127.0.0.1:1"), tmp_path, env={**os.environ, "PW": "e"})
    try:
        shown = await gw.get_json("/config")
        assert shown["config"]["tenants"][0]["upstream"] == "http://<redacted>@127.0.0.1:1"
    finally:
        gw.stop()
    log = gw.log.read_text()
    assert "schema" in log and "${PW}" not in log
