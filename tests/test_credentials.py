"""Credentials in an upstream URL are masked by the URL parser, whatever characters they hold (quotes, spaces, a raw
'@', percent-escapes, non-ASCII): in /config, check-config, /status, the log and every problem."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway import cli
from gateway.app import ConfigError, parse_config
from gateway.ops.log_format import RedactingFormatter
from tests.gateway_testlib import make_config

# Each: what is written in the URL, and the pieces of it that must never be shown.
PASSWORDS = [
    ("s3cr'et-pw", ["s3cr'et-pw", "s3cr"]),
    ('pa"ss word', ['pa"ss word', "pa%22ss%20word", "ss word"]),
    ("p@ss@word-42", ["p@ss@word-42", "ss@word", "word-42"]),
    ("p%40ss%2Fw%3Ard", ["p%40ss%2Fw%3Ard", "p@ss/w:rd", "%2Fw"]),
    ("pässwörd-ü", ["pässwörd", "p%C3%A4ssw", "wörd"]),
]
IDS = ["quote", "space", "at", "percent", "non-ascii"]


def _config(password: str) -> dict[str, Any]:
    config = make_config("http://127.0.0.1:1")
    config["tenants"][1]["upstream"] = f"http://gw-user:{password}@upstream.internal:8080/base"
    return config


def _hidden(text: str, pieces: list[str]) -> None:
    for piece in pieces:
        assert piece not in text, f"{piece!r} shown in {text[:400]!r}"
    assert "gw-user" not in text


@pytest.mark.parametrize(("password", "pieces"), PASSWORDS, ids=IDS)
def test_the_url_parser_finds_the_whole_userinfo(password: str, pieces: list[str]) -> None:
    from gateway.core.redaction import url_credentials, without_userinfo

    url = f"http://gw-user:{password}@upstream.internal:8080/base"
    assert without_userinfo(url) == "http://<redacted>@upstream.internal:8080/base"
    assert without_userinfo(f"got '{url}' from \"https://u:{password}@h/\".") == (
        "got 'http://<redacted>@upstream.internal:8080/base' from \"https://<redacted>@h/\".")
    # The spellings masked in any text include the userinfo as written.
    assert f"gw-user:{password}" in url_credentials(url)


@pytest.mark.parametrize(("password", "pieces"), PASSWORDS, ids=IDS)
def test_check_config_and_the_shown_config(password: str, pieces: list[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = parse_config(_config(password), "t", {})
    assert loaded.tenants()[1].upstream.password is not None  # the gateway still uses it
    shown = json.dumps(loaded.shown(), ensure_ascii=False)
    _hidden(shown, pieces)
    assert "<redacted>@upstream.internal:8080/base" in shown
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(_config(password), allow_unicode=True), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    assert cli.main(["check-config", str(path)]) == 0
    _hidden(out.getvalue() + err.getvalue(), pieces)
    assert "<redacted>@upstream.internal:8080/base" in out.getvalue()


@pytest.mark.parametrize(("password", "pieces"), PASSWORDS, ids=IDS)
def test_problems(password: str, pieces: list[str]) -> None:
    config = _config(password)
    config["tenants"][1]["upstream"] = f"ftp://gw-user:{password}@upstream.internal:8080"
    config["tenants"][0]["upstream"] = f"http://gw-user:{password}@upstream.internal:8080/?q=1"
    with pytest.raises(ConfigError) as info:
        parse_config(config, "t", {})
    text = str(info.value)
    _hidden(text, pieces)
    assert "tenants[1].upstream: upstream must be an http:// or https:// URL, got " \
           "'ftp://<redacted>@upstream.internal:8080'" in text


@pytest.mark.parametrize(("password", "pieces"), PASSWORDS, ids=IDS)
def test_the_log(password: str, pieces: list[str]) -> None:
    loaded = parse_config(_config(password), "t", {})
    formatter = RedactingFormatter("%(message)s")
    formatter.use_secrets(loaded.secrets.redact)
    upstream = loaded.tenants()[1].upstream
    for message in (f"cannot reach {upstream}", f"cannot reach http://gw-user:{password}@upstream.internal:8080",
                    f"upstream said: user gw-user:{upstream.password} refused"):
        record = logging.LogRecord("gateway", logging.ERROR, __file__, 1, message, None, None)
        _hidden(formatter.format(record), pieces)


@pytest.mark.parametrize(("password", "pieces"), PASSWORDS[:2], ids=IDS[:2])
async def test_the_admin_config_and_status(password: str, pieces: list[str], start_gateway: Any,
                                           start_admin: Any) -> None:
    gw = await start_gateway(_config(password))
    admin = await start_admin(gw)
    async with aiohttp.ClientSession() as client:
        for path in ("/config", "/status", "/status.json"):
            async with client.get(admin + path) as resp:  # the admin URL carries the token (Basic)
                assert resp.status == 200, path
                _hidden(await resp.text(), pieces)
