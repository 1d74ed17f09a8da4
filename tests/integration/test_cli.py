"""The CLI as an operator runs it: real processes, real sockets, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gateway_testlib import ADMIN_HEADERS, ADMIN_TOKEN, free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_version_and_help() -> None:
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("gateway ")
    help_text = run_cli("--help")
    assert help_text.returncode == 0 and "serve" in help_text.stdout and "check-config" in help_text.stdout


def test_check_config_prints_routes_and_chains() -> None:
    out = run_cli("check-config", "config/gateway.yaml")
    assert out.returncode == 0, out.stderr
    assert "board: GET,HEAD /api/v1/boards/{board_id}" in out.stdout
    assert "chain: request_id" in out.stdout
    assert "catch_all" in out.stdout


def test_check_config_lists_every_problem_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({
        "server": {"listen": "nowhere"},
        "tenants": [{"name": "a", "hosts": ["a.test"], "upstream": "gopher://x", "forbid_legacy_uploads": True,
                     "restricted_file_access": False}],
        "routes": [{"name": "r", "paths": ["/a"], "chain": ["no_such_policy"]}],
    }))
    out = run_cli("check-config", str(bad))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    for expected in ("server.listen", "tenants[0].upstream", "routes[0].chain[0]: unknown policy 'no_such_policy'"):
        assert expected in out.stderr
    missing = run_cli("check-config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read the file" in missing.stderr


def _wait_http(url: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in {timeout}s")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, object]]:
    """The sandbox and a gateway in front of it, each a real process on free ports."""
    sandbox_port, gw_port, admin_port = free_port(), free_port(), free_port()
    config = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())
    config["server"]["listen"] = f"127.0.0.1:{gw_port}"
    config["server"]["admin_listen"] = f"127.0.0.1:{admin_port}"
    config["server"]["admin_token"] = "${GATEWAY_ADMIN_TOKEN}"  # as a Secret gives it to a pod
    for tenant in config["tenants"]:
        tenant["upstream"] = f"http://127.0.0.1:{sandbox_port}"
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    sandbox = subprocess.Popen([PYTHON, "-m", "sandbox", "--port", str(sandbox_port), "--log-level", "warning"],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = (tmp_path / "gateway.log").open("w+")
    gateway = subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(path)], cwd=tmp_path, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{sandbox_port}/_sandbox/journal")
        _wait_http(f"http://127.0.0.1:{admin_port}/readyz")
        yield {"gw": f"http://127.0.0.1:{gw_port}", "admin": f"http://127.0.0.1:{admin_port}",
               "process": gateway, "log": log}
    finally:
        for proc in (gateway, sandbox):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        log.close()


def test_serve_in_front_of_the_sandbox_then_stop_on_sigterm(stack) -> None:
    request = urllib.request.Request(stack["gw"] + "/api/latest/cards?board_id=1&limit=3&offset=0",
                                     headers={"Authorization": "Bearer sandbox-token", "X-Request-Id": "cli-test-1"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        cards = json.loads(resp.read())
        assert resp.headers["X-Request-Id"] == "cli-test-1"
    assert [c["id"] for c in cards] == [1, 2, 3]
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(stack["gw"] + "/api/latest/boards/1", timeout=5)
    assert err.value.code == 401  # the sandbox's answer to a missing token, passed through
    scrape = urllib.request.Request(stack["admin"] + "/metrics", headers=ADMIN_HEADERS)
    metrics = urllib.request.urlopen(scrape, timeout=5).read().decode()
    assert 'gateway_requests_total{method="GET",route="card_list",status_class="2xx"} 1.0' in metrics
    proc: subprocess.Popen[bytes] = stack["process"]  # type: ignore[assignment]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    log = stack["log"]
    log.seek(0)
    lines = [json.loads(line) for line in log.read().splitlines() if line.startswith("{")]
    assert {line["route"] for line in lines} >= {"card_list", "board"}
    text = json.dumps(lines)
    assert "sandbox-token" not in text and "Bearer" not in text


def test_serve_reports_a_busy_port_clearly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = {"server": {"listen": f"127.0.0.1:{port}", "admin_listen": f"127.0.0.1:{free_port()}"},
                  "usage": {"ledger": {"url": f"sqlite:///{tmp_path}/usage.sqlite3"}},
                  "tenants": [{"name": "a", "hosts": ["a.test"], "upstream": "http://127.0.0.1:1"}]}
        path = tmp_path / "busy.yaml"
        path.write_text(yaml.safe_dump(config))
        out = run_cli("serve", "--config", str(path), timeout=30)
    assert out.returncode == 1
    assert "cannot listen" in out.stderr and "Traceback" not in out.stderr


def test_bad_gateway_now_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "GATEWAY_NOW": "not-a-date"}
    out = subprocess.run([PYTHON, "-m", "gateway", "serve", "--config", "config/gateway.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 2
    assert "GATEWAY_NOW" in out.stderr and "Traceback" not in out.stderr
