"""The admin listener is closed by default to what it need not serve: /livez and /readyz answer anyone; every other
path needs server.admin_token (Bearer, Basic, or the cookie a browser gets from ?token= once) unless opened on
purpose in server.admin_open; and a request whose Host is not one the listener is known by is refused (DNS
rebinding). Through real sockets: an admin app in front of a started gateway, and real gateway processes."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
import yarl
from aiohttp import web

from gateway.lifecycle import Reloads
from gateway.ops.admin import make_admin_app, session_cookie
from tests.gateway_testlib import (
    ADMIN_TOKEN, GatewayFactory, RecordingUpstream, closed_within, free_port, make_config, parse_responses,
    raw_exchange,
)
from tests.process_testlib import ROOT, Proc, start, wait_for, write_config

COOKIE = "gateway_admin"  # the admin cookie's name (docs/operations.md)
PROTECTED = ["/metrics", "/config", "/rollout", "/deprecations", "/status", "/status.json", "/"]
BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

Admin = Callable[..., Awaitable[tuple[Any, int]]]


@pytest.fixture
async def admin(upstream: RecordingUpstream, start_gateway: GatewayFactory) -> AsyncIterator[Admin]:
    """``await admin(**server)``: a gateway with these server settings and its admin app on a free port of
    127.0.0.1 (the URL carries no credentials); the gateway and the port."""
    runners: list[web.AppRunner] = []

    async def start(**server: Any) -> tuple[Any, int]:
        config = make_config(upstream.url)
        config["server"] = {**config["server"], **server}
        config["server"] = {k: v for k, v in config["server"].items() if v is not None}
        gw = await start_gateway(config)
        runner = web.AppRunner(make_admin_app(gw.gateway), access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return gw, runner.addresses[0][1]

    yield start
    for runner in runners:
        await runner.cleanup()


async def status_of(port: int, path: str, **kwargs: Any) -> tuple[int, dict[str, Any] | None, Any]:
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{port}{path}", allow_redirects=False, **kwargs) as resp:
            body = await resp.json(content_type=None) if resp.content_type == "application/json" else None
            return resp.status, body, resp.headers


async def test_probes_are_open_and_everything_else_needs_the_token(admin: Admin) -> None:
    _, port = await admin()
    for path in ("/livez", "/readyz"):
        assert (await status_of(port, path))[0] == 200
        assert (await status_of(port, path, headers={"Host": "attacker.example"}))[0] == 200
    for path in PROTECTED:
        status, body, headers = await status_of(port, path)
        assert status == 401 and body is not None and body["code"] == "UNAUTHORIZED", (path, status, body)
        assert "server.admin_token" in body["message"] and ADMIN_TOKEN not in body["message"]
        assert headers.getall("WWW-Authenticate") == ['Basic realm="gateway admin"', 'Bearer realm="gateway admin"']
        for wrong in ({"Authorization": "Bearer " + ADMIN_TOKEN[:-1] + "x"}, {"Authorization": "Bearer"},
                      {"Authorization": "Basic !!!"}, {"Cookie": f"{COOKIE}={ADMIN_TOKEN}"}):
            assert (await status_of(port, path, headers=wrong))[0] == 401, (path, wrong)
        status, _, _ = await status_of(port, path, headers=BEARER)
        assert status in (200, 302), (path, status)
        basic = base64.b64encode(f"anyone:{ADMIN_TOKEN}".encode()).decode()
        assert (await status_of(port, path, headers={"Authorization": f"Basic {basic}"}))[0] in (200, 302)


async def test_a_browser_gives_the_token_once_and_keeps_a_cookie(admin: Admin) -> None:
    _, port = await admin()
    # unsafe: keep cookies of an IP address, as browsers do (aiohttp's client does not by default).
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
        async with client.get(f"http://127.0.0.1:{port}/deprecations?top=3&token=wrong-token-0123456789",
                              allow_redirects=False) as resp:
            assert resp.status == 401 and COOKIE not in resp.cookies
        async with client.get(f"http://127.0.0.1:{port}/deprecations?top=3&token={ADMIN_TOKEN}",
                              allow_redirects=False) as resp:
            assert resp.status == 303
            # Relative (the listener may be behind a path prefix), without the token.
            assert resp.headers["Location"] == "deprecations?top=3"
            cookie = resp.cookies[COOKIE]
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
            assert ADMIN_TOKEN not in resp.headers["Set-Cookie"]
        async with client.get(f"http://127.0.0.1:{port}/?token={ADMIN_TOKEN}") as resp:  # -> ./ -> status
            assert resp.status == 200 and resp.url.path == "/status" and "text/html" in resp.headers["Content-Type"]
        async with client.get(f"http://127.0.0.1:{port}/status.json") as resp:  # what the page's script fetches
            assert resp.status == 200


@pytest.mark.parametrize("credential", [
    b"Authorization: Bearer \xff\xfe-not-utf8", b"Authorization: Bearer caf\xc3\xa9",
    b"Authorization: Basic \xc3\xa9\xc3\xa9", b"Authorization: Basic \xff", b"Cookie: gateway_admin=\xff\xfe",
    b"Cookie: gateway_admin=caf\xc3\xa9.\xc3\xa9.\xc3\xa9",
], ids=["bearer-bytes", "bearer-utf8", "basic-utf8", "basic-bytes", "cookie-bytes", "cookie-utf8"])
async def test_a_credential_that_is_not_ascii_is_a_401(admin: Admin, credential: bytes,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """It was a 500 and a traceback in the log, for anyone (no token needed)."""
    _, port = await admin()
    answer = await raw_exchange(port, b"GET /config HTTP/1.1\r\nHost: 127.0.0.1\r\n" + credential
                                + b"\r\nConnection: close\r\n\r\n")
    ((status, headers, body),) = parse_responses(answer)
    assert status == 401 and headers["content-type"].startswith("application/json"), answer[:200]
    assert json.loads(body)["code"] == "UNAUTHORIZED"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("target", [
    "/%5C%5Cevil.example", "/%5Cevil.example", "//evil.example", "/https:evil.example", "/http:%2F%2Fevil.example",
    "/status/%2F%2Fevil.example", "/javascript:alert(1)", "/%E2%80%AE.example",
])
async def test_the_login_redirect_stays_on_the_admin_listener(admin: Admin, target: str) -> None:
    """The redirect from ``?token=`` went to ``\\evil.example`` for ``/%5C%5Cevil.example``: a browser reads a
    backslash as a slash, so that was another host. It is a relative path that no browser reads as a scheme or a
    host."""
    _, port = await admin()
    status, _, headers = await status_of(port, f"{target}?token={ADMIN_TOKEN}")
    assert status == 303
    location = headers["Location"]
    assert not location.startswith(("/", "\\")) and ":" not in location and "\\" not in location, location
    base = yarl.URL(f"http://127.0.0.1:{port}{target}")
    assert base.join(yarl.URL(location)).host == "127.0.0.1"
    assert ADMIN_TOKEN not in location


@pytest.mark.parametrize("typed", ["plus+token+0123456789", "plus%2Btoken%2B0123456789"])
async def test_a_token_with_a_plus_logs_in_typed_as_is(admin: Admin, typed: str) -> None:
    """In a query a '+' reads as a space (a token never holds one): the token typed as is, '+' and all, logs in."""
    _, port = await admin(admin_token="plus+token+0123456789")
    assert (await status_of(port, f"/status?token={typed}"))[0] == 303
    assert (await status_of(port, "/status?token=plus+token+0123456780"))[0] == 401
    assert (await status_of(port, "/status?token=plus%20token%200123456789"))[0] == 401


async def test_the_401_names_where_the_token_comes_from(admin: Admin, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "gateway usage: set GATEWAY_ADMIN_TOKEN", but gateway usage needs no admin token, and the variable
    may be named otherwise: it names the variable this gateway's config reads, and nothing when the token is
    written in the file."""
    monkeypatch.setenv("OPS_CONSOLE_SECRET", ADMIN_TOKEN)
    _, port = await admin(admin_token="${OPS_CONSOLE_SECRET}")
    _, body, _ = await status_of(port, "/config")
    assert body is not None and "${OPS_CONSOLE_SECRET}" in body["message"]
    assert "gateway usage" not in body["message"] and "GATEWAY_ADMIN_TOKEN" not in body["message"]
    _, port = await admin()
    _, body, _ = await status_of(port, "/config")
    assert body is not None and "server.admin_token:" in body["message"] and "${" not in body["message"]


async def _login(port: int) -> tuple[str, str]:
    """A browser's login: the cookie's value, and the whole Set-Cookie line."""
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{port}/status?token={ADMIN_TOKEN}", allow_redirects=False) as resp:
            assert resp.status == 303
            return resp.cookies[COOKIE].value, resp.headers["Set-Cookie"]


async def test_every_login_is_a_session_of_its_own_that_expires(admin: Admin) -> None:
    """The cookie was the same at every login and never expired: a permanent credential. Now each login gets a new
    value that lasts server.admin_login_lifetime (12 h by default), then is refused."""
    _, port = await admin()
    first, line = await _login(port)
    second, _ = await _login(port)
    assert first != second and ADMIN_TOKEN not in line
    attributes = {part.strip().partition("=")[0].lower(): part.strip().partition("=")[2] for part in line.split(";")}
    assert attributes["max-age"] == "43200" and attributes["path"] == "/" and attributes["samesite"] == "Strict"
    assert "httponly" in attributes
    for value in (first, second):
        assert (await status_of(port, "/config", headers={"Cookie": f"{COOKIE}={value}"}))[0] == 200
    now = time.time()
    refused = {
        "expired": session_cookie(ADMIN_TOKEN, now=now - 43201, lifetime=43200),
        "beyond the lifetime": session_cookie(ADMIN_TOKEN, now=now, lifetime=10 * 43200),
        "another token's": session_cookie("another-admin-token-0123456789", now=now, lifetime=43200),
        "its expiry moved": str(int(now) + 3600) + first[first.index("."):],
        "the old fixed value": "358ecaebc2e27dfe4522c10a7c0f9a7f7a534ba7fcb071f7aea9b8d03b74337a",
    }
    for what, value in refused.items():
        assert (await status_of(port, "/config", headers={"Cookie": f"{COOKIE}={value}"}))[0] == 401, what


async def test_a_login_is_valid_on_every_process_with_the_token(admin: Admin) -> None:
    """Under --workers (or behind a Service of several pods) the next request may reach another process than the
    login's: the session is a MAC under the token, nothing kept in one process's memory."""
    _, one = await admin()
    _, other = await admin()
    value, _ = await _login(one)
    assert (await status_of(other, "/status.json", headers={"Cookie": f"{COOKIE}={value}"}))[0] == 200


async def test_a_shorter_lifetime_on_reload_applies_to_the_cookies_given(admin: Admin, tmp_path: Path) -> None:
    gw, port = await admin()
    value, _ = await _login(port)
    path = tmp_path / "gateway.yaml"
    config = make_config("http://127.0.0.1:1")
    config["server"] = {**config["server"], "admin_login_lifetime": 600}
    path.write_text(yaml.safe_dump(config))
    await Reloads(gw.gateway, str(path)).reload()
    assert (await status_of(port, "/config", headers={"Cookie": f"{COOKIE}={value}"}))[0] == 401
    value, line = await _login(port)
    assert "Max-Age=600" in line
    assert (await status_of(port, "/config", headers={"Cookie": f"{COOKIE}={value}"}))[0] == 200


async def test_a_new_token_on_reload_applies_at_once(admin: Admin, tmp_path: Path) -> None:
    gw, port = await admin()
    path = tmp_path / "gateway.yaml"
    config = make_config("http://127.0.0.1:1")
    config["server"] = {**config["server"], "admin_token": "the-next-admin-token-0123456789"}
    path.write_text(yaml.safe_dump(config))
    cookie = {"Cookie": f"{COOKIE}=" + (await _cookie(port))}
    assert (await status_of(port, "/config", headers=cookie))[0] == 200
    await Reloads(gw.gateway, str(path)).reload()
    assert gw.gateway.metrics.config_reloads.labels("success")._value.get() == 1  # noqa: SLF001
    assert (await status_of(port, "/config", headers=BEARER))[0] == 401
    assert (await status_of(port, "/config", headers=cookie))[0] == 401, "a cookie of the old token"
    assert (await status_of(port, "/config", headers={"Authorization": "Bearer the-next-admin-token-0123456789"}))[
        0] == 200


async def _cookie(port: int) -> str:
    async with aiohttp.ClientSession() as client:
        async with client.get(f"http://127.0.0.1:{port}/config?token={ADMIN_TOKEN}", allow_redirects=False) as resp:
            return resp.cookies[COOKIE].value


@pytest.mark.parametrize(("host", "status"), [
    ("127.0.0.1", 200), ("127.0.0.1:9090", 200), ("[::1]:9090", 200), ("10.1.2.3:9090", 200), ("localhost:9090", 200),
    ("LOCALHOST.", 200), ("admin.gateway.svc:9090", 200), ("pod-1.admin.example:9090", 200),
    ("attacker.example", 421), ("attacker.example:9090", 421), ("localhost.attacker.example", 421),
    ("gateway.svc", 421), ("admin.example", 421), ("", 421),
])
async def test_only_the_hosts_the_listener_is_known_by(admin: Admin, host: str, status: int) -> None:
    """A DNS-rebinding page in an operator's browser reaches the listener's address under its own host name: with
    it, even a valid token (a cached Basic login, a cookie) reads nothing."""
    _, port = await admin(admin_hosts=["admin.gateway.svc", "*.admin.example"])
    got, body, _ = await status_of(port, "/config", headers={**BEARER, "Host": host})
    assert got == status, (host, body)
    if status == 421:
        assert body is not None and body["code"] == "UNKNOWN_HOST"


async def test_a_request_without_a_host_or_with_two_is_refused(admin: Admin) -> None:
    _, port = await admin()
    auth = f"Authorization: Bearer {ADMIN_TOKEN}\r\n".encode()
    answer = await raw_exchange(port, b"GET /config HTTP/1.0\r\n" + auth + b"\r\n")
    assert answer.startswith(b"HTTP/1.0 421") or answer.startswith(b"HTTP/1.1 421"), answer[:80]
    answer = await raw_exchange(port, b"GET /config HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.test\r\n" + auth
                                + b"Connection: close\r\n\r\n")
    assert answer.split(b" ", 2)[1] in (b"400", b"421"), answer[:80]  # aiohttp's parser refuses it first
    answer = await raw_exchange(port, b"GET /livez HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer[:80]


async def test_opened_on_purpose(admin: Admin) -> None:
    _, port = await admin(admin_open=["/metrics"])  # an open scrape; the rest still needs the token
    assert (await status_of(port, "/metrics"))[0] == 200
    assert (await status_of(port, "/config"))[0] == 401
    assert (await status_of(port, "/metrics", headers={"Host": "attacker.example"}))[0] == 421
    _, port = await admin(admin_token=None, admin_open="all")  # no token at all: a loopback-only workstation
    for path in PROTECTED:
        assert (await status_of(port, path))[0] in (200, 302), path
    assert (await status_of(port, "/config", headers={"Host": "attacker.example"}))[0] == 421


async def test_without_a_token_the_admin_paths_are_closed(admin: Admin) -> None:
    _, port = await admin(admin_token=None)
    for path in PROTECTED:
        status, body, _ = await status_of(port, path, headers=BEARER)
        assert status == 403 and body is not None and body["code"] == "ADMIN_CLOSED", (path, status)
    assert (await status_of(port, "/readyz"))[0] == 200


def test_the_token_is_never_shown(tmp_path: Path) -> None:
    """Written in the file (not as ${NAME}): check-config and /config show <redacted>."""
    from gateway.app import load_config
    from gateway.ops.status import shown_config

    path = tmp_path / "gateway.yaml"
    config = make_config("http://127.0.0.1:1")
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, environ={})
    assert ADMIN_TOKEN not in repr(shown_config(loaded)) and shown_config(loaded)["server"]["admin_token"] == "<redacted>"
    config["server"]["admin_token"] = "${ADMIN_SECRET}"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, environ={"ADMIN_SECRET": ADMIN_TOKEN})
    assert shown_config(loaded)["server"]["admin_token"] == "${ADMIN_SECRET}"
    config["server"]["admin_token"] = "short"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and "server.admin_token: String should have at least 16 characters" in out.stderr
    assert "short" not in out.stderr


# --- Real processes: the shipped config as the image runs it, and `gateway usage` -------------------------------


async def _serve(tmp_path: Path, config: dict[str, Any], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int, int]:
    port, admin_port = free_port(), free_port()
    path = tmp_path / "gateway.yaml"
    write_config(path, config)
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path), "--listen",
                             f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def ready() -> bool:
        assert proc.poll() is None, "the gateway exited"
        try:
            return (await status_of(admin_port, "/readyz"))[0] == 200
        except aiohttp.ClientError:
            return False

    await wait_for(ready, 15)
    return proc, port, admin_port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def test_the_shipped_config_serves_only_the_probes(tmp_path: Path) -> None:
    """The image binds its admin listener to every address; with the shipped config (no token) it answers the
    probes and nothing else."""
    config = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_ADMIN_TOKEN"}
    proc, _, admin_port = await _serve(tmp_path, config, env)
    try:
        assert (await status_of(admin_port, "/livez"))[0] == 200
        for path in PROTECTED:
            assert (await status_of(admin_port, path))[0] == 403, path
    finally:
        _stop(proc)


# --- The admin listener's own limits: a head timeout, an idle timeout, a bound on its connections ----------------


def _tenant(upstream: str, **server: Any) -> dict[str, Any]:
    return {"server": server, "tenants": [{"name": "t", "hosts": ["127.0.0.1"], "upstream": upstream}]}


async def _admin_closed(gw: Proc, reason: str) -> float:
    return (await gw.metrics())[("gateway_admin_connections_closed_total", (("reason", reason),))]


async def test_the_admin_listener_closes_silent_dripping_and_idle_connections(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """No token is needed to open a connection to the admin port: one that sends nothing, drips its head or stays
    idle is closed within the client time limits (it stayed open for ever, > 80 s observed)."""
    gw = await start(_tenant(upstream.url, client_header_timeout=0.5, client_keepalive_timeout=0.5), tmp_path)
    try:
        silent, _ = await asyncio.open_connection("127.0.0.1", gw.admin)
        dripping, drip = await asyncio.open_connection("127.0.0.1", gw.admin)
        drip.write(b"GET /livez HTTP/1.1\r\nHost: 12")
        idle, asks = await asyncio.open_connection("127.0.0.1", gw.admin)
        asks.write(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await idle.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert all(await asyncio.gather(*(closed_within(reader, 3) for reader in (silent, dripping, idle))))
        assert time.monotonic() - started < 2.5
        assert await _admin_closed(gw, "head") == 2 and await _admin_closed(gw, "idle") == 1
    finally:
        gw.stop()


async def test_silent_connections_neither_fill_the_admin_port_nor_starve_the_public_one(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """The attack: 1,500 silent connections to the admin port of a process with few descriptors took them all,
    public requests timed out and /livez failed. The admin port holds at most server.admin_max_connections, and a
    new connection over it takes the place of the oldest one not being served: the public port and the probes are
    served while 400 silent connections come (and wait for a 30 s head timeout)."""
    limit, bound = 160, 16

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    gw = await start(_tenant(upstream.url, admin_max_connections=bound, client_header_timeout=30), tmp_path,
                     preexec=few_descriptors)
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(400):
            held.append((await asyncio.open_connection("127.0.0.1", gw.admin))[1])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
            async with client.get(gw.url + "/public") as resp:
                assert resp.status == 200
        answer = await raw_exchange(gw.admin, b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert [status for status, _, _ in parse_responses(answer)] == [200]
        assert len(os.listdir(f"/proc/{gw.proc.pid}/fd")) < limit // 2
        metrics = await gw.metrics()
        assert metrics[("gateway_admin_connections_open", ())] <= bound
        assert metrics[("gateway_admin_connections_closed_total", (("reason", "evicted"),))] >= 400 - bound
    finally:
        for writer in held:
            writer.close()
        gw.stop()
